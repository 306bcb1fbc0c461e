"""Tracing API messages -> the UI's records. Translation only.

Requests go the other way through the API's own mapping, `bpfdyno.rpc.traces.spec_to_pb`.
"""

from __future__ import annotations

from bpfdyno.rpc.kernel_tracks import describe_kernel_tracks
from bpfdyno.rpc.v1 import tracing_pb2
from bpfdyno.tui.records import TraceProcess, TraceStatus, TrainerInfo

_TRAINER_STATE = {
    tracing_pb2.TRAINER_STATE_IDLE: "idle",
    tracing_pb2.TRAINER_STATE_CONFIG_PENDING: "config pending",
    tracing_pb2.TRAINER_STATE_TRACING: "tracing",
}
_ROLE = {
    tracing_pb2.TRAINER_ROLE_WORKER: "worker",
    tracing_pb2.TRAINER_ROLE_LAUNCHER: "launcher",
    tracing_pb2.TRAINER_ROLE_DATA_WORKER: "data worker",
}
_PROCESS_STATE = {
    tracing_pb2.PROCESS_TRACE_STATE_PENDING: "pending",
    tracing_pb2.PROCESS_TRACE_STATE_DELIVERED: "delivered",
    tracing_pb2.PROCESS_TRACE_STATE_TRACING: "tracing",
    tracing_pb2.PROCESS_TRACE_STATE_MERGING: "merging",
    tracing_pb2.PROCESS_TRACE_STATE_WRITTEN: "written",
    tracing_pb2.PROCESS_TRACE_STATE_FAILED: "failed",
    tracing_pb2.PROCESS_TRACE_STATE_TIMED_OUT: "timed out",
}
#: Per-process states after which nothing changes any more.
FINAL_STATES = frozenset({"written", "failed", "timed out"})


def _job(job_id: int) -> str:
    """The API's 0 means "no job"."""
    return str(job_id) if job_id else ""


def trainer_from_pb(t: tracing_pb2.Trainer) -> TrainerInfo:
    """One registered trainer."""
    return TrainerInfo(
        pid=t.pid,
        job_id=_job(t.job_id),
        state=_TRAINER_STATE.get(t.state, "unknown"),
        first_seen_ts=t.first_poll_unix_seconds,
        last_poll_ts=t.last_poll_unix_seconds,
        ancestors=tuple(t.ancestors),
        trace_id=t.trace_id,
        role=_ROLE.get(t.role, ""),
    )


def started_from_pb(resp: tracing_pb2.StartTraceResponse) -> TraceStatus:
    """What StartTrace answered: who was triggered (and where each file will be), who not.

    When nothing was triggered, every registered trainer is listed with why it did not
    match, so the user can correct the request.
    """
    procs = [TraceProcess(p.pid, "pending", path=p.output_path) for p in resp.triggered]
    procs += [TraceProcess(p.pid, "busy", message=p.reason) for p in resp.busy]
    procs += [TraceProcess(p.pid, "over limit", message=p.reason) for p in resp.over_limit]
    if not resp.triggered:
        procs += [TraceProcess(p.pid, "not matched", message=p.reason) for p in resp.not_matched]
    counts = [f"{len(resp.triggered)} triggered"]
    if resp.busy:
        counts.append(f"{len(resp.busy)} busy")
    if resp.over_limit:
        counts.append(f"{len(resp.over_limit)} over the process limit")
    if not resp.triggered:
        counts.append(
            "no registered process matched"
            if not resp.processes_matched
            else "every matching process is busy or over the limit"
        )
    return TraceStatus(
        trace_id=resp.trace_id,
        state="started" if resp.triggered else "nothing traced",
        processes=tuple(procs),
        message=", ".join(counts),
        finished=not resp.triggered,
    )


def trace_from_pb(st: tracing_pb2.TraceStatus) -> TraceStatus:
    """A followed trace's state, per process."""
    procs = tuple(
        TraceProcess(
            pid=p.pid,
            state=_PROCESS_STATE.get(p.state, "unknown"),
            path=p.output_path,
            size_bytes=p.size_bytes if p.size_bytes >= 0 else None,
            message=p.reason,
            kernel_tracks=describe_kernel_tracks(p.kernel_tracks),
        )
        for p in st.processes
    )
    written = sum(p.state == "written" for p in procs)
    failed = sum(p.state in ("failed", "timed out") for p in procs)
    running = len(procs) - written - failed
    if st.done:
        state = "done" if written and not failed else ("failed" if not written else "partly done")
    else:
        state = "running"
    parts = [f"{written} written"]
    if failed:
        parts.append(f"{failed} failed")
    if running:
        parts.append(f"{running} in progress")
    return TraceStatus(
        trace_id=st.trace_id,
        state=state,
        processes=procs,
        message=", ".join(parts),
        finished=st.done,
    )
