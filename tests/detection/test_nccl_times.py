"""How late each rank arrived at its collectives, counted over the job's ranks on every node:
the plugin's arrivals as the receiver keeps them, as they travel between agents (on the wire,
with the peer's clock offset), and as `LateArrivals` counts each collective once."""

from __future__ import annotations

import math
from dataclasses import replace

from bpfdyno.detection.nccl_times import WAIT_ROUNDS, LateArrivals, NcclCollectiveTimes
from bpfdyno.detection.signals import (
    MAX_ARRIVALS,
    Arrival,
    Arrivals,
    RankSignals,
    from_record,
    grouped,
    latest,
    to_record,
)
from bpfdyno.rpc.detection import CommArrivals, RankSignal
from bpfdyno.rpc.wire import from_pb, to_pb
from bpfdyno.sources.nccl_profiler.receiver import (
    NcclCollective,
    NcclCommAggregate,
    NcclRankAggregate,
)

WORLD = 0x9E3779B97F4A7C15  # a communicator id as NCCL makes them: all 64 bits used
PAIR = 0x1234
JOB = "41"
MS = 1_000_000
#: A wall-clock moment of the job (unix ns).
T0 = 1_795_000_000_000_000_000


def coll(seq: int, start: int, comm: int = WORLD) -> NcclCollective:
    return NcclCollective(
        comm_id=comm, seq=seq, func="AllReduce", bytes=4096, start_realtime_ns=start,
        duration_ns=1000, gpu_ns=0, net_wait_ns=0, gpu_start_ns=0, gpu_stop_ns=0,
    )  # fmt: skip


def comm(comm_id: int, nranks: int, in_coll: int) -> NcclCommAggregate:
    return NcclCommAggregate(
        comm_id=comm_id, name="", rank=0, nranks=nranks, nnodes=2, finalized=False,
        colls_started=1, colls_completed=1, last_seq_started=0, last_seq_completed=0,
        time_in_collectives_ns=in_coll, gpu_time_ns=0, net_wait_ns=0, bytes=0, p2p_completed=0,
        last_start_realtime_ns=0, last_done_realtime_ns=0,
    )  # fmt: skip


def aggregate(pid: int, recent: list[NcclCollective], in_coll: int) -> NcclRankAggregate:
    return NcclRankAggregate(
        pid=pid, rank=0, nranks=16, colls_started=1, colls_completed=1, last_seq=0,
        in_flight=0, time_in_collectives_ns=in_coll, gpu_time_ns=0, net_wait_ns=0, bytes=0,
        last_start_realtime_ns=0, recent=tuple(recent),
        comms=(comm(WORLD, 16, in_coll - 5), comm(PAIR, 2, 5)), records_lost=0,
        colls_dropped=0, api_version=5, updated_monotonic_s=1.0,
    )  # fmt: skip


def rank(
    r: int,
    arrivals: list[tuple[int, int]] | None,
    comm_id: int = WORLD,
    comm_ranks: int = 4,
    host: str = "",
) -> RankSignals:
    """Rank ``r`` of the job with arrivals (seq, unix ns) at ``comm_id`` (None: unknown)."""
    return RankSignals(
        JOB, r, 1000 + r, 0.0, 5.0, 1.0, 0.0, 4.0, 0.0, 0, host=host,
        arrivals=None if arrivals is None else grouped(
            Arrival(comm_id, seq, at, comm_ranks) for seq, at in arrivals
        ),
    )  # fmt: skip


def pulled(s: RankSignals, offset_ns: int) -> RankSignals:
    """``s`` as a peer's agent serves it and this one reads it, the peer's clock ``offset_ns``
    ahead of ours (its arrivals, on its clock, are that much later than on ours)."""
    on_its_clock = None
    if s.arrivals is not None:
        on_its_clock = tuple(
            replace(g, at_ns=tuple(t + offset_ns for t in g.at_ns)) for g in s.arrivals
        )
    record = to_record(replace(s, arrivals=on_its_clock), "node-b", 1000.0)
    return from_record(from_pb(RankSignal, to_pb(record)), offset_ns)


def ms(s: RankSignals) -> float:
    """Its late time in ms (from whole ns: exact)."""
    return round(s.late_s * 1e9) / MS


def late_ms(local: list[RankSignals], peers: list[RankSignals]) -> dict[int, float]:
    """Each rank's late time (ms) in one round of a fresh comparison."""
    a, b = LateArrivals().apply(local, peers)
    return {s.rank: ms(s) for s in a + b}


def test_the_receiver_s_recent_collectives_are_the_rank_s_arrivals_with_their_comm_s_size() -> None:
    snapshot = {100: aggregate(100, [coll(7, T0), coll(3, T0 + 9, comm=PAIR)], in_coll=40)}
    times = NcclCollectiveTimes(lambda: snapshot)
    got = times.collective_times(100)
    assert got is not None
    assert got.in_collective_ns == 40
    assert got.arrivals == (
        Arrival(WORLD, 7, T0, 16),
        Arrival(PAIR, 3, T0 + 9, 2),
    )
    assert times.collective_times(555) is None


def test_two_nodes_one_late_rank_on_each_side() -> None:
    # Node A (this one) has ranks 0 and 1, node B ranks 2 and 3. At seq 10 rank 1 (here)
    # came 3 ms after the first (rank 0), at seq 11 rank 3 (there) came 7 ms after the first
    # (rank 2); the others within a millisecond.
    local = [
        rank(0, [(10, T0), (11, T0 + 20 * MS)]),
        rank(1, [(10, T0 + 3 * MS), (11, T0 + 20 * MS + MS // 2)]),
    ]
    peers = [
        pulled(rank(2, [(10, T0 + MS // 4), (11, T0 + 20 * MS - MS)]), 0),
        pulled(rank(3, [(10, T0 + MS // 2), (11, T0 + 26 * MS)]), 0),
    ]
    assert late_ms(local, peers) == {
        0: 0 + 1.0,
        1: 3.0 + 1.5,
        2: 0.25 + 0,
        3: 0.5 + 7.0,
    }


def test_a_peer_s_clock_offset_is_taken_off_its_arrivals() -> None:
    # Rank 2 on node B truly arrives 2 ms after rank 0 here, rank 1 here 6 ms after rank 0.
    local = [rank(0, [(5, T0)], comm_ranks=3), rank(1, [(5, T0 + 6 * MS)], comm_ranks=3)]
    there = rank(2, [(5, T0 + 2 * MS)], comm_ranks=3)
    for offset in (5 * MS, -5 * MS):
        # Its clock 5 ms ahead, it reports 7 ms; 5 ms behind, -3 ms (before rank 0, which
        # would make rank 0 late). Taken off with the wrong sign: 12 ms, or -8 ms.
        assert late_ms(local, [pulled(there, offset)]) == {0: 0.0, 1: 6.0, 2: 2.0}, offset
    # Not taken off at all, the peer 5 ms ahead looks 5 ms later than it was.
    record = to_record(rank(2, [(5, T0 + 7 * MS)], comm_ranks=3), "node-b", 1000.0)
    assert late_ms(local, [from_record(record)]) == {0: 0.0, 1: 6.0, 2: 7.0}


def test_a_communicator_split_across_nodes_waits_for_the_other_node_s_ranks() -> None:
    # A two-rank communicator: rank 1 here, rank 2 on node B. This node's rank alone is never
    # compared with itself: the collective waits for the other node's arrival.
    late = LateArrivals()
    mine = [rank(1, [(3, T0 + 4 * MS)], comm_id=PAIR, comm_ranks=2)]
    local, _ = late.apply(mine, [])
    assert [s.late_s for s in local] == [0.0]  # known, nothing counted yet
    theirs = [pulled(rank(2, [(3, T0 + MS)], comm_id=PAIR, comm_ranks=2), 0)]
    local, peers = late.apply([rank(1, [], comm_id=PAIR)], theirs)
    assert [ms(s) for s in local + peers] == [3.0, 0.0]


def test_a_collective_not_every_rank_reported_counts_over_those_seen_after_a_wait() -> None:
    # A four-rank communicator whose ranks 2 and 3 have no agent reporting them; the job's
    # rank 5 on a peer reports its arrivals (at another communicator): a peer's answer may
    # come late, so the collective waits for it.
    late = LateArrivals()
    peer = [pulled(rank(5, [], comm_id=PAIR), 0)]
    first = [rank(0, [(8, T0 + 2 * MS)]), rank(1, [(8, T0 + 7 * MS)])]
    rounds = [late.apply(first, peer)[0]]
    rounds += [late.apply([rank(0, []), rank(1, [])], peer)[0] for _ in range(WAIT_ROUNDS)]
    # Seen in the first round, waited for the rest in WAIT_ROUNDS more.
    assert [[ms(s) for s in r] for r in rounds] == [[0.0, 0.0] for _ in range(WAIT_ROUNDS)] + [
        [0.0, 5.0]
    ]
    # Counted: the missing ranks' arrivals coming later add nothing.
    again = late.apply([rank(0, [])], [pulled(rank(2, [(8, T0)]), 0)])
    assert [s.late_s for s in again[0] + again[1]] == [0.0, 0.0]


def test_without_peers_a_collective_waits_one_round_for_this_node_s_ranks() -> None:
    # No peer reports the job's ranks: nothing to wait for but this node's ranks that
    # completed the collective after the sample that saw the first (rank 1 here, late).
    late = LateArrivals()
    first, _ = late.apply([rank(0, [(8, T0)]), rank(1, [])], [])
    second, _ = late.apply([rank(0, []), rank(1, [(8, T0 + 30 * MS)])], [])
    assert [ms(s) for s in first] == [0.0, 0.0]
    assert [ms(s) for s in second] == [0.0, 30.0]


def test_a_peer_s_answer_read_again_is_not_counted_twice() -> None:
    # The peers' answers are kept until newer ones come: the same arrivals in two rounds.
    late = LateArrivals()
    local = [rank(0, [(1, T0)], comm_ranks=3)]
    peers = [
        pulled(rank(2, [(1, T0 + MS)], comm_ranks=3), 0),
        pulled(rank(3, [(1, T0 + 9 * MS)], comm_ranks=3), 0),
    ]
    first = late.apply(local, peers)
    assert [ms(s) for s in first[0] + first[1]] == [0.0, 1.0, 9.0]
    # Read again for longer than a collective waits for missing ranks: never counted again.
    for _ in range(WAIT_ROUNDS + 2):
        again = late.apply([rank(0, [])], peers)
        assert [s.late_s for s in again[0] + again[1]] == [0.0, 0.0, 0.0]
    # And a duplicate rank (the same rank reported twice in a round) keeps its first arrival.
    dup = late_ms([rank(0, [(2, T0)], comm_ranks=2)], [rank(1, [(2, T0 + MS)]), rank(1, [(2, T0)])])
    assert dup == {0: 0.0, 1: 1.0}


def test_a_rank_without_arrivals_has_no_late_time_and_jobs_are_apart() -> None:
    other = RankSignals(
        "42", 1, 2000, 0.0, 5.0, 1.0, 0.0, 4.0, 0.0, 0,
        arrivals=(Arrivals(WORLD, 2, (10,), (T0 + 50 * MS,)),),
    )  # fmt: skip
    a, _ = LateArrivals().apply([rank(0, [(10, T0)], comm_ranks=2), rank(1, None), other], [])
    assert a[0].late_s == 0.0
    assert math.isnan(a[1].late_s)  # no plugin: NaN, the score leaves it out
    assert a[2].late_s == 0.0  # another job's rank at the same comm id and seq: not compared
    # A peer's rank of a job with no rank here is left as its agent sent it.
    elsewhere = replace(other, job_id="43", late_s=0.125)
    _, (peer,) = LateArrivals().apply([rank(0, [(10, T0)], comm_ranks=2)], [elsewhere])
    assert peer is elsewhere


def test_arrivals_on_the_wire_cost_4_to_5_bytes_each() -> None:
    def per_arrival(step_ns: int) -> float:
        arrivals = [(1_000_000 + i, T0 + i * step_ns) for i in range(MAX_ARRIVALS)]
        full = rank(0, arrivals, comm_ranks=64)
        with_arrivals = to_pb(to_record(full, "node-a", 1000.0)).ByteSize()
        without = to_pb(to_record(rank(0, None), "node-a", 1000.0)).ByteSize()
        return (with_arrivals - without) / MAX_ARRIVALS

    # Packed deltas: a seq step of 1 (1 byte) and an arrival step of 1 ms (3 bytes zigzagged)
    # or 10 ms (4 bytes); the communicator's id, size, first values, tags and lengths once
    # (about 36 bytes): 4.1 and 5.1 bytes an arrival, 1-1.3 KB for 256 (27 bytes each, one
    # message per arrival, before).
    assert 4.1 <= per_arrival(MS) <= 4.2, per_arrival(MS)
    assert 5.1 <= per_arrival(10 * MS) <= 5.2, per_arrival(10 * MS)
    full = rank(0, [(1_000_000 + i, T0 + i * MS) for i in range(MAX_ARRIVALS)], comm_ranks=64)
    back = from_record(from_pb(RankSignal, to_pb(to_record(full, "node-a", 1000.0))))
    assert back.arrivals == full.arrivals
    unknown = from_record(from_pb(RankSignal, to_pb(to_record(rank(0, None), "node-a", 1.0))))
    assert unknown.arrivals is None


def test_a_collective_whose_arrivals_span_more_than_a_minute_is_left_out() -> None:
    # A peer whose arrival is two minutes early (its clock, or its data, is wrong) would make
    # every other rank two minutes late at that collective: the collective is left out, the
    # others are counted as usual.
    late = LateArrivals()
    local = [rank(0, [(1, T0), (2, T0 + 200 * MS)], comm_ranks=2)]
    peers = [rank(1, [(1, T0 - 120_000 * MS), (2, T0 + 203 * MS)], comm_ranks=2)]
    a, b = late.apply(local, peers)
    assert (ms(a[0]), ms(b[0])) == (0.0, 3.0)
    assert late.left_out == 1


def test_a_peer_that_sends_more_arrivals_than_a_sender_may_is_cut_to_the_latest() -> None:
    many = rank(2, [(seq, T0 + seq) for seq in range(3 * MAX_ARRIVALS)])
    record = to_record(many, "node-b", 1000.0)
    got = from_record(from_pb(RankSignal, to_pb(record)))
    assert got.arrivals is not None
    (g,) = got.arrivals
    assert g.seqs == tuple(range(2 * MAX_ARRIVALS, 3 * MAX_ARRIVALS))
    assert g.at_ns == tuple(T0 + seq for seq in range(2 * MAX_ARRIVALS, 3 * MAX_ARRIVALS))


def test_old_counted_collectives_are_forgotten_but_never_counted_again() -> None:
    # More collectives than a communicator's counted set keeps: the oldest are forgotten,
    # and one of them read again (a peer's very old answer) is below what is kept: ignored.
    late = LateArrivals()
    n = 9000
    a, b = late.apply(
        [rank(0, [(seq, T0 + seq * MS) for seq in range(n)], comm_ranks=2)],
        [rank(1, [(seq, T0 + seq * MS + MS) for seq in range(n)], comm_ranks=2)],
    )
    assert (ms(a[0]), ms(b[0])) == (0.0, n * 1.0)
    a, b = late.apply(
        [rank(0, [(0, T0)], comm_ranks=2)], [rank(1, [(0, T0 + 5 * MS)], comm_ranks=2)]
    )
    assert (ms(a[0]), ms(b[0])) == (0.0, 0.0)


def test_collectives_every_rank_reported_and_those_some_did_not_count_in_one_round() -> None:
    # A four-rank communicator of which three ranks report (no peers: one round's wait).
    # Seq 1 reached by all three (counted a column at a time), seq 2 by two of them (counted
    # on its own), seq 3 by two a minute and a half apart (left out).
    late = LateArrivals()
    first, _ = late.apply(
        [
            rank(0, [(1, T0), (2, T0 + 100 * MS), (3, T0 + 200 * MS)]),
            rank(1, [(1, T0 + 2 * MS), (2, T0 + 105 * MS)]),
            rank(2, [(1, T0 + 7 * MS), (3, T0 + 90_200 * MS)]),
        ],
        [],
    )
    assert [ms(s) for s in first] == [0.0, 0.0, 0.0]
    second, _ = late.apply([rank(0, []), rank(1, []), rank(2, [])], [])
    assert [ms(s) for s in second] == [0.0, 2.0 + 5.0, 7.0]
    assert late.left_out == 1


def test_the_latest_arrivals_are_kept_across_communicators_by_time() -> None:
    # Two communicators interleaved in time, 300 arrivals each: the latest 256 of the 600 by
    # arrival time are the last 128 of each, each communicator's in its order.
    arrivals = [
        Arrival(comm, seq, T0 + (2 * seq + (comm == PAIR)) * MS, 2)
        for seq in range(300)
        for comm in (WORLD, PAIR)
    ]
    got = latest(grouped(arrivals))
    assert [(g.comm_hash, g.seqs) for g in got] == [
        (WORLD, tuple(range(172, 300))),
        (PAIR, tuple(range(172, 300))),
    ]
    assert got[1].at_ns == tuple(T0 + (2 * seq + 1) * MS for seq in range(172, 300))


def test_a_peer_s_columns_of_different_lengths_are_read_as_far_as_both_go() -> None:
    bad = CommArrivals(WORLD, 2, seq_deltas=(5, 1, 1), arrival_deltas=(T0, MS))
    record = replace(to_record(rank(1, None), "node-b", 1.0), arrivals=(bad,), arrivals_known=True)
    got = from_record(from_pb(RankSignal, to_pb(record)), 1000)
    assert got.arrivals == (Arrivals(WORLD, 2, (5, 6), (T0 - 1000, T0 + MS - 1000)),)
