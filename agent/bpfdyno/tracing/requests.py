"""Trace requests and their outcome: the request, the result, and matching.

Pure data and pure functions: `match_trainers` decides, from the registered trainers and
what the tracker says of them, who is triggered, who is busy and who is left out, and why;
`TracingService` applies the outcome.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.identity import Requester
from bpfdyno.rpc.traces import DEFAULT_PROCESS_LIMIT, SkippedProcess, TraceSpec, TriggeredProcess
from bpfdyno.tracing.capture.records import KernelTrackRequest, Track
from bpfdyno.tracing.config_text import CheckedConfig
from bpfdyno.tracing.ipc.wire import MAX_PID
from bpfdyno.tracing.paths import default_output_path, kineto_output_path, memory_snapshot_path
from bpfdyno.tracing.policy import ownership_problem
from bpfdyno.tracing.roles import Role
from bpfdyno.tracing.traces import OpenPart, ProcState
from bpfdyno.tracing.trainers import Trainer

MAX_REQUEST_PIDS = 1024


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """A trace request: who (job id and/or pids), how many, and what (options or raw text).

    Attributes:
        job_id: the SLURM job id to trace (0: processes without one, or any job when explicit
            pids are given).
        pids: pids to match (own pid or an ancestor); empty or ``(0,)`` = the whole job.
        process_limit: most processes to trigger.
        options: the profiler options of the API's request (gRPC, CLI: its log file, duration
            or iterations, start, switches); exactly one of ``options`` / ``config``.
        config: raw Kineto config text (the legacy RPC).
        timeout_s: how long to follow the trace; 0 = the configured default.
        kernel_tracks: names of the kernel tracks to merge into each file (see
            `bpfdyno.rpc.kernel_tracks`); None = ``[capture] default_tracks``.
        pre_window_s: seconds of rare network events before the request to add; None =
            ``[capture] pre_window_s``.
    """

    job_id: int = 0
    pids: tuple[int, ...] = ()
    process_limit: int = DEFAULT_PROCESS_LIMIT
    options: TraceSpec | None = None
    config: str | None = None
    timeout_s: float = 0.0
    kernel_tracks: tuple[str, ...] | None = None
    pre_window_s: float | None = None


@dataclass(frozen=True, slots=True)
class TraceStartResult:
    """What a trace request did.

    Attributes:
        trace_id: the id written into every triggered process's trace as ``trace_id``.
        matched: pids of every matching process, in the order they were considered.
        triggered: the processes handed the config, with their real output files.
        busy: matched processes skipped because they hold a config or are tracing.
        over_limit: matched processes skipped because the process limit was reached.
        not_matched: every other registered process, with why it did not match.
        config_text: the config handed out (without the trace id line).
    """

    trace_id: str
    matched: tuple[int, ...]
    triggered: tuple[TriggeredProcess, ...]
    busy: tuple[SkippedProcess, ...]
    over_limit: tuple[SkippedProcess, ...]
    not_matched: tuple[SkippedProcess, ...]
    config_text: str

    @property
    def processes_matched(self) -> tuple[int, ...]:
        """``matched`` by its name in the API (`bpfdyno.rpc.traces.TraceStart`)."""
        return self.matched


#: What the "over the process limit" reason adds for each role.
ROLE_NOTE = {
    Role.WORKER: "",
    Role.LAUNCHER: " (a launcher of other trainers, so it came after them)",
    Role.DATA_WORKER: " (a DataLoader worker, so it came last)",
}


def check_request_shape(req: TraceRequest) -> None:
    """Reject out-of-range fields before anything is matched.

    Raises:
        InvalidArgument: naming the field's rule.
    """
    if (req.options is None) == (req.config is None):
        raise InvalidArgument("give either trace options or a config text", rule="bad_request")
    if req.job_id < 0:
        raise InvalidArgument(f"job id {req.job_id} is negative", rule="bad_job_id")
    if len(req.pids) > MAX_REQUEST_PIDS:
        raise InvalidArgument(
            f"{len(req.pids)} pids; at most {MAX_REQUEST_PIDS}", rule="too_many_pids"
        )
    for p in req.pids:
        if not 0 <= p <= MAX_PID:
            raise InvalidArgument(f"pid {p} is outside 0..{MAX_PID}", rule="bad_pid")
    if req.process_limit < 0:
        raise InvalidArgument(f"process limit {req.process_limit} < 0", rule="bad_process_limit")
    if req.timeout_s < 0:
        raise InvalidArgument(f"timeout {req.timeout_s} s is negative", rule="bad_timeout")


#: Longest pre-window a request may ask for (the flight recorder keeps minutes at most).
MAX_PRE_WINDOW_S = 3600.0


def kernel_track_request(req: TraceRequest, default: KernelTrackRequest) -> KernelTrackRequest:
    """The kernel tracks ``req`` asks for, its unset parts taken from ``default``.

    Raises:
        InvalidArgument: an unknown track name or a pre-window outside 0..`MAX_PRE_WINDOW_S`.
    """
    tracks = default.tracks
    if req.kernel_tracks is not None:
        known = {t.value: t for t in Track}
        unknown = [n for n in req.kernel_tracks if n not in known]
        if unknown:
            raise InvalidArgument(
                f"unknown kernel track(s) {', '.join(unknown)}; name some of "
                f"{', '.join(known)}, or all, or none",
                rule="bad_kernel_tracks",
            )
        tracks = frozenset(known[n] for n in req.kernel_tracks)
    pre = default.pre_window_s if req.pre_window_s is None else req.pre_window_s
    if not 0 <= pre <= MAX_PRE_WINDOW_S:
        raise InvalidArgument(
            f"the pre-window must be 0..{MAX_PRE_WINDOW_S:g} seconds, got {pre:g}",
            rule="bad_pre_window",
        )
    return KernelTrackRequest(tracks, pre)


def _all_pids(pids: tuple[int, ...]) -> bool:
    return not pids or pids == (0,)


def mismatch(t: Trainer, req: TraceRequest) -> str:
    """Why trainer ``t`` does not match ``req`` ("" when it does)."""
    if _all_pids(req.pids):
        if t.job_id == req.job_id:
            return ""
        hint = f"; pass --job-id {t.job_id} to trace it" if t.job_id else ""
        return f"its job id is {t.job_id}, the request asked for job {req.job_id}{hint}"
    wanted = set(req.pids)
    # Its pid here (a container's trainer: the one ps shows) selects it as well.
    if not wanted.intersection(t.pids) and not (t.host_pid and t.host_pid in wanted):
        return (
            f"neither its pid {t.pid} nor its ancestors {list(t.ancestors)} are among the "
            f"requested pids"
        )
    if req.job_id and t.job_id != req.job_id:
        return f"its job id is {t.job_id}, the request asked for job {req.job_id}"
    return ""


def busy_reason(part: OpenPart | None) -> str:
    """Why a matched trainer cannot take a config now, given its open part of a trace."""
    if part is not None and part.state is ProcState.PENDING:
        return f"busy: trace {part.trace_id} is waiting for its next poll"
    if part is not None:
        return f"busy: it is still working on trace {part.trace_id}"
    return "busy: its profiler is tracing (started by another request or by the job itself)"


def output_path(checked: CheckedConfig, pid: int) -> str:
    """The file Kineto in process ``pid`` writes for this config."""
    if checked.memory_snapshot:
        return memory_snapshot_path(pid)
    if checked.log_file:
        return kineto_output_path(checked.log_file, pid)
    return default_output_path(pid)


@dataclass(frozen=True, slots=True)
class Matching:
    """Who a request reaches among the registered trainers.

    Attributes:
        matched: every trainer that matches and may be traced by the requester, workers
            first, then launchers, then DataLoader workers (by pid within each).
        triggered: the matched trainers that get the config, in that order.
        busy: matched trainers that hold a config or are tracing.
        over_limit: matched trainers left out by the process limit.
        not_matched: every other registered trainer, with why.
        not_theirs: (pid, owner uid) of trainers that match but belong to someone else.
    """

    matched: tuple[Trainer, ...]
    triggered: tuple[Trainer, ...]
    busy: tuple[SkippedProcess, ...]
    over_limit: tuple[SkippedProcess, ...]
    not_matched: tuple[SkippedProcess, ...]
    not_theirs: tuple[tuple[int, int | None], ...]


def match_trainers(
    req: TraceRequest,
    requester: Requester,
    trainers: Sequence[Trainer],
    roles: Mapping[bytes, Role],
    open_parts: Mapping[bytes, OpenPart],
) -> Matching:
    """Match ``req`` against the registered trainers (a pure function of its arguments).

    Args:
        req: the request.
        requester: who asks; only its own processes match (root's: all).
        trainers: the registered trainers.
        roles: each trainer's role, by address.
        open_parts: the open part of a trace each busy trainer holds, by address.
    """
    matched: list[Trainer] = []
    not_matched: list[SkippedProcess] = []
    not_theirs: list[tuple[int, int | None]] = []
    for t in trainers:
        why_not = mismatch(t, req)
        if not why_not and (why_not := ownership_problem(requester, t.uid)):
            not_theirs.append((t.pid, t.uid))
        if why_not:
            not_matched.append(SkippedProcess(t.pid, t.job_id, why_not))
        else:
            matched.append(t)
    # Workers, then launchers, then DataLoader workers; by pid within each, so the order is
    # stable and explainable.
    matched.sort(key=lambda t: (roles[t.address].priority, t.pid))
    triggered: list[Trainer] = []
    busy: list[SkippedProcess] = []
    over: list[SkippedProcess] = []
    for t in matched:
        part = open_parts.get(t.address)
        if len(triggered) >= req.process_limit:
            role = ROLE_NOTE[roles[t.address]]
            over.append(
                SkippedProcess(
                    t.pid, t.job_id, f"over the process limit of {req.process_limit}{role}"
                )
            )
        elif t.profiler_busy or part is not None:
            busy.append(SkippedProcess(t.pid, t.job_id, busy_reason(part)))
        else:
            triggered.append(t)
    return Matching(
        tuple(matched),
        tuple(triggered),
        tuple(busy),
        tuple(over),
        tuple(not_matched),
        tuple(not_theirs),
    )
