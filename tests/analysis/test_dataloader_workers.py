"""Waiting for whom, one level: a main thread waiting for its DataLoader workers says what
the workers waited for. The capture's records of the traced process and of its child
processes go through the writer (`build_tracks`) into a file, the reader makes the evidence;
then the verdict says it for a late rank. Every time here is known, so every number is."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import CauseTime, CollectiveEvidence, RankEvidence
from bpfdyno.tracing.capture.records import KernelTrackRequest, OffCpu, ProcessCapture, Track
from bpfdyno.tracing.capture.tracks import Window, build_tracks

PID, WORKER, IDLE_WORKER, WATCHDOG, HOG = 41, 50, 51, 60, 99
BASE = 1_700_000_000_000_000_000
MS = 1_000_000
STEP_MS, STEPS = 250, 4
CLOCK_NANOSLEEP, FUTEX, POLL, READ = 230, 202, 7, 0
S, D = 1, 2  # task states: interruptible, uninterruptible


def step_records(i: int) -> list[OffCpu]:
    """Step i: the main thread waits 95 ms in poll(2) for its worker's batch, woken by the
    worker; meanwhile the worker sleeps (77 ms of it while the main thread waits) then waits
    5 ms for a CPU the hog holds, and a second thread of it waits 10 ms for the disk while the
    first sleeps (and 1 ms before the main thread waits); what
    must not count: its feeder thread's futex wait (woken by its own process), the idle
    worker's wait for the main process's next index (woken by it), the worker's sleep after
    the main thread stopped waiting, and another child of the trainer that sleeps (a
    watchdog: it never hands the main thread anything)."""
    t = i * STEP_MS * MS

    def iv(tid: int, pid: int, off: int, on: int, state: int, sc: int, **kw: Any) -> OffCpu:
        comm = "python" if pid == PID else "pt_data_worker"
        wake = t + on * MS if state else 0
        child = 0 if pid == PID else pid  # the traced process's own threads: 0
        return OffCpu(tid, comm, t + off * MS, wake, t + on * MS, state, sc, 0, pid=child, **kw)

    return [
        iv(PID, PID, 5, 100, S, POLL, waker_pid=WORKER, waker_tid=WORKER + 2),
        iv(WORKER, WORKER, 2, 82, S, CLOCK_NANOSLEEP),  # a timer woke it: no waker seen
        iv(WORKER, WORKER, 82, 87, 0, -1, held_pid=HOG, held_tid=HOG, held_comm="hog"),
        iv(WORKER + 3, WORKER, 3, 4, D, READ),
        iv(WORKER + 2, WORKER, 0, 98, S, FUTEX, waker_pid=WORKER, waker_tid=WORKER),
        iv(WORKER + 3, WORKER, 20, 30, D, READ),
        iv(IDLE_WORKER, IDLE_WORKER, 0, 100, S, READ, waker_pid=PID, waker_tid=PID + 1),
        iv(WORKER, WORKER, 120, 140, S, CLOCK_NANOSLEEP),
        iv(WATCHDOG, WATCHDOG, 0, 240, S, CLOCK_NANOSLEEP),
    ]


def trace_file(tmp_path: Path, file_pid: int = PID) -> Path:
    """The trace; ``file_pid``: the pid the file names the process by (1: a container's
    trainer, whose sched track still has the host's ids)."""
    records = [r for i in range(STEPS) for r in step_records(i)]
    end_ns = STEPS * STEP_MS * MS
    capture = ProcessCapture(
        pid=file_pid,
        host_pid=PID if file_pid != PID else 0,
        request=KernelTrackRequest(frozenset({Track.SCHED}), 0.0),
        begin_ns=0,
        end_ns=end_ns,
        begin_wall_ns=BASE,
        offset_ns=BASE,  # monotonic ns + offset = wall ns; the base is the same: ts = ns
        drift_ns=0,
        records=records,
        stats={},
        dropped_over_cap=0,
        cap=0,
        settings={},
    )
    built = build_tracks(capture, BASE, Window(0, end_ns, "kineto"), [Track.SCHED])
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 0.0, "dur": end_ns / 1000},
    ]  # fmt: skip
    for i in range(STEPS):
        t = i * STEP_MS * 1000.0  # µs
        events += [
            {"ph": "X", "cat": "user_annotation", "pid": file_pid, "tid": file_pid, "ts": t,
             "dur": 100e3, "name": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": file_pid,
             "tid": 7, "ts": t + 150e3, "dur": 10e3, "args": {}},
        ]  # fmt: skip
    events += [json.loads(e) for e in built.events]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": events}))
    return path


def test_the_worker_rows_name_the_child_and_who_woke_the_main_thread(tmp_path: Path) -> None:
    events = json.loads(trace_file(tmp_path).read_text())["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    main_wait = next(e for e in events if e.get("name") == "blocked: io wait (poll)")
    assert names[main_wait["tid"]] == f"kernel sched: thread {PID} (python)"
    assert (main_wait["args"]["woken_by_pid"], main_wait["args"]["woken_by_tid"]) == (
        WORKER,
        WORKER + 2,
    )
    assert "child_pid" not in main_wait["args"]
    sleep = next(e for e in events if e.get("name") == "blocked: sleep (clock_nanosleep)")
    assert names[sleep["tid"]] == f"kernel sched: child process {WORKER} thread {WORKER} " + (
        "(pt_data_worker)"
    )
    assert sleep["args"]["child_pid"] == WORKER and "woken_by_pid" not in sleep["args"]


@pytest.mark.parametrize("file_pid", [PID, 1])
def test_the_evidence_says_what_the_workers_waited_for_while_the_main_thread_waited(
    tmp_path: Path, file_pid: int
) -> None:
    """The same whether the file names the process by the host's pid or, for a trainer in a
    container, by its own (1), the sched track's ids being the host's either way."""
    summary = summarize_file(str(trace_file(tmp_path, file_pid)))
    ev = summary.evidence
    assert ev is not None and len(ev.collectives) == STEPS and ev.pid == file_pid
    # The process's own table: its main thread's time, not its children's.
    assert summary.offcpu_threads == 1
    assert summary.blocked_seconds_by_cause == {"io wait": pytest.approx(STEPS * 0.095)}
    for i, c in enumerate(ev.collectives):
        # The rest of each run-up is the main thread on a CPU (the first starts with the window).
        ran = 0.055 if i == 0 else 0.155
        assert {t.cause: (t.seconds, t.detail) for t in c.before} == {
            "data_loader": (pytest.approx(0.095), "poll"),
            "on_cpu": (pytest.approx(ran), ""),
        }
        assert c.workers == (
            CauseTime("sleep", 0.077, "clock_nanosleep"),
            CauseTime("disk", 0.01, "read"),
            CauseTime("cpu_wait", 0.005, f"held by hog (pid {HOG})"),
        )
        assert c.worker_pids == (WORKER,)


T0 = 1_800_000_000_000_000_000


def collective(i: int, arrival_ms: float, late_rank: bool) -> CollectiveEvidence:
    workers = (
        (CauseTime("sleep", 0.07, "clock_nanosleep"), CauseTime("cpu_wait", 0.005, "held by hog"))
        if late_rank
        else ()
    )
    return CollectiveEvidence(
        op="allreduce",
        source="gloo",
        group="gloo",
        index=i,
        step=i,
        size_bytes=4096,
        arrival_unix_ns=T0 + round(arrival_ms * 1e6),
        end_unix_ns=T0 + round((i * 200 + 185) * 1e6),
        before=(CauseTime("data_loader", 0.08 if late_rank else 0.0, "poll"),),
        workers=workers,
        worker_pids=(WORKER,) if late_rank else (),
    )


def rank(r: int) -> RankEvidence:
    late = r == 2
    cs = [collective(i, i * 200 + (180 if late else 100), late) for i in range(10)]
    return RankEvidence(
        path=f"/t/r{r}.json",
        host="node",
        pid=100 + r,
        rank=r,
        world_size=4,
        window_start_unix_ns=T0 - 200 * MS,
        window_end_unix_ns=T0 + 2200 * MS,
        collectives=tuple(cs),
        kernel_tracks=("net", "sched"),
    )


def test_the_verdict_says_which_workers_and_what_they_waited_for() -> None:
    [f] = compare([rank(r) for r in range(4)]).stragglers
    assert (f.rank, f.kind) == (2, "late")
    assert f.causes[0].cause == "data_loader"
    assert f.causes[0].detail == (
        f"pid {WORKER}, which was sleeping for 700.0 ms (clock_nanosleep), "
        "waiting for a CPU for 50.0 ms (held by hog) of the 800.0 ms it waited for them"
    )
    assert (
        f"waiting for DataLoader workers {f.causes[0].seconds * 1e3:.1f} ms (pid {WORKER}, which "
        "was sleeping for 700.0 ms" in f.summary
    )


def test_without_workers_recorded_the_main_thread_s_system_call_is_said() -> None:
    ranks = [rank(r) for r in range(4)]
    bare = tuple(replace(c, workers=(), worker_pids=()) for c in ranks[2].collectives)
    ranks[2] = replace(ranks[2], collectives=bare)
    [f] = compare(ranks).stragglers
    assert (f.causes[0].cause, f.causes[0].detail) == ("data_loader", "poll")


def test_two_workers_are_named_both() -> None:
    ranks = [rank(r) for r in range(4)]
    both = tuple(replace(c, worker_pids=(WORKER, IDLE_WORKER)) for c in ranks[2].collectives)
    ranks[2] = replace(ranks[2], collectives=both)
    [f] = compare(ranks).stragglers
    assert f.causes[0].detail.startswith(f"pid {WORKER}, {IDLE_WORKER}, which were sleeping for ")
