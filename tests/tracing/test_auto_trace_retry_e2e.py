"""A timed automatic trace that one rank's Kineto dropped is taken again, on the real 4-rank
job (`straggler_job`): an agent with ``[detection] auto_trace`` and ``auto_trace_seconds``
watches the job; a CPU hog on rank 2's CPU makes it confirm rank 2 and trace the job's
ranks from one start time. The test stops rank 1 (SIGSTOP) across the tick that would begin
its warm-up, as a stalled trainer is: its Kineto drops the config (its log says so) and
never traces, so the first try has no window on rank 1. The agent then traces the job
again with a new common start, and the one ``traced`` event is the second try's: the
stalled rank's file among its files, the verdict over it, and a summary naming the first
try and who dropped it (`app/detection_trace.py`). Each try's parts are printed with their
states and reasons.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
from detection_job import (
    CLEAR_WITHIN_S,
    CONFIRM_WITHIN_S,
    RANKS,
    detection_job,
    wait_all_clear,
    watching,
    with_auto_trace,
)
from straggler_job import JOB_ID, StragglerJob

from bpfdyno.rpc.detection import DetectionKind
from bpfdyno.rpc.v1 import audit_pb2, audit_pb2_grpc, tracing_pb2, tracing_pb2_grpc

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

HOG_RANK = 2
#: Shares CPU 0 with ranks 0 and 3; stopped while the hog is on rank 2's CPU.
STALLED_RANK = 1
SECONDS = 3.0
#: Stopped from this long before the start for this long: across the tick that begins its
#: warm-up (5 s before the start), as in the job trace's own test (test_job_trace.py).
STALL_FROM_S, STALL_FOR_S = 8.5, 4.5
DROPPED = "Not starting tracing"
#: From the confirmation to the ``traced`` event of the second try: the first try's start
#: (12 s ahead), its failure (4 idle polls of the stalled rank after the start), the idle
#: wait, the second start (12 s ahead), the files and their summaries. A bound for
#: correctness, not speed, as in test_auto_trace_e2e.
TRACED_WITHIN_S = 300.0


@pytest.fixture(scope="module")
def job() -> Iterator[StragglerJob]:
    def auto_trace(j: StragglerJob, text: str) -> str:
        return with_auto_trace(j, text, f"auto_trace_seconds = {SECONDS}\n")

    with detection_job(edit=auto_trace) as j:
        yield j


def started_traces(job: StragglerJob) -> list[tuple[str, int]]:
    """(trace id, PROFILE_START_TIME in ms) of every trace the agent started of its own."""
    with job.agent.channel() as ch:
        records = (
            audit_pb2_grpc.AuditStub(ch)
            .ListAuditRecords(audit_pb2.ListAuditRecordsRequest(), timeout=10)
            .records
        )
    out = []
    for r in records:
        if (r.action, r.decision, r.transport) == ("start_trace", "accepted", "in-process"):
            config = json.loads(r.request_json)["config"]
            (start,) = [int(x.split("=")[1]) for x in config.split("\n") if "START_TIME=" in x]
            out.append((r.trace_id, start))
    return out


def parts(job: StragglerJob, trace_id: str) -> str:
    """Each process of a trace with its state and why, and the end of the agent's log: what
    a failure needs to say."""
    with job.agent.channel() as ch:
        view = tracing_pb2_grpc.TracingStub(ch).GetTrace(
            tracing_pb2.GetTraceRequest(trace_id=trace_id), timeout=10
        )
    lines = [f"pid {p.pid}: {tracing_pb2.ProcessTraceState.Name(p.state)}: {p.reason}"
             for p in view.processes]  # fmt: skip
    log = job.agent.log.read_text(errors="replace")[-4000:]
    return "\n".join([f"trace {trace_id}:", *lines, "--- agent.log:", log])


def drops(job: StragglerJob, rank: int) -> int:
    """How many times the rank's Kineto logged that it dropped a config."""
    return (job.base / f"rank-{rank}.out").read_text(errors="replace").count(DROPPED)


def test_a_rank_that_dropped_the_timed_config_has_the_job_traced_again(job: StragglerJob) -> None:
    stalled = job.rank_pids[STALLED_RANK]
    drops_before = drops(job, STALLED_RANK)
    with watching(job) as watcher:
        wait_all_clear(watcher, CLEAR_WITHIN_S)
        with job.cpu_hog(HOG_RANK):
            t0 = time.monotonic()
            watcher.wait(
                DetectionKind.CONFIRMED, t0, CONFIRM_WITHIN_S, "the confirmation", step=0.1
            )
            deadline = time.monotonic() + 10
            while not started_traces(job):
                assert time.monotonic() < deadline, job.diagnostics()
                time.sleep(0.1)
            ((first, first_start_ms),) = started_traces(job)
            stop_at = first_start_ms / 1000 - STALL_FROM_S
            assert time.time() < stop_at  # the plan leaves 12 s: time enough
            time.sleep(stop_at - time.time())
            os.kill(stalled, signal.SIGSTOP)
            try:
                time.sleep(STALL_FOR_S)
            finally:
                os.kill(stalled, signal.SIGCONT)
            watcher.wait(DetectionKind.TRACED, t0, TRACED_WITHIN_S, "the traced event", step=0.1)
        during = watcher.since(t0)
    (traced,) = [e for _, e in during if e.kind is DetectionKind.TRACED]
    print(traced.summary)
    assert drops(job, STALLED_RANK) - drops_before == 1, job.diagnostics()
    (first_id, first_start), (second, second_start) = started_traces(job)
    assert second_start > first_start
    why = parts(job, first_id) + "\n" + parts(job, second)
    print(why)
    assert traced.trace_id == second
    assert (traced.job_id, traced.rank) == (str(JOB_ID), HOG_RANK)
    v = traced.verdict
    assert v is not None, traced.summary
    files = traced.trace_files
    assert traced.summary == (
        f"job {JOB_ID} rank {HOG_RANK}: automatic trace {second} (try 2; trace {first}: "
        f"config dropped by pid {stalled}) of {len(files)} rank(s) on this node: verdict: "
        f"{v.headline}"
    ), why
    # The second try has a window on the stalled rank: what it was started for. Every rank
    # wrote its file in 10 of the 11 runs whose count was seen; in one full-suite run (before
    # the second try named the first one's processes too) one rank's file was missing, which
    # and why not recorded: each part's state and reason are printed now.
    assert any(f.endswith(f"_{stalled}.pt.trace.json") for f in files), why
    assert len(files) >= RANKS - 1, why
    assert all(os.path.exists(f) for f in files)
    assert STALLED_RANK in {t.rank for t in v.ranks}, traced.verdict_text
    assert "tracing the job again with a new start (try 2 of at most 2)" in (
        job.agent.log.read_text(errors="replace")
    )
