"""A trace of every rank of a job: one request per agent, a common start, a report per host.

`trace_job` runs three rounds over a `FanOut`, each host concurrently:

1. **Clocks**: each agent's offset against ours (`clock.measure_clock`); a host that does not
   answer is reported with why, and left out of the next rounds.
2. **Start**: one ``StartTrace`` per agent — per job id its processes carry there (array tasks
   have their own) — with the same request everywhere. A duration trace without a start time
   gets one common ``PROFILE_START_TIME`` far enough ahead for the slowest host
   (`plan_start_time_ms`); an iteration trace starts, on every rank, at the next multiple of
   the same round-up.
3. **Wait** (optional): follow every host's trace until each process has written its file,
   failed or timed out.
4. **Again** (when waiting, for a duration trace whose start was planned here): a rank
   whose Kineto dropped its config (stalled or starved at its warm-up tick, so it never
   started) leaves the job without a shared window, so the whole job is traced again, all
   rounds, with a new common start and files of their own (`retry_log_file`), up to
   `JOB_ATTEMPTS` tries in all. The result keeps the earlier tries.
5. **Verdict** (when waiting): each host's agent summarises its own ranks' files
   (``GetTraceSummary``: no trace file travels), and the ranks of every host are compared here
   on our clock, each host's arrivals moved by its measured offset
   (`bpfdyno.analysis.verdict.compare`): which rank held the job back, and why.

The result says, per host, what happened: the clock offset, who matched, who was triggered
or busy, the files with their state and size, or the error; and the verdict.
"""

from __future__ import annotations

import asyncio
import enum
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from bpfdyno.analysis.verdict import compare
from bpfdyno.client.agent import SUMMARY_TIMEOUT_S, VERDICT_S, AgentClient
from bpfdyno.client.cluster.clock import ClockOffset, measure_clock
from bpfdyno.client.cluster.fanout import FanOut
from bpfdyno.client.cluster.nodes import Node
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.rpc.diagnosis import RankEvidence, Verdict
from bpfdyno.rpc.traces import (
    KINETO_POLL_INTERVAL_S,
    KINETO_WARMUP_S,
    ProcessSummary,
    ProcessTraceState,
    TraceSpec,
    TraceStart,
    TraceStatus,
    TrainerState,
    before_kineto_extension,
)

#: Slack on top of the poll interval, Kineto's warm-up and the slowest host.
START_MARGIN_S = 2.0
#: How long `trace_job` follows the trace when waiting and no time is given.
DEFAULT_WAIT_S = 120.0
#: Tries of a job-wide duration trace whose start was planned here, when a rank's Kineto
#: dropped its config (step 4 of the module doc). One more: a trainer stalled twice in a
#: row at the same moment is no passing stall, and each try costs the job another trace.
JOB_ATTEMPTS = 2
#: How often the ranks' states are asked while waiting for them to be free for the next try.
IDLE_CHECK_S = 0.5


def retry_log_file(log_file: str, attempt: int) -> str:
    """The log file of try ``attempt`` (2, 3 ...): the first try's name with ``-try<N>``
    before Kineto's extension (where it puts each process's pid), so no try's file is
    overwritten and the agents' placement rules (no existing file) hold. "" stays "": the
    agent's default names carry the time of the request."""
    if not log_file:
        return ""
    suffix = f"-try{attempt}"
    return before_kineto_extension(log_file, suffix) or log_file + suffix


def plan_start_time_ms(
    now_s: float,
    clocks: Iterable[ClockOffset | None],
    *,
    poll_interval_s: float = KINETO_POLL_INTERVAL_S,
) -> int:
    """A common start time (epoch ms) that every host's processes can still honour.

    A process gets its config at its next poll (up to ``poll_interval_s`` later) and then
    needs Kineto's warm-up before the start; the agent itself refuses a start time less than
    the warm-up ahead of *its* clock. So the start is now + the slowest host's round trip
    and clock lead + the poll interval + the warm-up + a margin, rounded up to 0.1 s.
    """
    worst = max(
        (c.round_trip_s + max(0.0, c.offset_s) for c in clocks if c is not None), default=0.0
    )
    start_s = now_s + worst + poll_interval_s + KINETO_WARMUP_S + START_MARGIN_S
    return math.ceil(start_s * 10) * 100


class HostOutcome(enum.StrEnum):
    """How a host's part of a job trace ended (the value is what ``--json`` writes)."""

    #: Processes were triggered (and, when waiting, each wrote its file).
    OK = "ok"
    #: Triggered; their traces are being followed.
    IN_PROGRESS = "in_progress"
    #: The agent answered but no process of the job was traced there.
    NOT_TRACED = "not_traced"
    #: Triggered, but a process failed or timed out (when waiting).
    INCOMPLETE = "incomplete"
    #: No answer, or the request was refused.
    FAILED = "failed"


class JobOutcome(enum.StrEnum):
    """How the whole job trace ended: the exit status of ``gputrace`` follows it."""

    ALL = "all"
    SOME_FAILED = "some_failed"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class TraceFile:
    """One traced process's file on one host.

    Attributes:
        host: the node's name.
        pid: the process.
        job_id: its ``$SLURM_JOB_ID``.
        path: the file Kineto writes there.
        state: ``triggered`` until followed, then the process's `ProcessTraceState`
            (pending, delivered, tracing, merging, written, failed, timed_out).
        size_bytes: the written file's size; None until written.
        reason: why it is in this state, in words.
        config_dropped: failed because its Kineto dropped the config (never started).
    """

    host: str
    pid: int
    job_id: int
    path: str
    state: str
    size_bytes: int | None
    reason: str
    config_dropped: bool = False


@dataclass(frozen=True, slots=True)
class HostRequest:
    """One ``StartTrace`` on one host, and the trace's last known state."""

    job_id: int
    start: TraceStart
    final: TraceStatus | None = None


@dataclass(frozen=True, slots=True)
class HostTrace:
    """What happened on one host."""

    node: Node
    clock: ClockOffset | None = None
    requests: tuple[HostRequest, ...] = ()
    error: AgentError | None = None
    waited: bool = False

    @property
    def matched(self) -> int:
        """Processes of the job the agent found."""
        return sum(len(r.start.processes_matched) for r in self.requests)

    @property
    def triggered(self) -> int:
        """Processes handed a trace config."""
        return sum(len(r.start.triggered) for r in self.requests)

    @property
    def busy(self) -> int:
        """Matched processes already holding or running a trace."""
        return sum(len(r.start.busy) for r in self.requests)

    @property
    def over_limit(self) -> int:
        """Matched processes left out by the process limit."""
        return sum(len(r.start.over_limit) for r in self.requests)

    @property
    def trace_ids(self) -> tuple[str, ...]:
        """The agent's trace id of each request."""
        return tuple(r.start.trace_id for r in self.requests)

    def files(self) -> list[TraceFile]:
        """Every triggered process's file, with its latest state."""
        out = []
        for r in self.requests:
            final = {p.pid: p for p in r.final.processes} if r.final is not None else {}
            for t in r.start.triggered:
                p = final.get(t.pid)
                if p is None:
                    out.append(
                        TraceFile(self.node.name, t.pid, t.job_id, t.output_path, "triggered",
                                  None, "config stored for the process's next poll")
                    )  # fmt: skip
                    continue
                out.append(
                    TraceFile(
                        host=self.node.name,
                        pid=p.pid,
                        job_id=p.job_id,
                        path=p.output_path or t.output_path,
                        state=p.state.value,
                        size_bytes=p.size_bytes if p.size_bytes >= 0 else None,
                        reason=p.reason,
                        config_dropped=p.config_dropped,
                    )
                )
        return out

    @property
    def outcome(self) -> HostOutcome:
        """How this host's part ended."""
        if self.error is not None:
            return HostOutcome.FAILED
        if self.triggered == 0:
            return HostOutcome.NOT_TRACED
        if self.waited:
            if any(r.start.triggered and r.final is None for r in self.requests):
                return HostOutcome.IN_PROGRESS
            if any(f.state != ProcessTraceState.WRITTEN for f in self.files()):
                return HostOutcome.INCOMPLETE
        return HostOutcome.OK

    @property
    def reason(self) -> str:
        """Why the outcome is not ``ok``, in words ("" when it is)."""
        outcome = self.outcome
        if self.error is not None:
            return self.error.message
        if outcome is HostOutcome.NOT_TRACED:
            skipped = [s for r in self.requests for s in (*r.start.busy, *r.start.over_limit)]
            if skipped:
                return "nothing triggered: " + "; ".join(
                    f"pid {s.pid}: {s.reason}" for s in skipped[:3]
                )
            others = [s for r in self.requests for s in r.start.not_matched]
            if not others:
                return (
                    "no process matched: no trainer is registered with this agent; start the "
                    "ranks with KINETO_USE_DAEMON=1 (and, if KINETO_IPC_SOCKET_DIR is set for "
                    "them, the agent's [kineto] socket_dir)"
                )
            return "no process matched; registered: " + "; ".join(
                f"pid {s.pid} (job {s.job_id}): {s.reason}" for s in others[:3]
            )
        if outcome is HostOutcome.INCOMPLETE:
            return "; ".join(
                f"pid {f.pid} {f.state}: {f.reason}"
                for f in self.files()
                if f.state != ProcessTraceState.WRITTEN
            )
        return ""


@dataclass(frozen=True, slots=True)
class JobTraceResult:
    """A job-wide trace: the request every host got, and each host's part.

    Attributes:
        spec: the request as sent (with the common start time, in duration mode).
        hosts: one entry per node, in the nodes' order.
        waited: whether the traces were followed to their end.
        verdict: the ranks of every host compared (after waiting, once files are written).
        attempt: which try this is (1, then 2 ... when the job was traced again).
        earlier: the tries before it, oldest first (each its own request and files).
    """

    spec: TraceSpec
    hosts: tuple[HostTrace, ...]
    waited: bool = False
    verdict: Verdict | None = None
    attempt: int = 1
    earlier: tuple[JobTraceResult, ...] = ()

    @property
    def outcome(self) -> JobOutcome:
        """All hosts ok, some not, or none."""
        ok = sum(h.outcome is HostOutcome.OK for h in self.hosts)
        if self.hosts and ok == len(self.hosts):
            return JobOutcome.ALL
        return JobOutcome.SOME_FAILED if ok else JobOutcome.NONE

    def files(self) -> list[TraceFile]:
        """Every traced process's file, host by host."""
        return [f for h in self.hosts for f in h.files()]

    def dropped(self) -> list[TraceFile]:
        """The files whose process's Kineto dropped its config (never started tracing)."""
        return [f for f in self.files() if f.config_dropped]


#: Called with the whole result after every change while a job trace runs.
ProgressCallback = Callable[[JobTraceResult], None]


async def trace_job(
    fanout: FanOut,
    spec: TraceSpec,
    *,
    wait: bool = False,
    wait_s: float = DEFAULT_WAIT_S,
    poll_interval_s: float = KINETO_POLL_INTERVAL_S,
    on_progress: ProgressCallback | None = None,
    clock: Callable[[], float] = time.time,
) -> JobTraceResult:
    """Trace every node of ``fanout`` with the same request; report per host.

    Args:
        fanout: the job's agents.
        spec: the request. Its ``job_id`` is used on nodes that list no job ids of their
            own; pids are host-local, so leave them empty for a job-wide trace.
        wait: follow each host's trace until every process has ended (or ``wait_s``).
        wait_s: how long to follow (each try).
        poll_interval_s: the trainers' config poll interval, for the common start time.
        on_progress: called with the whole result after every change.
        clock: our wall clock (epoch seconds).

    A waited duration trace with no start time of the caller's is tried again, up to
    `JOB_ATTEMPTS` tries in all, when a rank's Kineto drops its config (module doc, step 4).
    """
    # A start the caller chose is not ours to move: only one planned here is planned again.
    again = wait and not spec.iteration_mode and spec.profile_start_time_ms == 0
    earlier: list[JobTraceResult] = []
    while True:
        attempt = len(earlier) + 1
        tried = replace(spec, log_file=retry_log_file(spec.log_file, attempt)) if earlier else spec

        def progress(r: JobTraceResult, n: int = attempt) -> None:
            if on_progress is not None:
                on_progress(replace(r, attempt=n, earlier=tuple(earlier)))

        result = await _trace_once(fanout, tried, wait, wait_s, poll_interval_s, progress, clock)
        result = replace(result, attempt=attempt, earlier=tuple(earlier))
        if not (again and result.dropped() and attempt < JOB_ATTEMPTS):
            break
        earlier.append(result)
        # The ranks that wrote their file are busy until their next poll says otherwise.
        await until_idle(fanout, result, idle_wait_s(poll_interval_s))
    if not wait:
        return result
    return replace(result, verdict=await job_verdict(fanout, result))


def idle_wait_s(poll_interval_s: float = KINETO_POLL_INTERVAL_S) -> float:
    """The longest a new try waits for the last one's processes to be idle: two of their
    polls (the one after their file, and one to spare) and a margin."""
    return 2 * poll_interval_s + START_MARGIN_S


class _Polled(Protocol):
    """A registered trainer as an agent lists it (the API's record, or the service's view)."""

    @property
    def pid(self) -> int: ...
    @property
    def state(self) -> TrainerState: ...


async def until_pids_idle(
    trainers: Callable[[], Awaitable[Iterable[_Polled]]],
    pids: Collection[int],
    timeout_s: float,
) -> None:
    """Wait until none of ``pids`` has a config pending or its profiler busy among the
    ``trainers`` an agent lists (each process's profiler says it is free at a poll after its
    file), at most ``timeout_s``: a new request would find them busy and leave them out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(t.pid in pids and t.state is not TrainerState.IDLE for t in await trainers()):
            return
        await asyncio.sleep(IDLE_CHECK_S)


async def until_idle(fanout: FanOut, result: JobTraceResult, timeout_s: float) -> None:
    """`until_pids_idle` for the processes ``result`` traced, at each of their agents. A
    host that does not answer is left to the next try to report."""
    pids = {h.node.target: {f.pid for f in h.files()} for h in result.hosts}

    async def idle(node: Node, agent: AgentClient) -> None:
        await until_pids_idle(agent.trainers, pids[node.target], timeout_s)

    waiting = [n for n in fanout.nodes if pids.get(n.target)]
    await fanout.map(idle, waiting, timeout_s=timeout_s + IDLE_CHECK_S, bounded=False)


async def _trace_once(
    fanout: FanOut,
    spec: TraceSpec,
    wait: bool,
    wait_s: float,
    poll_interval_s: float,
    on_progress: ProgressCallback,
    clock: Callable[[], float],
) -> JobTraceResult:
    """One try of `trace_job`: steps 1-3 of the module doc (no verdict)."""
    hosts = {n.target: HostTrace(n, waited=wait) for n in fanout.nodes}

    def snapshot() -> JobTraceResult:
        return JobTraceResult(spec, tuple(hosts[n.target] for n in fanout.nodes), wait)

    def put(trace: HostTrace) -> None:
        hosts[trace.node.target] = trace
        on_progress(snapshot())

    probes = await fanout.map(lambda node, agent: measure_clock(agent))
    reachable: list[Node] = []
    for probe in probes:
        node = probe.node
        if probe.ok:
            hosts[node.target] = replace(hosts[node.target], clock=probe.value)
            reachable.append(node)
        elif probe.error is not None and probe.error.kind is ErrorKind.UNIMPLEMENTED:
            reachable.append(node)  # an agent without GetClock: traced, offset unknown
        else:
            hosts[node.target] = replace(hosts[node.target], error=probe.error)
    if not spec.iteration_mode and spec.profile_start_time_ms == 0 and reachable:
        start_ms = plan_start_time_ms(
            clock(),
            (hosts[n.target].clock for n in reachable),
            poll_interval_s=poll_interval_s,
        )
        spec = replace(spec, profile_start_time_ms=start_ms)
    on_progress(snapshot())

    async def start(node: Node, agent: AgentClient) -> tuple[HostRequest, ...]:
        if node.pids:  # a job no scheduler names: its processes there, all of them
            pids = replace(spec, job_id=0, pids=node.pids, process_limit=len(node.pids))
            return (HostRequest(0, await agent.start_trace(pids)),)
        requests = []
        for job_id in node.job_ids or (spec.job_id,):
            started = await agent.start_trace(replace(spec, job_id=job_id))
            requests.append(HostRequest(job_id, started))
        return tuple(requests)

    for started in await fanout.map(start, reachable):
        trace = hosts[started.node.target]
        if started.value is not None:
            put(replace(trace, requests=started.value))
        else:
            put(replace(trace, error=started.error))
    if not wait:
        return snapshot()

    async def follow(node: Node, agent: AgentClient) -> None:
        for i, request in enumerate(hosts[node.target].requests):
            if not request.start.triggered:
                continue
            async for status in agent.follow_trace(request.start.trace_id, wait_s):
                requests = list(hosts[node.target].requests)
                requests[i] = replace(requests[i], final=status)
                put(replace(hosts[node.target], requests=tuple(requests)))

    waiting = [n for n in fanout.nodes if hosts[n.target].triggered]
    results = await fanout.map(follow, waiting, timeout_s=wait_s + 2 * VERDICT_S, bounded=False)
    for followed in results:
        if followed.error is not None:
            why = followed.error
            lost = AgentError(why.kind, f"lost while following the trace: {why.message}")
            put(replace(hosts[followed.node.target], error=lost))
    return snapshot()


@dataclass(frozen=True, slots=True)
class JobEvidence:
    """Every written rank's evidence of a job trace, as its own agent summarised it.

    Attributes:
        evidence: each rank's, its ``host`` the node's name.
        offsets: per node name, nanoseconds to add to its times to be on our clock.
        notes: the hosts (or files) that could not be summarised, and why.
    """

    evidence: tuple[RankEvidence, ...]
    offsets: dict[str, int]
    notes: tuple[str, ...]


async def job_verdict(fanout: FanOut, result: JobTraceResult) -> Verdict:
    """The ranks of every host compared (step 5 of the module doc).

    Hosts whose agent could not summarise are named in the verdict's notes; the others are
    still compared.
    """
    got = await job_evidence(fanout, result)
    verdict = compare(list(got.evidence), got.offsets)
    return replace(verdict, notes=verdict.notes + got.notes) if got.notes else verdict


async def job_evidence(fanout: FanOut, result: JobTraceResult) -> JobEvidence:
    """Each host's ranks' evidence, summarised by its own agent (no trace file travels)."""

    async def summaries(node: Node, agent: AgentClient) -> list[ProcessSummary]:
        out: list[ProcessSummary] = []
        for request in hosts[node.target].requests:
            if request.final is not None and any(
                p.state == ProcessTraceState.WRITTEN for p in request.final.processes
            ):
                out += (await agent.trace_summary(request.start.trace_id)).processes
        return out

    hosts = {h.node.target: h for h in result.hosts}
    written = [
        h.node for h in result.hosts if any(f.state == ProcessTraceState.WRITTEN for f in h.files())
    ]
    evidence: list[RankEvidence] = []
    offsets: dict[str, int] = {}
    notes: list[str] = []
    for got in await fanout.map(summaries, written, timeout_s=SUMMARY_TIMEOUT_S):
        node = got.node
        if got.value is None:
            notes.append(f"{node.name}: not summarised ({got.error.message if got.error else '?'})")
            continue
        clock = hosts[node.target].clock
        if clock is not None:  # its clock minus ours: subtract it to be on ours
            offsets[node.name] = -round(clock.offset_s * 1e9)
        for s in got.value:
            if s.evidence is not None:
                evidence.append(replace(s.evidence, host=node.name))
            elif s.error:
                notes.append(f"{node.name}: {s.path}: {s.error}")
    return JobEvidence(tuple(evidence), offsets, tuple(notes))


def hosts_failed_alike(result: JobTraceResult) -> AgentError | None:
    """The one error every host failed with (the same kind and words), if they all did.

    A wrong token, or a log file every agent refuses for the same rule, is then said once.
    """
    errors = [h.error for h in result.hosts]
    if not errors or any(e is None for e in errors):
        return None
    first = errors[0]
    assert first is not None
    return first if all(e == first for e in errors) else None


def summarize(hosts: Sequence[HostTrace]) -> dict[HostOutcome, int]:
    """How many hosts ended each way."""
    counts = {o: 0 for o in HostOutcome}
    for h in hosts:
        counts[h.outcome] += 1
    return counts


__all__ = [
    "DEFAULT_WAIT_S",
    "JOB_ATTEMPTS",
    "KINETO_POLL_INTERVAL_S",
    "HostOutcome",
    "HostRequest",
    "HostTrace",
    "JobOutcome",
    "JobTraceResult",
    "TraceFile",
    "idle_wait_s",
    "plan_start_time_ms",
    "retry_log_file",
    "trace_job",
    "until_idle",
    "until_pids_idle",
]
