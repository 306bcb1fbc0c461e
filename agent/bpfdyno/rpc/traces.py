"""The Tracing service's records (``tracing.proto``), shared by the agent and every client.

`TraceSpec` is what a client asks a trace to be — which processes, for how long, what the
profiler records — with the field names of ``StartTraceRequest`` and the defaults of ``dyno
gputrace``. proto3 cannot tell a field set to zero from one not set, so on the wire zero (or
an unset ``optional`` field) means the default; an ``iterations`` of zero or less means a
duration trace.

The answers: `Trainer` (a registered process), `TraceStart` (who a request triggered, who
not and why), `TraceStatus` (each process's part until its file is written), `TraceSummary`
(each written file in numbers), `DcgmResult`. The state words (`TrainerState`,
`ProcessTraceState`) are the agent's own: the trace tracker keeps its state in them.
`bpfdyno.rpc.wire` maps every record to and from its message.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import field
from typing import cast

from bpfdyno.rpc.diagnosis import RankEvidence, Verdict
from bpfdyno.rpc.v1 import tracing_pb2
from bpfdyno.rpc.wire import from_pb, record, to_pb

#: Length of a duration trace when none is given (dyno's default).
DEFAULT_DURATION_MS = 500
#: Most processes triggered when no limit is given (dyno's default).
DEFAULT_PROCESS_LIMIT = 3
#: ``iterations`` of a duration trace.
NO_ITERATIONS = -1
#: Kineto warms up this long before a timed trace (``profile_start_time_ms``): a start time
#: closer than this when the process receives the request is not traced, so the agent
#: refuses one closer than this when it gets the request.
KINETO_WARMUP_S = 5.0
#: How often PyTorch asks its agent for a config by default
#: (``ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS``): a request waits up to this long for delivery.
KINETO_POLL_INTERVAL_S = 5.0


def before_kineto_extension(log_file: str, text: str) -> str | None:
    """``log_file`` with ``text`` where Kineto puts a process's pid in it: before
    ``.pt.trace.json``, else before ``.json``; None when it has neither (Kineto then writes
    the name as it is)."""
    for marker in (".pt.trace.json", ".json"):
        i = log_file.find(marker)
        if i >= 0:
            return f"{log_file[:i]}{text}{log_file[i:]}"
    return None


@record(tracing_pb2.StartTraceRequest, zero_is_default=True)
class TraceSpec:
    """A trace request: who to trace, for how long, and what to record.

    Attributes:
        log_file: absolute path of the trace file; Kineto inserts ``_<pid>``. Empty: a name
            under the agent's trace directory.
        duration_ms: length of a duration trace.
        iterations: > 0 traces this many optimizer steps instead of a duration.
        profile_start_time_ms: duration trace: epoch ms to start at; 0 = about 7 s after the
            process gets the request.
        profile_start_iteration_roundup: iteration trace: start at a multiple of this step.
        record_shapes, profile_memory, with_stacks, with_flops, with_modules: profiler
            options, as the ``dyno gputrace`` switches of the same names.
        process_limit: most processes to trigger (workers before launchers and DataLoader
            workers).
        pids: processes to trace (a process matches when its pid or an ancestor's is listed);
            empty: every process of the job.
        job_id: the SLURM job to trace; 0: processes without one, or any job when ``pids``
            are given.
        timeout_seconds: how long the agent follows the trace; 0 = its default.
        kernel_tracks: the kernel tracks merged into each file (`bpfdyno.rpc.kernel_tracks`:
            ``net,sched,nccl,gpu,fabric``, ``all`` or ``none``); "" = the agent's default.
        pre_window_seconds: rare network events from this long before the request are
            added; None = the agent's default.
    """

    log_file: str = ""
    duration_ms: int = DEFAULT_DURATION_MS
    iterations: int = NO_ITERATIONS
    profile_start_time_ms: int = 0
    profile_start_iteration_roundup: int = 1
    record_shapes: bool = False
    profile_memory: bool = False
    with_stacks: bool = False
    with_flops: bool = False
    with_modules: bool = False
    process_limit: int = DEFAULT_PROCESS_LIMIT
    pids: tuple[int, ...] = ()
    job_id: int = 0
    timeout_seconds: float = 0.0
    kernel_tracks: str = ""
    pre_window_seconds: float | None = None

    @property
    def iteration_mode(self) -> bool:
        """Whether the trace counts optimizer steps rather than milliseconds."""
        return self.iterations > 0


#: The profiler's switches, as ``dyno gputrace`` names them: (`TraceSpec` field, short word,
#: what it records). ``gputrace`` takes ``--record-shapes``..., the TUI's form a checkbox each.
PROFILER_SWITCHES = (
    ("record_shapes", "shapes", "record operator input shapes"),
    ("profile_memory", "memory", "profile memory"),
    ("with_stacks", "stacks", "record Python stacks"),
    ("with_flops", "flops", "estimate operator FLOPs"),
    ("with_modules", "modules", "record nn.Module hierarchy"),
)


def spec_to_pb(spec: TraceSpec) -> tracing_pb2.StartTraceRequest:
    """The StartTrace message for a request (every field set, defaults included)."""
    return cast(tracing_pb2.StartTraceRequest, to_pb(spec))


def spec_from_pb(msg: tracing_pb2.StartTraceRequest) -> TraceSpec:
    """The request a StartTrace message states: zero or unset fields take the defaults."""
    spec = from_pb(TraceSpec, msg)
    if not spec.iteration_mode and spec.iterations != NO_ITERATIONS:
        spec = dataclasses.replace(spec, iterations=NO_ITERATIONS)
    return spec


def words(state: enum.Enum) -> str:
    """A state as people read it: ``timed_out`` -> ``timed out``."""
    return str(state.value).replace("_", " ")


# -- trainers ---------------------------------------------------------------------------------


class TrainerState(enum.StrEnum):
    """What a trainer is doing, as far as the agent can tell."""

    IDLE = "idle"
    #: A config waits for its next poll, or it has one it has not started yet.
    CONFIG_PENDING = "config_pending"
    #: Its last poll said its profiler is busy.
    TRACING = "tracing"


class TrainerRole(enum.StrEnum):
    """The part a process plays in its job (workers are traced first under a limit)."""

    WORKER = "worker"
    LAUNCHER = "launcher"
    DATA_WORKER = "data_worker"


@record(tracing_pb2.Trainer)
class Trainer:
    """A PyTorch process registered with the agent for on-demand tracing.

    Attributes:
        pid: its pid, as it reported it.
        ancestors: its parent, grandparent... (at most 10, pid 1 left out).
        job_id: its ``$SLURM_JOB_ID``; 0 when it has none.
        first_poll_unix_seconds, last_poll_unix_seconds: wall-clock times of its polls.
        polls: how many polls it sent.
        state: what it is doing.
        role: the part it plays in its job; None when unknown.
        endpoint: the address its Kineto client polls from.
        trace_id: the trace it holds a config of ("" if none).
        uid: its owner (None: unknown; only root may trace it).
        host_pid: its pid in the agent's pid namespace; 0 if unknown.
        job_name: its Kubernetes training job, whose name gave it ``job_id``
            (`bpfdyno.core.k8s_jobs`); "" when it has none.
    """

    pid: int
    ancestors: tuple[int, ...] = ()
    job_id: int = 0
    first_poll_unix_seconds: float = 0.0
    last_poll_unix_seconds: float = 0.0
    polls: int = 0
    state: TrainerState = TrainerState.IDLE
    role: TrainerRole | None = None
    endpoint: str = ""
    trace_id: str = ""
    uid: int | None = None
    host_pid: int = 0
    job_name: str = ""


# -- starting a trace -------------------------------------------------------------------------


@record(tracing_pb2.TriggeredProcess)
class TriggeredProcess:
    """A process handed the trace config, and the file Kineto in it will write."""

    pid: int
    job_id: int
    output_path: str


@record(tracing_pb2.SkippedProcess)
class SkippedProcess:
    """A registered process that was not triggered, and why (in words)."""

    pid: int
    job_id: int
    reason: str


@record(tracing_pb2.StartTraceResponse)
class TraceStart:
    """What a trace request did (``StartTraceResponse``).

    Attributes:
        trace_id: written into every triggered process's trace file as ``trace_id``.
        processes_matched: every matching pid, in the order they were considered.
        triggered: the processes handed the config, with their real output files.
        busy: matched, but a config is pending or a trace is running there.
        over_limit: matched, but the process limit was reached.
        not_matched: every other registered trainer, with why it did not match.
        config_text: the config handed out (without the trace id line).
    """

    trace_id: str
    processes_matched: tuple[int, ...] = ()
    triggered: tuple[TriggeredProcess, ...] = ()
    busy: tuple[SkippedProcess, ...] = ()
    over_limit: tuple[SkippedProcess, ...] = ()
    not_matched: tuple[SkippedProcess, ...] = ()
    config_text: str = ""

    def summary(self) -> str:
        """What happened in a few words: "2 triggered, 1 busy" or why nothing was."""
        counts = [f"{len(self.triggered)} triggered"]
        if self.busy:
            counts.append(f"{len(self.busy)} busy")
        if self.over_limit:
            counts.append(f"{len(self.over_limit)} over the process limit")
        if not self.triggered:
            counts.append(
                "no registered process matched"
                if not self.processes_matched
                else "every matching process is busy or over the limit"
            )
        return ", ".join(counts)


# -- following a trace ------------------------------------------------------------------------


class ProcessTraceState(enum.StrEnum):
    """Where one process's part of a trace stands."""

    PENDING = "pending"  # stored; the process has not polled since
    DELIVERED = "delivered"  # handed to the process in a reply
    TRACING = "tracing"  # its profiler is busy with it, or its .tmp appeared
    MERGING = "merging"  # the final file exists; the kernel tracks are being added to it
    WRITTEN = "written"  # the final file exists (with its kernel tracks, or why not)
    FAILED = "failed"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        """Whether nothing changes any more."""
        return self in (ProcessTraceState.WRITTEN, ProcessTraceState.FAILED,
                        ProcessTraceState.TIMED_OUT)  # fmt: skip


@record(tracing_pb2.KernelTracks)
class KernelTracks:
    """A process's kernel tracks in its trace file.

    Attributes:
        requested: the tracks asked for.
        state: ``off``, ``recording``, ``merging``, ``merged`` or ``not merged``.
        merged: the tracks in the file.
        events: events added to the file.
        lost: records lost (full ring buffers, the per-process cap).
        reason: unavailable tracks and losses, or why nothing was merged.
    """

    requested: tuple[str, ...] = ()
    state: str = "off"
    merged: tuple[str, ...] = ()
    events: int = 0
    lost: int = 0
    reason: str = ""

    def describe(self) -> str:
        """In one line; "" when none were asked for."""
        if not self.requested:
            return ""
        if self.state == "merged":
            text = f"kernel tracks {','.join(self.merged)} merged ({self.events} events"
            text += f", {self.lost} records lost)" if self.lost else ")"
            return text + (f"; {self.reason}" if self.reason else "")
        return f"kernel tracks {','.join(self.requested)} {self.state}" + (
            f": {self.reason}" if self.reason else ""
        )


@record(tracing_pb2.ProcessTrace)
class ProcessTrace:
    """One process's part of a trace.

    Attributes:
        pid, job_id: the process.
        output_path: the file Kineto in it writes.
        state: where it stands.
        reason: why it is in this state, in words.
        size_bytes: the written file's size; -1 until written.
        updated_unix_seconds: when the state last changed.
        config_dropped: failed because Kineto dropped its config and never started tracing
            (stalled or too busy at its warm-up tick): tracing again with a new start may
            succeed.
        kernel_tracks: its kernel tracks.
    """

    pid: int
    job_id: int = 0
    output_path: str = ""
    state: ProcessTraceState = ProcessTraceState.PENDING
    reason: str = ""
    size_bytes: int = -1
    updated_unix_seconds: float = 0.0
    config_dropped: bool = False
    kernel_tracks: KernelTracks = KernelTracks()


@record(tracing_pb2.TraceStatus)
class TraceStatus:
    """A trace's state, per process (``GetTrace``, ``WatchTrace``).

    Attributes:
        trace_id: the agent's id for the request.
        created_unix_seconds: when it was started.
        deadline_unix_seconds: processes still open then are reported timed out.
        iteration_mode: whether it counts optimizer steps rather than milliseconds.
        processes: each triggered process's part.
        done: every process has ended (written, failed or timed out).
    """

    trace_id: str
    created_unix_seconds: float = 0.0
    deadline_unix_seconds: float = 0.0
    iteration_mode: bool = False
    processes: tuple[ProcessTrace, ...] = ()
    done: bool = False

    @property
    def outcome(self) -> str:
        """``running``; once done, ``done`` (every file written), ``partly done`` or
        ``failed`` (none written)."""
        if not self.done:
            return "running"
        written = self.count(ProcessTraceState.WRITTEN)
        if written == len(self.processes) and written:
            return "done"
        return "partly done" if written else "failed"

    def count(self, *states: ProcessTraceState) -> int:
        """How many processes are in one of ``states``."""
        return sum(p.state in states for p in self.processes)

    def summary(self) -> str:
        """How many files are written, failed and in progress: "2 written, 1 failed"."""
        written = self.count(ProcessTraceState.WRITTEN)
        failed = self.count(ProcessTraceState.FAILED, ProcessTraceState.TIMED_OUT)
        parts = [f"{written} written"]
        if failed:
            parts.append(f"{failed} failed")
        if len(self.processes) - written - failed:
            parts.append(f"{len(self.processes) - written - failed} in progress")
        return ", ".join(parts)


@record(tracing_pb2.DcgmResponse)
class DcgmResult:
    """What a dcgm pause or resume did: whether it worked, and why not."""

    status: bool
    reason: str = ""


# -- summaries of written files ---------------------------------------------------------------


@record(tracing_pb2.ProcessSummary)
class ProcessSummary:
    """One trace file in numbers (see docs/tracing.md, "Summary across ranks").

    ``error`` is set instead of the numbers when the file could not be read; ``evidence`` is
    what the file shows for the job's verdict (`bpfdyno.rpc.diagnosis`).
    """

    path: str
    pid: int = 0
    rank: int = -1
    trace_id: str = ""
    window_start_unix_seconds: float = 0.0
    window_seconds: float = 0.0
    pytorch_op_seconds: float = 0.0
    kernel_tracks: tuple[str, ...] = ()
    net_sent_bytes: int = 0
    net_received_bytes: int = 0
    net_calls: int = 0
    tcp_retransmits: int = 0
    tcp_resets: int = 0
    packet_drops: int = 0
    offcpu_runnable_seconds: float = 0.0
    offcpu_blocked_seconds: float = 0.0
    blocked_seconds_by_cause: dict[str, float] = field(default_factory=dict)
    main_thread_runnable_seconds: float = 0.0
    main_thread_blocked_seconds: float = 0.0
    nccl_calls: int = 0
    nccl_seconds: float = 0.0
    kernel_records_lost: int = 0
    error: str = ""
    evidence: RankEvidence | None = None
    #: The threads the off-CPU sums add up (each counts its own time: the sums can exceed
    #: the window).
    offcpu_threads: int = 0
    #: Time at least one of its GPUs ran a kernel, inside the window.
    gpu_busy_seconds: float = 0.0


@record(tracing_pb2.TraceSummary)
class TraceSummary:
    """Each triggered process's file of a trace, summarised, in the trace's order, and the
    verdict across them (one node's ranks; a job's nodes are compared by the client)."""

    trace_id: str = ""
    processes: tuple[ProcessSummary, ...] = ()
    verdict: Verdict | None = None
