"""The NCCL profiler plugin, driven as NCCL drives it, read by the agent's receiver.

Every CPU time comes from the harness's clock and every GPU time from the descriptors, so the
aggregates and records are checked to the nanosecond.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from nccl_harness import (
    KERNEL_CH_STOP,
    RECV_FLUSH_WAIT,
    RECV_GPU_WAIT,
    RECV_WAIT,
    SEND_GPU_WAIT,
    SEND_PEER_WAIT_V4,
    SEND_WAIT,
    EventDescr,
    EventDescrV4,
    Plugin,
    ProfilerV4,
    ProfilerV5,
    StateArgs,
)

from bpfdyno.core.status import PartState
from bpfdyno.sources.nccl_profiler import layout
from bpfdyno.sources.nccl_profiler.build import build_plugin
from bpfdyno.sources.nccl_profiler.receiver import (
    NcclCollective,
    NcclProfilerReceiver,
    NcclRankInterval,
    intervals,
)
from bpfdyno.sources.nccl_profiler.track import trace_events

COMM = 0xABCDEF0123456789
DEFAULT_MASK = 2 | 4 | 8 | 16 | 64  # coll, p2p, proxy op, proxy step, kernel channel


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_plugin(tmp_path_factory.mktemp("plugin"))


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("BPFDYNO_NCCL_SHM_DIR", str(tmp_path))
    monkeypatch.delenv("BPFDYNO_NCCL_EVENTS", raising=False)
    return tmp_path


@pytest.fixture(params=[5, 4], ids=["v5", "v4"])
def plugin(library: Path, shm: Path, request: pytest.FixtureRequest) -> Iterator[Plugin]:
    """The plugin as NCCL loads it by API v5, and by v4 (older NCCL releases)."""
    p = Plugin(library, version=request.param)
    yield p
    p.close()


def one_allreduce(p: Plugin, ctx: int, seq: int, t0: int) -> None:
    """One AllReduce of 1024 float32 on two channels, as NCCL reports it, from time t0.

    Channel 0's proxy sends (peer wait 500 ns, network wait 1000 ns); channel 1's receives
    (network wait 3000 ns). The GPU runs from 5_000_000 to 5_010_100. The last part stops at
    t0 + 6000, which completes the collective: 6000 ns in all.
    """
    p.now = t0
    coll = p.start_coll(ctx, seq=seq, count=1024, datatype="ncclFloat32", nchannels=2)
    p.now = t0 + 500
    ch0 = p.start_kernel_ch(ctx, coll, channel=0, gpu_start_ns=5_000_000)
    p.now = t0 + 600
    ch1 = p.start_kernel_ch(ctx, coll, channel=1, gpu_start_ns=5_000_100)
    p.now = t0 + 1000
    p.stop(coll)  # the CPU-side enqueue is done; the parts go on
    send = p.start_proxy_op(ctx, coll, channel=0, is_send=True)
    recv = p.start_proxy_op(ctx, coll, channel=1, is_send=False)
    p.now = t0 + 2000
    s0 = p.start_proxy_step(ctx, send, step=0)
    p.state(s0, SEND_GPU_WAIT)
    p.now = t0 + 2100
    r0 = p.start_proxy_step(ctx, recv, step=0)
    p.state(r0, RECV_WAIT)
    p.now = t0 + 2500
    p.state(s0, SEND_PEER_WAIT_V4)
    p.now = t0 + 3000
    p.state(s0, SEND_WAIT, trans_size=2048)
    p.now = t0 + 4000
    p.stop(s0)
    p.now = t0 + 5100
    p.state(r0, RECV_FLUSH_WAIT, trans_size=2048)
    p.now = t0 + 5200
    p.state(r0, RECV_GPU_WAIT)
    p.now = t0 + 5300
    p.stop(r0)
    p.now = t0 + 5400
    p.stop(send)
    p.stop(recv)
    p.state(ch0, KERNEL_CH_STOP, p_timer=5_009_000)
    p.state(ch1, KERNEL_CH_STOP, p_timer=5_010_100)
    p.now = t0 + 5900
    p.stop(ch0)
    p.now = t0 + 6000
    p.stop(ch1)


def test_abi_mirror_has_the_v5_and_v4_layouts() -> None:
    # The offsets NCCL's v5 header gives on LP64 (the C side asserts the same numbers).
    assert ctypes.sizeof(EventDescr) == 112
    assert EventDescr.u.offset == 24
    assert EventDescr.coll.offset == 24
    union = EventDescr.u.offset
    coll = type(EventDescr().coll)
    assert union + coll.count.offset == 56
    assert union + coll.nChannels.offset == 80
    assert union + coll.parentGroup.offset == 104
    kernel_ch = type(EventDescr().kernelCh)
    assert union + kernel_ch.pTimer.offset == 32
    assert ctypes.sizeof(StateArgs) == 8
    assert ctypes.sizeof(ProfilerV5) == 48
    # v4: a one-byte type, the same union members at the same offsets, no parentGroup.
    assert ctypes.sizeof(EventDescrV4) == 104
    assert EventDescrV4.u.offset == 24
    assert union + type(EventDescrV4().coll).proto.offset == 96
    assert ctypes.sizeof(ProfilerV4) == 48


def test_init_asks_nccl_for_collective_parts_and_publishes_the_communicator(
    plugin: Plugin, shm: Path
) -> None:
    plugin.now = 1000
    rc, ctx, mask = plugin.init(COMM, name="world", nnodes=2, nranks=4, rank=3)
    assert (rc, mask) == (0, DEFAULT_MASK)
    path = shm / f"bpfdyno-nccl.{os.getpid()}"
    st = path.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_size == layout.FILE_BYTES

    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.rank, rank.nranks, rank.colls_started, rank.colls_completed) == (3, 4, 0, 0)
    assert rank.api_version == plugin.version
    (comm,) = rank.comms
    assert (comm.comm_id, comm.name, comm.nnodes, comm.finalized) == (COMM, "world", 2, False)
    assert receiver.in_use()
    status = receiver.status()
    assert status.state == PartState.OK
    assert status.reason == f"in use by 1 trainer process(es): {os.getpid()}"

    assert plugin.finalize(ctx) == 0
    assert not path.exists()  # the last communicator takes the file with it
    receiver.poll()
    assert receiver.snapshot() == {}
    assert "no trainer publishes NCCL profiler data" in receiver.status().reason


def test_collective_completes_when_its_last_part_stops_with_exact_times(
    plugin: Plugin, shm: Path
) -> None:
    _, ctx, _ = plugin.init(COMM, nranks=4, rank=1)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    one_allreduce(plugin, ctx, seq=7, t0=10_000)

    # Between the enqueue's stop and the last part the collective is still in flight.
    plugin.now = 20_000
    coll = plugin.start_coll(ctx, seq=8)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.colls_started, rank.colls_completed, rank.in_flight) == (2, 1, 1)
    assert rank.last_seq == 7
    assert rank.time_in_collectives_ns == 6000
    assert rank.gpu_time_ns == 10_100  # first channel start -> last channel stop
    assert rank.net_wait_ns == 500 + 1000 + 3000  # peer wait, send wait, recv wait
    assert rank.bytes == 4096
    offset = receiver.realtime_offset_ns(os.getpid())
    assert rank.last_start_realtime_ns == 20_000 + offset
    assert rank.recent == (
        NcclCollective(
            comm_id=COMM,
            seq=7,
            func="AllReduce",
            bytes=4096,
            start_realtime_ns=10_000 + offset,
            duration_ns=6000,
            gpu_ns=10_100,
            net_wait_ns=4500,
            gpu_start_ns=5_000_000,
            gpu_stop_ns=5_010_100,
        ),
    )
    # Without full mode the ring holds the collective only, no parts.
    assert receiver.drain_records(os.getpid()) == []

    plugin.now = 20_700
    plugin.stop(coll)  # no parts: done at its own stop
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.colls_completed, rank.last_seq, rank.in_flight) == (2, 8, 0)
    assert rank.time_in_collectives_ns == 6700
    assert rank.recent[-1].duration_ns == 700
    assert rank.recent[-1].gpu_ns == 0
    plugin.finalize(ctx)


def test_point_to_point_counts_apart_from_collectives(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM)
    plugin.now = 100
    send = plugin.start_p2p(ctx, "Send", peer=1, count=512, datatype="ncclBfloat16")
    plugin.now = 350
    plugin.stop(send)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    (comm,) = rank.comms
    assert (comm.p2p_completed, comm.colls_completed, comm.bytes) == (1, 0, 1024)
    assert rank.recent == ()  # arrival material is collectives only
    plugin.finalize(ctx)


def test_events_nccl_did_not_ask_for_are_ignored(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM)
    group = plugin.start_group(ctx)
    assert group == 0  # no handle: NCCL then skips the stop
    plugin.stop(0)
    # A proxy operation posted by another process has no parent here and counts nothing.
    plugin.now = 10
    coll = plugin.start_coll(ctx, seq=1)
    op = plugin.start_proxy_op(ctx, coll, channel=0, is_send=True, pid=os.getpid() + 1)
    step = plugin.start_proxy_step(ctx, op, 0)
    plugin.state(step, RECV_WAIT)
    plugin.now = 50
    plugin.stop(coll)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.colls_completed, rank.time_in_collectives_ns, rank.net_wait_ns) == (1, 40, 0)
    plugin.now = 90
    plugin.stop(step)
    plugin.stop(op)
    plugin.finalize(ctx)


def test_full_mode_records_every_kernel_channel_and_proxy_step(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    assert receiver.request_detail(30.0) == [os.getpid()]
    one_allreduce(plugin, ctx, seq=3, t0=1_000)
    receiver.poll()
    parts = receiver.drain_records(os.getpid())
    kinds = [(r.kind, r.channel, r.extra) for r in parts]
    assert kinds == [
        (layout.RecordKind.PROXY_STEP, 0, 0),
        (layout.RecordKind.PROXY_STEP, 1, 0),
        (layout.RecordKind.KERNEL_CH, 0, 0),
        (layout.RecordKind.KERNEL_CH, 1, 0),
    ]
    send, recv, ch0, ch1 = parts
    assert (send.seq, send.start_ns, send.duration_ns, send.net_wait_ns, send.bytes) == (
        3,
        3000,
        2000,
        1500,
        2048,
    )
    assert (recv.start_ns, recv.duration_ns, recv.net_wait_ns, recv.func) == (
        3100,
        3200,
        3000,
        RECV_GPU_WAIT,
    )
    assert (ch0.start_ns, ch0.duration_ns, ch0.gpu_start_ns, ch0.gpu_stop_ns) == (
        1500,
        5400,
        5_000_000,
        5_009_000,
    )
    assert (ch1.gpu_start_ns, ch1.gpu_stop_ns) == (5_000_100, 5_010_100)
    assert receiver.drain_records(os.getpid()) == []
    plugin.finalize(ctx)


def test_the_largest_communicator_names_the_rank(plugin: Plugin, shm: Path) -> None:
    _, world, _ = plugin.init(COMM, name="world", nranks=8, rank=5)
    _, pair, _ = plugin.init(COMM + 1, name="pp", nranks=2, rank=1)
    plugin.now = 10
    coll = plugin.start_coll(pair, seq=40)
    plugin.now = 30
    plugin.stop(coll)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.rank, rank.nranks, rank.colls_completed) == (5, 8, 0)
    assert rank.time_in_collectives_ns == 20  # time in collectives spans all communicators
    assert sorted((c.name, c.colls_completed, c.last_seq_completed) for c in rank.comms) == [
        ("pp", 1, 40),
        ("world", 0, 0),
    ]
    plugin.finalize(pair)
    receiver.poll()
    assert [c.finalized for c in receiver.snapshot()[os.getpid()].comms] == [False, True]
    plugin.finalize(world)


def test_a_lapped_ring_counts_what_the_agent_missed(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    total = layout.RING_RECORDS + 10
    for seq in range(total):
        plugin.now = 100 * seq
        plugin.stop(plugin.start_coll(ctx, seq=seq))
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert rank.records_lost == 10
    assert rank.colls_completed == total  # the counters lose nothing
    assert [c.seq for c in rank.recent] == list(range(total - 256, total))
    plugin.finalize(ctx)


def test_init_fails_with_the_reason_when_the_directory_is_unusable(
    plugin: Plugin, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BPFDYNO_NCCL_SHM_DIR", str(shm / "missing"))
    rc, ctx, _ = plugin.init(COMM)
    assert (rc, ctx) == (2, 0)  # ncclSystemError: NCCL runs on without the plugin
    (message,) = plugin.logged
    assert "cannot create %s: %s; set BPFDYNO_NCCL_SHM_DIR" in message


def test_activation_mask_from_the_environment(
    plugin: Plugin, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BPFDYNO_NCCL_EVENTS", "0x2")
    rc, ctx, mask = plugin.init(COMM)
    assert (rc, mask) == (0, 2)
    plugin.finalize(ctx)


def test_full_mode_records_become_a_trace_track(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    receiver.request_detail(30.0)
    one_allreduce(plugin, ctx, seq=3, t0=1_000)
    receiver.poll()
    offset = receiver.realtime_offset_ns(os.getpid())
    base = offset  # ts 0 of the file at monotonic 0: ts is then the monotonic time in µs
    events = trace_events(receiver.drain_records(os.getpid()), 77, offset, base)
    rows = {e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert rows == {1_100_000_003: "NCCL kernel channels", 1_100_000_004: "NCCL proxy steps"}
    assert [(e["ph"], rows[e["tid"]], e["name"], e.get("ts"), e.get("dur")) for e in events] == [
        ("X", "NCCL proxy steps", "step 0 channel 0", 3.0, 2.0),
        ("X", "NCCL proxy steps", "step 0 channel 1", 3.1, 3.2),
        ("X", "NCCL kernel channels", "AllReduce channel 0", 1.5, 5.4),
        ("X", "NCCL kernel channels", "AllReduce channel 1", 1.6, 5.4),
        ("M", "NCCL kernel channels", "thread_name", None, None),
        ("M", "NCCL proxy steps", "thread_name", None, None),
    ]
    assert events[0]["args"] == {
        "seq": 3, "bytes": 2048, "net_wait_ns": 1500, "last_state": "SendWait",
    }  # fmt: skip
    assert events[2]["args"] == {"seq": 3, "channel": 0, "gpu_ns": 9000}
    plugin.finalize(ctx)


def test_parts_that_start_after_the_enqueue_update_the_published_collective(
    plugin: Plugin, shm: Path
) -> None:
    # NCCL's usual order: the collective's own event stops once enqueued, before its proxy
    # thread starts the parts. The collective is published then, and updated when they end.
    _, ctx, _ = plugin.init(COMM)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    receiver.request_detail(30.0)
    plugin.now = 1_000
    coll = plugin.start_coll(ctx, seq=9, count=256, datatype="ncclFloat64")
    plugin.now = 1_400
    plugin.stop(coll)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.colls_completed, rank.in_flight, rank.time_in_collectives_ns) == (1, 0, 400)
    assert rank.recent[-1].duration_ns == 400

    plugin.now = 2_000
    channel = plugin.start_kernel_ch(ctx, coll, channel=0, gpu_start_ns=7_000)
    op = plugin.start_proxy_op(ctx, coll, channel=0, is_send=False)
    step = plugin.start_proxy_step(ctx, op, step=0)
    plugin.state(step, RECV_WAIT)
    plugin.now = 2_700
    plugin.stop(step)  # 700 ns waiting on the network
    plugin.stop(op)
    plugin.state(channel, KERNEL_CH_STOP, p_timer=8_500)
    plugin.now = 3_000
    plugin.stop(channel)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    # Counted once; its time, GPU span and network wait grown to the last part's end.
    assert (rank.colls_completed, rank.last_seq, rank.bytes) == (1, 9, 2048)
    assert (rank.time_in_collectives_ns, rank.gpu_time_ns, rank.net_wait_ns) == (2000, 1500, 700)
    assert [(c.seq, c.duration_ns, c.gpu_ns, c.net_wait_ns) for c in rank.recent] == [
        (9, 2000, 1500, 700)
    ]
    # Full mode: the parts (the collectives' records lie before the window on this clock).
    kinds = [r.kind for r in receiver.drain_records(os.getpid())]
    assert kinds == [layout.RecordKind.PROXY_STEP, layout.RecordKind.KERNEL_CH]
    plugin.finalize(ctx)


def test_the_track_shows_an_updated_collective_once_with_its_final_values() -> None:
    def coll(kind: int, duration_ns: int) -> layout.Record:
        return layout.Record(
            commit=1, kind=kind, comm_slot=0, func=1, channel=0, extra=2, seq=9,
            start_ns=1_000, duration_ns=duration_ns, gpu_start_ns=0, gpu_stop_ns=0,
            net_wait_ns=0, bytes=2048, enqueue_ns=400,
        )  # fmt: skip

    first = coll(layout.RecordKind.COLL, 400)
    update = coll(layout.RecordKind.COLL_UPDATE, 2000)
    events = trace_events([first, update], 5, 0, 0)
    assert [(e["name"], e.get("ts"), e.get("dur")) for e in events] == [
        ("AllReduce", 1.0, 2.0),
        ("thread_name", None, None),
    ]
    # An update whose first record was not drained stands for the collective in full.
    assert [e.get("dur") for e in trace_events([update], 5, 0, 0)] == [2.0, None]


def test_a_full_pool_drops_new_collectives_and_counts_them(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM)
    handles = [plugin.start_coll(ctx, seq=s) for s in range(256)]
    assert 0 not in handles
    assert plugin.start_coll(ctx, seq=256) == 0  # all in flight: not profiled
    plugin.stop(handles[0])
    assert plugin.start_coll(ctx, seq=257) == handles[0]  # a settled entry is reused
    receiver = NcclProfilerReceiver(shm_dir=shm)
    receiver.poll()
    rank = receiver.snapshot()[os.getpid()]
    assert (rank.colls_dropped, rank.colls_started, rank.colls_completed) == (1, 257, 1)
    plugin.finalize(ctx)


def test_the_realtime_offset_is_measured_again_every_second_of_collectives(
    plugin: Plugin, shm: Path
) -> None:
    path = shm / f"bpfdyno-nccl.{os.getpid()}"

    def measured_at() -> int:
        return layout.decode_header(path.read_bytes()).offset_measured_ns

    plugin.now = 5_000
    _, ctx, _ = plugin.init(COMM)
    assert measured_at() == 5_000
    plugin.now = 900_005_000
    plugin.stop(plugin.start_coll(ctx, seq=0))
    assert measured_at() == 5_000  # under a second later: not again
    plugin.now = 1_000_005_001
    plugin.stop(plugin.start_coll(ctx, seq=1))
    assert measured_at() == 1_000_005_001
    plugin.finalize(ctx)


def test_intervals_are_the_growth_between_two_snapshots(plugin: Plugin, shm: Path) -> None:
    _, ctx, _ = plugin.init(COMM, nranks=4, rank=2)
    receiver = NcclProfilerReceiver(shm_dir=shm)
    one_allreduce(plugin, ctx, seq=0, t0=0)
    receiver.poll()
    before = receiver.snapshot()
    one_allreduce(plugin, ctx, seq=1, t0=100_000)
    one_allreduce(plugin, ctx, seq=2, t0=200_000)
    plugin.now = 300_000
    plugin.start_coll(ctx, seq=3)  # in flight at the end
    receiver.poll()
    after = receiver.snapshot()
    pid = os.getpid()
    seconds = after[pid].updated_monotonic_s - before[pid].updated_monotonic_s
    assert intervals(before, after) == {
        pid: NcclRankInterval(
            pid=pid, rank=2, seconds=seconds, collectives=2, last_seq=2, in_flight=1,
            time_in_collectives_ns=12_000, gpu_time_ns=20_200, net_wait_ns=9_000, bytes=8192,
        )
    }  # fmt: skip
    assert intervals({}, after) == {}
    plugin.finalize(ctx)
