"""How late each local rank arrived at its collectives, from NCCL's profiler records."""

from __future__ import annotations

from collections import defaultdict

from bpfdyno.detection.nccl_times import NcclCollectiveTimes, lateness
from bpfdyno.sources.nccl_profiler.receiver import (
    NcclCollective,
    NcclCommAggregate,
    NcclRankAggregate,
)

WORLD = 0x1234


def coll(seq: int, start: int, comm: int = WORLD) -> NcclCollective:
    return NcclCollective(
        comm_id=comm, seq=seq, func="AllReduce", bytes=4096, start_realtime_ns=start,
        duration_ns=1000, gpu_ns=0, net_wait_ns=0, gpu_start_ns=0, gpu_stop_ns=0,
    )  # fmt: skip


def rank(
    pid: int, last_done: int, recent: list[NcclCollective], in_coll: int = 0, read: float = 1.0
) -> NcclRankAggregate:
    comm = NcclCommAggregate(
        comm_id=WORLD, name="world", rank=pid % 10, nranks=4, nnodes=1, finalized=False,
        colls_started=last_done + 1, colls_completed=last_done + 1, last_seq_started=last_done,
        last_seq_completed=last_done, time_in_collectives_ns=in_coll, gpu_time_ns=0,
        net_wait_ns=0, bytes=0, p2p_completed=0, last_start_realtime_ns=0,
        last_done_realtime_ns=0,
    )  # fmt: skip
    return NcclRankAggregate(
        pid=pid, rank=pid % 10, nranks=4, colls_started=last_done + 1,
        colls_completed=last_done + 1, last_seq=last_done, in_flight=0,
        time_in_collectives_ns=in_coll, gpu_time_ns=0, net_wait_ns=0, bytes=0,
        last_start_realtime_ns=0, recent=tuple(recent), comms=(comm,), records_lost=0,
        colls_dropped=0, api_version=5, updated_monotonic_s=read,
    )  # fmt: skip


def test_each_rank_is_as_late_as_its_arrival_after_the_first() -> None:
    counted: dict[int, set[int]] = defaultdict(set)
    got = lateness(
        {
            100: rank(100, 1, [coll(0, 1_000), coll(1, 5_000)]),
            101: rank(101, 1, [coll(0, 3_500), coll(1, 5_200)]),
        },
        counted,
    )
    assert got == {100: 0, 101: 2_500 + 200}
    assert counted[WORLD] == {0, 1}
    # Counted once: the same records again add nothing.
    assert (
        lateness(
            {
                100: rank(100, 1, [coll(0, 1_000), coll(1, 5_000)]),
                101: rank(101, 1, [coll(0, 3_500), coll(1, 5_200)]),
            },
            counted,
        )
        == {}
    )


def test_a_collective_waits_until_every_local_rank_completed_it() -> None:
    counted: dict[int, set[int]] = defaultdict(set)
    # Rank 101 has not completed seq 1 yet: only seq 0 is compared.
    ahead = rank(100, 1, [coll(0, 1_000), coll(1, 5_000)])
    behind = rank(101, 0, [coll(0, 1_400)])
    assert lateness({100: ahead, 101: behind}, counted) == {100: 0, 101: 400}
    behind = rank(101, 1, [coll(0, 1_400), coll(1, 9_000)])
    assert lateness({100: ahead, 101: behind}, counted) == {100: 0, 101: 4_000}


def test_a_rank_alone_on_the_node_is_never_late_here() -> None:
    assert lateness({100: rank(100, 3, [coll(2, 1), coll(3, 9)])}, defaultdict(set)) == {}


def test_the_source_adds_lateness_over_snapshots_and_gives_time_in_collectives() -> None:
    snapshots = [
        {
            100: rank(100, 0, [coll(0, 1_000)], in_coll=10_000, read=1.0),
            101: rank(101, 0, [coll(0, 2_000)], in_coll=9_000, read=1.0),
        },
        {
            100: rank(100, 1, [coll(0, 1_000), coll(1, 8_000)], in_coll=20_000, read=2.0),
            101: rank(101, 1, [coll(0, 2_000), coll(1, 7_000)], in_coll=19_000, read=2.0),
        },
    ]
    current = [snapshots[0]]
    source = NcclCollectiveTimes(lambda: current[0])
    first = source.collective_times(101)
    assert first is not None and (first.in_collective_ns, first.late_ns) == (9_000, 1_000)
    # Asked again before the receiver read anything new: nothing counted twice.
    again = source.collective_times(101)
    assert again is not None and again.late_ns == 1_000
    current[0] = snapshots[1]
    after = [source.collective_times(pid) for pid in (100, 101)]
    assert [(t.in_collective_ns, t.late_ns) for t in after if t] == [
        (20_000, 1_000),
        (19_000, 1_000),
    ]
    assert source.collective_times(555) is None
