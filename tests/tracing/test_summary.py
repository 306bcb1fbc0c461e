"""`bpfdyno trace-summary`'s numbers from a trace file, and the side-by-side table."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.cli.trace_summary import format_summary
from bpfdyno.rpc.traces import ProcessSummary
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.wire import from_pb, to_pb

PID = 77


def x(
    cat: str, name: str, ts: float, dur: float, row: int = PID, args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A slice of ``PID`` on row ``row`` (a thread or a kernel-track row)."""
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": PID,
        "tid": row,
        "ts": ts,
        "dur": dur,
        "args": args or {},
    }


def instant(name: str, ts: float) -> dict[str, Any]:
    return {"ph": "i", "s": "t", "cat": "bpfdyno.net", "name": name, "pid": PID, "tid": 1, "ts": ts}


def write_trace(path: Path, gz: bool = False) -> None:
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans"}
    info = {"tracks": ["net", "sched", "nccl"]}
    info |= {"records_over_cap_dropped": 5, "net_lost_ring_buffer_full": 2}
    events = [
        {**span, "tid": "x", "ts": 1000.0, "dur": 1000.0},
        # Ops of two threads; nested ones count once; one before the window is left out.
        x("cpu_op", "aten::linear", 1100.0, 100.0),
        x("cpu_op", "aten::t", 1120.0, 10.0),
        x("cpu_op", "aten::addmm", 1150.0, 100.0),  # overlaps the first: union 1100-1250
        x("cpu_op", "aten::mul", 1500.0, 50.0, row=78),
        x("cpu_op", "aten::old", 500.0, 100.0),
        x("bpfdyno.net", "send", 1200.0, 10.0, 1, {"bytes": 1000, "calls": 2}),
        x("bpfdyno.net", "send", 1300.0, 0.0, 1, {"bytes": 24, "calls": 1}),
        x("bpfdyno.net", "recv", 1400.0, 5.0, 1, {"bytes": 500, "calls": 3}),
        instant("tcp_retransmit", 1600.0),
        instant("tcp_retransmit", 900.0),  # before the window: not counted
        instant("tcp_reset_received", 1700.0),
        instant("packet_drop", 1800.0),
        x("bpfdyno.sched", "runnable: preempted", 1000.0, 200.0, 2, {"tid": PID}),
        x(
            "bpfdyno.sched",
            "blocked: lock (futex)",
            1250.0,
            300.0,
            2,
            {"tid": PID, "cause": "lock"},
        ),
        x("bpfdyno.sched", "runnable: woken", 1550.0, 50.0, 2, {"tid": PID}),
        x(
            "bpfdyno.sched",
            "blocked: sleep (nanosleep)",
            1000.0,
            400.0,
            3,
            {"tid": 78, "cause": "sleep"},
        ),
        x("bpfdyno.nccl", "ncclGroup", 1000.0, 30.0, 4),
        x("bpfdyno.nccl", "ncclGroupStart", 1000.0, 1.0, 4),
        x("bpfdyno.nccl", "ncclAllReduce", 1010.0, 20.0, 4),
        x("bpfdyno.info", "bpfdyno kernel tracks", 1000.0, 1000.0, 5, info),
    ]
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"rank": 3, "world_size": 4},
        "trace_id": "abc",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
        "traceEvents": events,
        "traceName": "t",
    }
    data = json.dumps(doc, indent=2).encode()
    path.write_bytes(gzip.compress(data) if gz else data)


@pytest.mark.parametrize("gz", [False, True])
def test_numbers_from_the_file(tmp_path: Path, gz: bool) -> None:
    path = tmp_path / "t.json"
    write_trace(path, gz)
    s = summarize_file(str(path))
    assert s.evidence is not None and s.evidence.rank == 3
    assert dataclasses.replace(s, evidence=None) == ProcessSummary(
        path=str(path),
        pid=PID,
        rank=3,
        trace_id="abc",
        window_start_unix_seconds=1_700_000_000.001,
        window_seconds=0.001,
        pytorch_op_seconds=pytest.approx(200e-6),  # 1100-1250 on one thread, 1500-1550 on another
        kernel_tracks=("net", "sched", "nccl"),
        net_sent_bytes=1024,
        net_received_bytes=500,
        net_calls=6,
        tcp_retransmits=1,  # the one before the window is not counted
        tcp_resets=1,
        packet_drops=1,
        offcpu_runnable_seconds=pytest.approx(250e-6),
        offcpu_blocked_seconds=pytest.approx(700e-6),
        blocked_seconds_by_cause={"sleep": pytest.approx(400e-6), "lock": pytest.approx(300e-6)},
        main_thread_runnable_seconds=pytest.approx(250e-6),
        main_thread_blocked_seconds=pytest.approx(300e-6),
        nccl_calls=2,
        nccl_seconds=pytest.approx(21e-6),  # ncclGroupStart 1000-1001, ncclAllReduce 1010-1030
        kernel_records_lost=7,
        offcpu_threads=2,  # the main thread and thread 78
    )


def test_summary_fields_are_the_api_s(tmp_path: Path) -> None:
    fields = {f.name for f in dataclasses.fields(ProcessSummary)}
    assert fields == set(pb.ProcessSummary.DESCRIPTOR.fields_by_name)
    path = tmp_path / "t.json"
    write_trace(path)
    summary = summarize_file(str(path))
    msg = to_pb(summary)
    assert isinstance(msg, pb.ProcessSummary)
    assert msg.net_sent_bytes == 1024 and msg.blocked_seconds_by_cause["lock"] > 0
    assert from_pb(ProcessSummary, msg) == summary


def test_broken_files_say_why(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    write_trace(path)
    path.write_bytes(path.read_bytes()[:-300])
    s = summarize_file(str(path))
    assert "does not end like a complete Kineto trace" in s.error
    missing = summarize_file(str(tmp_path / "nope.json"))
    assert missing.error.startswith("cannot read")
    (tmp_path / "o.json").write_text('{"a": 1}')
    assert 'has no "traceEvents" array' in summarize_file(str(tmp_path / "o.json")).error


def row(rank: int, runnable: float, retx: int, sent: int) -> dict[str, Any]:
    s = ProcessSummary(
        path=f"/t/r{rank}.json",
        pid=100 + rank,
        rank=rank,
        window_seconds=1.0,
        offcpu_runnable_seconds=runnable,
        tcp_retransmits=retx,
        net_sent_bytes=sent,
        kernel_tracks=("net", "sched"),
        offcpu_threads=3,
    )
    out = dataclasses.asdict(s)
    out["kernel_tracks"] = list(out["kernel_tracks"])
    return out


def test_the_table_marks_the_rank_that_stands_out() -> None:
    text = format_summary(
        [row(0, 0.010, 0, 1 << 20), row(1, 0.011, 0, 1 << 20), row(2, 0.200, 9, 1 << 20)]
    )
    header, *rest = text.splitlines()
    lines = {line.split("  ")[0]: line for line in rest}
    assert header.split() == [
        "rank",
        "0",
        "/",
        "pid",
        "100",
        "rank",
        "1",
        "/",
        "pid",
        "101",
        "rank",
        "2",
        "/",
        "pid",
        "102",
    ]
    waiting = lines["off-CPU: waiting for a CPU (sum over 3 threads)"]
    assert waiting.endswith("200.000 ms !") and waiting.count("!") == 1
    assert lines["TCP retransmits"].endswith("9 !")
    assert "!" not in lines["net sent"]  # the same on every rank
    assert "1.00 MiB (1048576 B)" in lines["net sent"]
    assert text.splitlines()[-5].startswith("! stands out")
    assert "pid 102: /t/r2.json" in text


def test_the_fabric_track_in_the_evidence(tmp_path: Path) -> None:
    """What the fabric track's counters advanced between a collective's run-up and its end,
    and the interrupt time of its CPUs in the run-up (as the fabric track writes them)."""

    def counter(name: str, ts: float, args: dict[str, int]) -> dict[str, Any]:
        return {
            "ph": "C",
            "cat": "bpfdyno.fabric",
            "name": name,
            "pid": PID,
            "ts": ts,
            "args": args,
        }

    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans"}
    events = [
        {**span, "tid": "x", "ts": 1000.0, "dur": 1000.0},
        x("user_annotation", "gloo:all_reduce", 1200.0, 100.0, 99),
        counter("fabric cpu interrupt time (ns)", 1050.0, {"NET_RX": 300_000, "hardirq": 20_000}),
        counter("fabric cpu interrupt time (ns)", 1250.0, {"NET_RX": 7, "hardirq": 0}),
        counter(
            "fabric rdma mlx5_0:1 congestion", 1100.0, {"np_cnp_sent": 30, "port_xmit_wait": 70}
        ),
        counter("fabric rdma mlx5_0:1 errors", 1290.0, {"symbol_error": 2}),
        counter("fabric rdma mlx5_0:1 errors", 1400.0, {"symbol_error": 5}),  # after it
        counter("fabric nic eth2 drops", 1100.0, {"rx_dropped": 1}),
        x("bpfdyno.info", "bpfdyno kernel tracks", 1000.0, 1000.0, 5, {"tracks": ["fabric"]}),
    ]
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": events}))
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    assert ev.fabric_devices == ("nic eth2", "rdma mlx5_0:1")
    [c] = ev.collectives
    assert (c.fabric_congestion, c.fabric_errors) == (100, 3)
    assert {t.cause: t.seconds for t in c.before}["interrupts"] == pytest.approx(320e-6)


def test_blocked_inside_the_dataloader_is_waiting_for_its_workers(tmp_path: Path) -> None:
    """The main thread blocked (futex) inside enumerate(DataLoader): waiting for the workers'
    next batch; the part of the same block outside it stays a lock."""
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans"}
    loader = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
    blocked = {"tid": PID, "cause": "lock", "syscall": "futex"}
    events = [
        {**span, "tid": "x", "ts": 1000.0, "dur": 1000.0},
        x("user_annotation", loader, 1100.0, 300.0),
        x("bpfdyno.sched", "blocked: lock (futex)", 1050.0, 400.0, 2, blocked),
        x("user_annotation", "gloo:all_reduce", 1500.0, 100.0, 99),
        x("bpfdyno.info", "bpfdyno kernel tracks", 1000.0, 1000.0, 5, {"tracks": ["sched"]}),
    ]
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": events}))
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    [c] = ev.collectives
    before = {t.cause: t.seconds for t in c.before}
    # The rest of the 500 µs run-up the main thread ran (`on_cpu`).
    assert before == {
        "data_loader": pytest.approx(300e-6),
        "lock": pytest.approx(100e-6),
        "on_cpu": pytest.approx(100e-6),
    }
