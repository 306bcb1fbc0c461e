"""A file whose kernel tracks began after Kineto's window did (its config went out before the
probes were attached): the time before the recording is unknown, not time spent running."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.tracing.capture.records import KernelTrackRequest, ProcessCapture, Track
from bpfdyno.tracing.kernel_tracks import merge_capture
from bpfdyno.tracing.traces import KernelTrackState, PartRef

PID = 77
BASE_NS = 1_700_000_000_000_000_000
LATE_NOTE_TAIL = (
    "(their recording began after the profiler): a run-up before then has no measure of its "
    "time on a CPU"
)


def x(cat: str, name: str, ts: float, dur: float, row: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": row, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def write(path: Path, late_us: float | None) -> None:
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans"}
    info: dict[str, Any] = {"tracks": ["sched"]}
    if late_us is not None:
        info["capture_late_us"] = late_us
    blocked = {"tid": PID, "cause": "lock", "syscall": "futex"}
    events = [
        {**span, "tid": "x", "ts": 1000.0, "dur": 4000.0},
        x("user_annotation", "gloo:all_reduce", 1500.0, 100.0, 99, {}),  # run-up 1000-1500
        x("user_annotation", "gloo:all_reduce", 3500.0, 100.0, 99, {}),  # run-up 1500-3500
        x("user_annotation", "gloo:all_reduce", 4500.0, 100.0, 99, {}),  # run-up 3500-4500
        x("bpfdyno.sched", "blocked: lock (futex)", 3700.0, 200.0, 2, blocked),
        x("bpfdyno.info", "bpfdyno kernel tracks", 1000.0, 4000.0, 5, info),
    ]
    path.write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": events}))


@pytest.mark.parametrize(
    ("late_us", "measured"),
    [
        # The recording began 2 ms into the window (at 3000): only the third run-up is in it.
        (2000.0, [False, False, True]),
        # It began with the window: every run-up's time on a CPU is measured.
        (None, [True, True, True]),
    ],
)
def test_a_run_up_before_the_recording_began_has_no_time_on_a_cpu(
    tmp_path: Path, late_us: float | None, measured: list[bool]
) -> None:
    path = tmp_path / "late.json"
    write(path, late_us)
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    on_cpu = [{t.cause: t.seconds for t in c.before}.get("on_cpu") for c in ev.collectives]
    expected = [
        pytest.approx(500e-6),  # 1000-1500: no slice, all of it running
        pytest.approx(2000e-6),  # 1500-3500: from the previous arrival, all of it running
        pytest.approx(800e-6),  # 3500-4500 less its 200 µs block
    ]
    assert on_cpu == [e if m else None for e, m in zip(expected, measured, strict=True)]
    late_notes = [n for n in ev.notes if n.startswith("the kernel tracks begin")]
    if late_us is None:
        assert late_notes == []
    else:
        assert late_notes == [f"the kernel tracks begin 0.002 s into the window {LATE_NOTE_TAIL}"]


def kineto_file(path: Path) -> None:
    """A trace as Kineto writes it: its profiler's span from 1 s to 4 s after the base."""
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
            "tid": "PyTorch Profiler", "ts": 1e6, "dur": 3e6, "args": {}}  # fmt: skip
    op = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": PID,
          "ts": 2_000_000.0, "dur": 10.0, "args": {}}  # fmt: skip
    end = {"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "",
           "ts": 4_000_000.0}  # fmt: skip
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": BASE_NS, "traceEvents": [span, op, end],
           "traceName": str(path)}  # fmt: skip
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("begin_s", "note"),
    [
        (
            2.5,
            "recording began 1.50 s into the trace's 3.00 s window (its config went out before "
            "the probes were attached): the tracks cover only the rest",
        ),
        (0.5, ""),  # recording before the window: the whole window is covered
    ],
)
def test_a_merge_says_when_the_recording_began_inside_the_window(
    tmp_path: Path, begin_s: float, note: str
) -> None:
    path = tmp_path / "rank0.json"
    kineto_file(path)
    request = KernelTrackRequest(frozenset({Track.SCHED}), 0.0)
    # CLOCK_MONOTONIC is the base time here (offset = base): a monotonic ns is relative ns.
    capture = ProcessCapture(
        PID, request, int(begin_s * 1e9), 4_100_000_000, BASE_NS, BASE_NS, 0, [], {}, 0, 100
    )
    status = merge_capture(PartRef("t", b"a", PID, str(path), request), capture)
    assert status.state is KernelTrackState.MERGED
    assert status.reason == note
    [info] = [
        e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "bpfdyno.info"
    ]
    late = info["args"].get("capture_late_us")
    assert late == (1_500_000.0 if note else None)
    # What the analysis then reads from the file says so too.
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    said = [n for n in ev.notes if n.startswith("the kernel tracks begin")]
    assert said == (
        [f"the kernel tracks begin 1.500 s into the window {LATE_NOTE_TAIL}"] if note else []
    )
