"""The wait for a CPU right after a disk read is the disk's.

A thread that sleeps on the disk (state D) is woken by the read's completion and then waits
on the run queue until its CPU is free: the sched track writes ``blocked: disk`` then
``runnable: woken`` (with the state of the sleep it followed). On a loaded machine a rank
that reads 100-300 samples a step from the disk spends as long in those wake-up waits as in
the reads; counted as "waiting for a CPU held by" whoever ran, they outranked the disk and
named the wrong tasks. The files here are the sched track as the capture writes it, with
known times: the evidence and the verdict must count each wake-up wait after a disk read
with the disk, and keep a wake-up wait after any other sleep, and a preemption, as a wait
for a CPU held by the task that ran.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence

PID = 41
BASE_NS = 1_700_000_000_000_000_000
ROW = 1_000_000_001
STEPS = 5
STEP_US = 200_000.0
READ_US = 30_000.0  # asleep on the disk before each collective
WOKEN_US = 40_000.0  # then runnable, the CPU held by another task
PREEMPTED_US = 5_000.0  # and once preempted by it
HOG = {"held_by_pid": 900, "held_by_tid": 900, "held_by_comm": "stress"}


def sched(ts: float, dur: float, name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"ph": "X", "cat": "bpfdyno.sched", "name": name, "pid": PID, "tid": ROW,
            "ts": ts, "dur": dur, "args": {"tid": PID, "cpu": 0, **args}}  # fmt: skip


def rank_file(
    path: Path,
    rank: int,
    world: int,
    late_us: float,
    before_each: Callable[[float], list[dict[str, Any]]],
) -> str:
    """Write a rank's file at ``path``: 5 gloo all-reduces 200 ms apart (arriving ``late_us``
    after the others, all ending together), its sched slices before each from
    ``before_each(arrival)``."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 0.0, "dur": 1_100_000.0},
        {"ph": "X", "cat": "bpfdyno.info", "name": "bpfdyno kernel tracks", "pid": PID,
         "tid": 1_000_000_000, "ts": 0.0, "dur": 1_100_000.0, "args": {"tracks": ["sched"]}},
    ]  # fmt: skip
    for i in range(STEPS):
        end = 150_000.0 + i * STEP_US
        at = end - 40_000 + late_us
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": PID,
             "tid": 7, "ts": at, "dur": end - at, "args": {}}
        )  # fmt: skip
        events += before_each(at)
    doc = {"baseTimeNanoseconds": BASE_NS, "traceEvents": events,
           "distributedInfo": {"rank": rank, "world_size": world}}  # fmt: skip
    path.write_text(json.dumps(doc))
    return str(path)


def trace(
    tmp_path: Path, rank: int = 0, late_us: float = 0.0, slept: str = "D", world: int = 1
) -> str:
    """A rank's file (`rank_file`). With ``late_us``, before each collective: asleep
    ``READ_US`` in ``slept`` (D: pread64 on the disk; S: a pipe read), then ``WOKEN_US``
    runnable after the wakeup, then running, then ``PREEMPTED_US`` runnable, preempted; the
    CPU held by ``stress``. Without: 1 ms asleep before each."""
    cause, syscall = ("disk/uninterruptible", "pread64") if slept == "D" else ("io wait", "read")

    def before(at: float) -> list[dict[str, Any]]:
        if not late_us:  # 1 ms asleep: a healthy rank, seen running the rest of the time
            return [
                sched(at - 20_000, 1_000.0, "blocked: sleep (clock_nanosleep)",
                      {"state": "S", "cause": "sleep", "syscall": "clock_nanosleep"})
            ]  # fmt: skip
        read = at - 100_000
        return [
            sched(read, READ_US, f"blocked: {cause} ({syscall})",
                  {"state": slept, "cause": cause, "syscall": syscall}),
            sched(read + READ_US, WOKEN_US, "runnable: woken",
                  {"state": slept, "cause": "runnable", "after": cause, **HOG}),
            sched(at - 10_000, PREEMPTED_US, "runnable: preempted",
                  {"state": "R", "cause": "runnable", **HOG}),
        ]  # fmt: skip

    return rank_file(tmp_path / f"r{rank}-{slept}.json", rank, world, late_us, before)


def evidence(path: str) -> RankEvidence:
    s = summarize_file(path)
    assert s.error == "" and s.evidence is not None
    return s.evidence


def test_a_wait_for_a_cpu_after_a_disk_read_counts_with_the_disk(tmp_path: Path) -> None:
    ev = evidence(trace(tmp_path, late_us=1.0))
    for c in ev.collectives:
        off = {t.cause: (t.seconds, t.detail) for t in c.before if t.cause != "on_cpu"}
        assert off == {
            "disk": (pytest.approx((READ_US + WOKEN_US) / 1e6), "pread64"),
            "cpu_wait": (pytest.approx(PREEMPTED_US / 1e6), ""),
        }
        # Only the preemption names a task holding the CPU.
        assert [(h.cause, h.seconds) for h in c.holders] == [
            ("stress (pid 900)", pytest.approx(PREEMPTED_US / 1e6))
        ]


def test_a_wait_for_a_cpu_after_any_other_sleep_stays_a_wait_for_a_cpu(tmp_path: Path) -> None:
    ev = evidence(trace(tmp_path, late_us=1.0, slept="S"))
    for c in ev.collectives:
        off = {t.cause: (t.seconds, t.detail) for t in c.before if t.cause != "on_cpu"}
        assert off == {
            "cpu_wait": (pytest.approx((WOKEN_US + PREEMPTED_US) / 1e6), ""),
            "io_wait": (pytest.approx(READ_US / 1e6), "read"),
        }
        assert [(h.cause, h.seconds) for h in c.holders] == [
            ("stress (pid 900)", pytest.approx((WOKEN_US + PREEMPTED_US) / 1e6))
        ]


def test_a_rank_late_for_its_disk_reads_is_named_for_the_disk(tmp_path: Path) -> None:
    """Rank 3 reads from the disk before each collective and arrives 75 ms after the
    others; its wake-up waits (40 ms) are longer than its reads (30 ms), as under load. The
    first cause is the disk with the reads and their wake-up waits; the preemptions (5 ms
    each) stay a wait for the CPU held by ``stress``."""
    late = READ_US + WOKEN_US + PREEMPTED_US
    ranks = [evidence(trace(tmp_path, r, late if r == 3 else 0.0, world=4)) for r in range(4)]
    v = compare(ranks)
    assert [(f.rank, f.kind) for f in v.stragglers] == [(3, "late")]
    f = v.stragglers[0]
    assert f.seconds == pytest.approx(STEPS * late / 1e6)
    assert [(c.cause, c.seconds) for c in f.causes] == [
        ("disk", pytest.approx(STEPS * (READ_US + WOKEN_US) / 1e6)),
        ("cpu_wait", pytest.approx(STEPS * PREEMPTED_US / 1e6)),
    ]
    assert f.causes[0].detail == "pread64"
    assert f.causes[1].detail == "the CPU was held by stress (pid 900) 100%"
