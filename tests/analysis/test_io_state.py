"""Disk reads are not socket waits: the task's state before the system call decides.

A buffered read(2) that waits for a throttled disk sleeps uninterruptibly (state D); a read
on a socket or pipe sleeps interruptibly (S). The capture writes the state with every
blocked slice; the reader names the first "disk or file I/O", the second a socket wait —
also in files written before the capture decided by state first (their D reads say
"io wait").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.tracing.capture import causes

PID = 41
BASE_NS = 1_700_000_000_000_000_000
READ = 0  # x86-64 read(2)


def trace(tmp_path: Path, state: str, cause: str) -> str:
    """A rank's file: 5 gloo all-reduces 200 ms apart, its main thread blocked in read(2)
    for the 50 ms before each, in ``state`` (the slice named as the capture names it)."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 0.0, "dur": 1_000_000.0},
        {"ph": "X", "cat": "bpfdyno.info", "name": "bpfdyno kernel tracks", "pid": PID,
         "tid": 1_000_000_000, "ts": 0.0, "dur": 1_000_000.0, "args": {"tracks": ["sched"]}},
    ]  # fmt: skip
    for i in range(5):
        at = 100_000.0 + i * 200_000
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": PID,
             "tid": 7, "ts": at, "dur": 10_000.0, "args": {}}
        )  # fmt: skip
        events.append(
            {"ph": "X", "cat": "bpfdyno.sched", "name": f"blocked: {cause} (read)", "pid": PID,
             "tid": 1_000_000_001, "ts": at - 60_000, "dur": 50_000.0,
             "args": {"tid": PID, "cpu": 0, "state": state, "cause": cause, "syscall": "read"}}
        )  # fmt: skip
    path = tmp_path / f"{state}.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE_NS, "traceEvents": events}))
    return str(path)


@pytest.mark.parametrize(
    ("state", "written_as", "summary_cause", "evidence_cause"),
    [
        ("D", causes.cause(0x2, READ), "disk/uninterruptible", "disk"),
        ("D", "io wait", "disk/uninterruptible", "disk"),  # a file written before the fix
        ("S", causes.cause(0x1, READ), "io wait", "io_wait"),
    ],
)
def test_a_read_is_named_by_the_state_it_slept_in(
    tmp_path: Path, state: str, written_as: str, summary_cause: str, evidence_cause: str
) -> None:
    s = summarize_file(trace(tmp_path, state, written_as))
    assert s.blocked_seconds_by_cause == {summary_cause: pytest.approx(0.25)}
    assert s.evidence is not None
    for c in s.evidence.collectives:
        assert [(t.cause, t.seconds, t.detail) for t in c.before if t.cause != "on_cpu"] == [
            (evidence_cause, pytest.approx(0.05), "read")
        ]
    # The rest of each run-up the main thread ran (from the window's start, then from the
    # previous arrival 200 ms before).
    assert [t.seconds for c in s.evidence.collectives for t in c.before if t.cause == "on_cpu"] == [
        pytest.approx(0.05),
        *[pytest.approx(0.15)] * 4,
    ]


def test_the_capture_names_an_uninterruptible_read_a_disk_wait() -> None:
    assert causes.cause(0x2, READ) == causes.UNINTERRUPTIBLE  # D: a disk or a page
    assert causes.cause(0x102, READ) == causes.UNINTERRUPTIBLE  # killable (D) too
    assert causes.cause(0x1, READ) == causes.IO_WAIT  # S: a socket or pipe
    assert causes.cause(0x1, 202) == causes.LOCK


def test_interrupt_time_is_taken_out_of_the_time_on_a_cpu(tmp_path: Path) -> None:
    """The same file with 20 ms of interrupt time on the rank's CPUs in each run-up (the
    fabric track's counter, written at the interval's start): a cause of its own, the part
    of it that fell while the main thread ran (it did not delay the thread while it slept),
    and not the main thread's own work too."""
    path = Path(trace(tmp_path, "S", causes.cause(0x1, READ)))
    doc = json.loads(path.read_text())
    for i in range(5):
        doc["traceEvents"].append(
            {"ph": "C", "cat": "bpfdyno.fabric", "name": "fabric cpu interrupt time (ns)",
             "pid": PID, "ts": 100_000.0 + i * 200_000 - 80_000, "args": {"NET_RX": 20_000_000}}
        )  # fmt: skip
    path.write_text(json.dumps(doc))
    s = summarize_file(str(path))
    assert s.evidence is not None
    by_cause = [{t.cause: t.seconds for t in c.before} for c in s.evidence.collectives]
    # Of the 20 ms, the share that fell while the main thread ran: it was on a CPU 50 of the
    # first run-up's 100 ms (from the window's start), then 150 of each 200 ms run-up.
    assert [c["interrupts"] for c in by_cause] == [
        pytest.approx(0.01),
        *[pytest.approx(0.015)] * 4,
    ]
    assert [c["on_cpu"] for c in by_cause] == [pytest.approx(0.04), *[pytest.approx(0.135)] * 4]
