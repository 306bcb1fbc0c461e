"""Turning a capture into trace events: time conversion, rows, lanes, clipping, the info slice.

Pure functions on hand-made records, so every expected value is exact.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from bpfdyno.core.events import KernelEvent
from bpfdyno.tracing.capture.records import (
    GpuSample,
    KernelTrackRequest,
    NcclCall,
    NetBurst,
    NetEvent,
    OffCpu,
    ProcessCapture,
    SocketInfo,
    TcpSample,
    Track,
    TrackStats,
)
from bpfdyno.tracing.capture.tracks import (
    TID_BASE,
    Window,
    assign_lanes,
    build_tracks,
    format_us,
)

PID = 4242
BASE_NS = 1_000_000_000_000  # baseTimeNanoseconds
OFFSET = 2_000_000_000_000  # wall - monotonic
SOCK = SocketInfo("tcp", "127.0.0.1:40000", "127.0.0.1:29500")


def test_format_us_is_exact_with_three_decimals() -> None:
    assert format_us(1_234_567) == b"1234.567"
    assert format_us(5) == b"0.005"
    assert format_us(0) == b"0.000"
    assert format_us(-1_500) == b"-1.500"
    assert format_us(4_628_585_561_844_297) == b"4628585561844.297"


@pytest.mark.parametrize(
    ("intervals", "lanes"),
    [
        ([(0, 10), (10, 20), (20, 30)], [0, 0, 0]),  # one after the other
        ([(0, 10), (2, 5), (5, 8)], [0, 0, 0]),  # nested
        ([(0, 10), (5, 15)], [0, 1]),  # partial overlap: a second lane
        ([(0, 10), (5, 15), (12, 20), (16, 18)], [0, 1, 0, 0]),
        ([(0, 0), (0, 0)], [0, 0]),  # zero-length slices nest
    ],
)
def test_lanes_keep_rows_properly_nested(
    intervals: list[tuple[int, int]], lanes: list[int]
) -> None:
    assert assign_lanes(intervals) == lanes


def capture(records: list[Any], **stats: TrackStats) -> ProcessCapture:
    return ProcessCapture(
        pid=PID,
        request=KernelTrackRequest(frozenset(Track), 5.0),
        begin_ns=0,
        end_ns=100_000_000,
        begin_wall_ns=OFFSET,
        offset_ns=OFFSET,
        drift_ns=7,
        records=records,
        stats={Track(k): v for k, v in stats.items()},
        dropped_over_cap=3,
        cap=100,
        settings={"net_coalesce_gap_us": 50, "net_coalesce_max_us": 1000, "sched_min_offcpu_us": 0},
    )


def rel(mono_ns: int) -> int:
    """A monotonic ns timestamp of the capture, relative to the base time."""
    return mono_ns + OFFSET - BASE_NS


def decoded(events: list[bytes]) -> list[dict[str, Any]]:
    return [json.loads(e) for e in events]


def rows(evs: list[dict[str, Any]]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in evs if e.get("name") == "thread_name"}


def test_net_bursts_on_socket_rows_with_a_lane_for_overlaps() -> None:
    window = Window(rel(0), rel(100_000_000), "kineto")
    recs = [
        NetBurst(11, 0xABC, False, 1_000_000, 2_000_000, 4096, 4, SOCK),
        NetBurst(12, 0xABC, False, 1_500_000, 2_500_000, 100, 1, SOCK),  # overlaps: lane 2
        NetBurst(11, 0xABC, True, 3_000_000, 3_000_000, 64, 1, SOCK),
        NetBurst(11, 0xABC, False, 200_000_000, 200_000_001, 1, 1, SOCK),  # after the window
    ]
    built = build_tracks(capture(recs), BASE_NS, window, [Track.NET])
    evs = decoded(built.events)
    names = rows(evs)
    send = "kernel net: TCP 127.0.0.1:40000 -> 127.0.0.1:29500 send"
    slices = [e for e in evs if e.get("cat") == "bpfdyno.net" and e["ph"] == "X"]
    assert [(names[e["tid"]], e["name"], e["args"]["bytes"]) for e in slices] == [
        ("kernel net: TCP 127.0.0.1:40000 -> 127.0.0.1:29500 recv", "recv", 64),
        (send, "send", 4096),
        (f"{send} (2)", "send", 100),
    ]
    first = slices[1]
    assert (first["ts"], first["dur"]) == (
        float(format_us(rel(1_000_000))),
        1000.0,
    )
    assert first["args"] == {
        "bytes": 4096,
        "calls": 4,
        "tid": 11,
        "protocol": "tcp",
        "local": "127.0.0.1:40000",
        "peer": "127.0.0.1:29500",
        "socket": "0xabc",
    }
    assert all(e["pid"] == PID and e.get("tid", TID_BASE + 1) > TID_BASE for e in evs)
    counter = [e for e in evs if e["ph"] == "C"]
    assert [c["args"] for c in counter] == [
        {"sent": 4096, "received": 0},
        {"sent": 4196, "received": 0},
        {"sent": 4196, "received": 64},
    ]
    assert built.counts == {Track.NET: 3}


def tcp_sample(ts_ns: int, srtt_us: int, retrans: int = 0) -> TcpSample:
    return TcpSample(ts_ns, 11, 0xABC, SOCK, srtt_us, 1500, 224_000, 18, 3, 4344, 100, retrans, 0)


def test_tcp_samples_are_one_counter_per_connection() -> None:
    """Samples inside the window, the last one before it (at the window's start), none after;
    times in ms."""
    window = Window(rel(50_000_000), rel(100_000_000), "kineto")
    other = SocketInfo("tcp", "10.0.0.1:5000", "10.0.0.2:29500")
    recs = [
        tcp_sample(10_000_000, 40_000),  # before, superseded
        tcp_sample(40_000_000, 30_500),  # the last before the window
        tcp_sample(60_000_000, 21_250, retrans=2),
        tcp_sample(200_000_000, 99_000),  # after the window
        TcpSample(70_000_000, 12, 0xDEF, other, 80, 20, 200_000, 10, 0, 0, 0, 0, 0),
    ]
    built = build_tracks(capture(recs), BASE_NS, window, [Track.NET])
    counters = [e for e in decoded(built.events) if e["ph"] == "C"]
    name = "kernel net tcp: TCP 127.0.0.1:40000 -> 127.0.0.1:29500"
    assert [(c["name"], c["ts"], c["args"]["srtt_ms"]) for c in counters] == [
        (
            "kernel net tcp: TCP 10.0.0.1:5000 -> 10.0.0.2:29500",
            float(format_us(rel(70_000_000))),
            0.08,
        ),
        (name, float(format_us(rel(50_000_000))), 30.5),
        (name, float(format_us(rel(60_000_000))), 21.25),
    ]
    assert counters[2]["args"] == {
        "srtt_ms": 21.25,
        "rttvar_ms": 1.5,
        "rto_ms": 224.0,
        "cwnd": 18,
        "inflight_bytes": 4344,
        "queued_bytes": 100,
        "retransmits": 2,
    }
    assert all(c["cat"] == "bpfdyno.net" and c["pid"] == PID for c in counters)
    assert built.counts == {Track.NET: 3}


def test_rare_events_and_the_pre_window() -> None:
    window = Window(rel(50_000_000), rel(100_000_000), "kineto")
    recs = [
        NetEvent("tcp_retransmit", 60_000_000, 0, 0xABC, SOCK, {"state": "ESTABLISHED"}),
        NetEvent(
            "tcp_state", 70_000_000, 11, 0xABC, SOCK, {"state": "CLOSE", "oldstate": "FIN_WAIT2"}
        ),
        NetEvent("packet_drop", 120_000_000, 0, 0xABC, SOCK, {"state": "CLOSE", "reason": "X"}),
    ]
    before = [KernelEvent(OFFSET - 1_000_000, "tcp_connect", PID, 0, "python", {"dport": 29500})]
    built = build_tracks(capture(recs), BASE_NS, window, [Track.NET], before)
    evs = decoded(built.events)
    instants = [e for e in evs if e["ph"] == "i"]
    assert [(e["name"], e["ts"]) for e in instants] == [
        ("tcp_retransmit", float(format_us(rel(60_000_000)))),
        ("tcp FIN_WAIT2 -> CLOSE", float(format_us(rel(70_000_000)))),
        ("tcp_connect", float(format_us(OFFSET - 1_000_000 - BASE_NS))),
    ]
    assert instants[2]["args"] == {"source": "flight recorder (before the request)", "dport": 29500}
    assert instants[1]["args"]["tid"] == 11 and "tid" not in instants[0]["args"]
    assert {rows(evs)[e["tid"]] for e in instants} == {"kernel net events"}


def test_off_cpu_split_at_the_wakeup_and_clipped_to_the_window() -> None:
    window = Window(rel(10_000_000), rel(100_000_000), "kineto")
    recs = [
        # Blocked in futex (202) from 5 ms (before the window) until woken at 20 ms, on CPU at 21.
        OffCpu(11, "gloo", 5_000_000, 20_000_000, 21_000_000, 1, 202, 1),
        # Preempted from 30 to 31 ms.
        OffCpu(11, "gloo", 30_000_000, 0, 31_000_000, 0, -1, 0),
        # Uninterruptible, no syscall, no wakeup seen.
        OffCpu(12, "python", 40_000_000, 0, 45_000_000, 2, -1, 0),
    ]
    evs = decoded(build_tracks(capture(recs), BASE_NS, window, [Track.SCHED]).events)
    names = rows(evs)
    got = [
        (names[e["tid"]], e["name"], e["ts"], e["dur"], e["args"].get("cause"))
        for e in evs
        if e.get("cat") == "bpfdyno.sched"
    ]
    start = float(format_us(rel(10_000_000)))
    assert got == [
        ("kernel sched: thread 11 (gloo)", "blocked: lock (futex)", start, 10_000.0, "lock"),
        ("kernel sched: thread 11 (gloo)", "runnable: woken", start + 10_000, 1000.0, "runnable"),
        (
            "kernel sched: thread 11 (gloo)",
            "runnable: preempted",
            start + 20_000,
            1000.0,
            "runnable",
        ),
        (
            "kernel sched: thread 12 (python)",
            "blocked: disk/uninterruptible",
            start + 30_000,
            5000.0,
            "disk/uninterruptible",
        ),
    ]
    first = next(e for e in evs if e.get("name") == "blocked: lock (futex)")
    assert first["args"] == {
        "tid": 11,
        "cpu": 1,
        "state": "S",
        "clipped_to_window": True,
        "cause": "lock",
        "syscall": "futex",
    }


def test_each_interval_says_what_its_thread_ran_since_its_previous_one() -> None:
    """The records carry the thread's cumulative CPU times at each switch-out; its slices
    get the differences, on the interval's first slice (the blocked one), none on the
    thread's first interval, and none where the times went back (a thread id reused)."""
    window = Window(rel(0), rel(100_000_000), "kineto")
    ms = 1_000_000
    recs = [
        OffCpu(11, "gloo", 10 * ms, 0, 11 * ms, 0, -1, 0, user_ns=50 * ms, system_ns=4 * ms),
        OffCpu(11, "gloo", 20 * ms, 25 * ms, 26 * ms, 2, 17, 0, user_ns=54 * ms, system_ns=16 * ms),
        OffCpu(11, "gloo", 40 * ms, 0, 41 * ms, 0, -1, 0, user_ns=1 * ms, system_ns=0),
        OffCpu(12, "python", 30 * ms, 0, 31 * ms, 0, -1, 0),  # written without the times
        OffCpu(12, "python", 50 * ms, 0, 51 * ms, 0, -1, 0),
    ]
    evs = decoded(build_tracks(capture(recs), BASE_NS, window, [Track.SCHED]).events)
    got = [
        (e["args"]["tid"], e["name"], e["args"].get("user_us"), e["args"].get("system_us"))
        for e in evs
        if e.get("cat") == "bpfdyno.sched"
    ]
    assert got == [
        (11, "runnable: preempted", None, None),
        (11, "blocked: disk/uninterruptible (pread64)", 4000, 12_000),
        (11, "runnable: woken", None, None),
        (11, "runnable: preempted", None, None),
        (12, "runnable: preempted", None, None),
        (12, "runnable: preempted", None, None),
    ]


def test_nccl_calls_and_their_group() -> None:
    window = Window(rel(0), rel(100_000_000), "kineto")

    def call(fn: str, start: int, end: int, **kw: int) -> NcclCall:
        args = {"count": 0, "datatype": -1, "op": -1, "peer": -1, "comm": 0, "stream": 0}
        args |= kw
        return NcclCall(11, fn, start, end, sendbuff=0, recvbuff=0, ret=0, **args)

    recs = [
        call("ncclGroupStart", 1000, 2000),
        call("ncclSend", 3000, 4000, count=10, datatype=7, peer=1, comm=0x10, stream=0x20),
        call("ncclGroupEnd", 5000, 9000),
        call("ncclAllReduce", 10_000, 12_000, count=8, datatype=9, op=4, comm=0x10, stream=0x20),
    ]
    evs = decoded(build_tracks(capture(recs), BASE_NS, window, [Track.NCCL]).events)
    slices = [e for e in evs if e.get("cat") == "bpfdyno.nccl"]
    assert {rows(evs)[e["tid"]] for e in slices} == {"NCCL: thread 11"}
    assert [(e["name"], e["dur"]) for e in slices] == [
        ("ncclGroup", 8.0),
        ("ncclGroupStart", 1.0),
        ("ncclSend", 1.0),
        ("ncclGroupEnd", 4.0),
        ("ncclAllReduce", 2.0),
    ]
    assert slices[2]["args"] == {
        "result": "ncclSuccess",
        "count": 10,
        "datatype": "float32",
        "bytes": 40,
        "peer": 1,
        "comm": "0x10",
        "stream": "0x20",
        "tid": 11,
    }
    assert slices[4]["args"]["op"] == "avg" and slices[4]["args"]["bytes"] == 16


def test_gpu_counters_inside_the_window_and_one_each_side() -> None:
    window = Window(rel(250_000_000), rel(450_000_000), "kineto")
    recs = [
        GpuSample(
            t * 100_000_000, 0, {"utilization_percent": float(t), "power_watts": float("nan")}
        )
        for t in range(8)
    ]
    evs = decoded(build_tracks(capture(recs), BASE_NS, window, [Track.GPU]).events)
    counters = [e for e in evs if e["ph"] == "C"]
    assert {e["name"] for e in counters} == {"GPU 0 utilization (%)"}  # NaN: not written
    assert [e["args"]["value"] for e in counters] == [2.0, 3.0, 4.0, 5.0]


def test_the_info_slice_states_losses_and_notes() -> None:
    window = Window(rel(0), rel(100_000_000), "capture")
    stats = {
        "net": TrackStats(events=9, lost_kernel=4, calls=120),
        "sched": TrackStats(short_offcpu=2, short_offcpu_ns=3500),
        "nccl": TrackStats(note="process 4242 maps no libnccl"),
    }
    built = build_tracks(capture([], **stats), BASE_NS, window, [Track.NET, Track.SCHED])
    evs = decoded(built.events)
    [slice_] = [e for e in evs if e.get("cat") == "bpfdyno.info"]
    assert rows(evs)[slice_["tid"]] == "kernel tracks"
    assert slice_["name"] == "bpfdyno kernel tracks"
    assert slice_["dur"] == 100_000.0
    args = slice_["args"]
    assert args["tracks"] == ["net", "sched"]
    assert args["requested"] == ["net", "sched", "nccl", "gpu", "fabric"]
    assert args["window"] == "capture"
    assert args["net_lost_ring_buffer_full"] == 4
    assert args["net_calls"] == 120
    assert args["sched_short_offcpu_not_written"] == 2
    assert args["sched_short_offcpu_total_us"] == 3.5
    assert args["nccl_note"] == "process 4242 maps no libnccl"
    assert (args["records_over_cap_dropped"], args["records_cap"]) == (3, 100)
    assert (args["clock_offset_ns"], args["clock_drift_ns"]) == (OFFSET, 7)
    assert args["net_coalescing"].startswith("one thread's calls on one socket in one direction")
    assert args["pre_window_s"] == 5.0


@pytest.mark.parametrize(
    ("window", "late_us"),
    [
        # Kineto's window began 1.5 s before the recording (a config out before the probes).
        (Window(rel(-1_500_000_000), rel(100_000_000), "kineto"), 1_500_000.0),
        (Window(rel(-2_000_001), rel(100_000_000), "kineto"), 2_000.001),
        # Within the clock's tolerance (1 ms), or the recording began first: nothing missed.
        (Window(rel(-1_000_000), rel(100_000_000), "kineto"), None),
        (Window(rel(10_000_000), rel(100_000_000), "kineto"), None),
        # The capture's own span is its window: never late.
        (Window(rel(0), rel(100_000_000), "capture"), None),
    ],
)
def test_the_info_slice_says_how_late_the_recording_began_in_kineto_s_window(
    window: Window, late_us: float | None
) -> None:
    built = build_tracks(capture([]), BASE_NS, window, [Track.SCHED])
    [slice_] = [e for e in decoded(built.events) if e.get("cat") == "bpfdyno.info"]
    assert slice_["args"].get("capture_late_us") == late_us
