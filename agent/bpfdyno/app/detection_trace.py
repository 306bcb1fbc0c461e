"""The automatic trace on a confirmed straggler (opt-in: ``[detection] auto_trace``).

When the detection confirms a straggler, the job's ranks on this node are traced for
``auto_trace_iterations`` steps (or ``auto_trace_seconds`` from a start time common to the
ranks, so that their windows are one stretch of time), as the agent's own request
(``in-process``: audited like any other, under the daemon's identity), into the agent's
trace directory (``[tracing]``: where the operator's configuration puts traces for requests
that name no file). At most one trace per job per ``auto_trace_every_s``; a refusal (the
job's ranks busy with a trace, say) is logged and counted, never retried before the window
passes. The events come from the collector's thread; the trace starts on the event loop,
where the tracing service lives.

A timed trace (``auto_trace_seconds``) in which a rank's Kineto dropped its config (the
trainer stalled or too busy at the tick that begins its warm-up: it never started, so the
job's window has no part from that rank) is started again once, as ``gputrace --job-id``
does (`bpfdyno.client.cluster.jobtrace`): once the ranks traced are idle again, a new
trace with a new common start, on this node and on the peers alike. Its event names the
first try and the processes that dropped it. An iteration trace is not tried again: the
agent hands its config out again itself until the process takes it.

The ranks traced are the job's ranks the detection watches here (all of them: a request's
default process limit is 3). When the trace ends (every process written, failed or timed
out), its files are summarised and compared (the tracing service's `trace_summary`: the
verdict `gputrace` prints) and a ``traced`` event is posted to the event log: the trace id,
the files, the verdict's text and the verdict itself (each straggler's rank, kind, share and
causes). A trace that wrote no file posts the event too, without a verdict, its summary
saying why.

A job with ranks on other nodes (the peers whose rank signals this agent pulls hold ranks of
the job) is traced on every one of them: the agent is then the client of its peers, as
``gputrace --job-id`` is a person's (`bpfdyno.client.cluster.jobtrace`): the same request
on each peer's agent (over TLS with the token of the agent's environment, audited there as
any TCP request), one start time for every rank, and the verdict across every node's ranks,
each peer's evidence summarised by its own agent and put on this agent's clock by its
measured offset. A peer that refuses or does not answer is named in the event; the others'
ranks are still compared (docs/detection.md, "Automatic trace").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from bpfdyno.analysis.verdict import compare, verdict_text
from bpfdyno.app.detection_peers import Peer
from bpfdyno.client.cluster.fanout import FanOut
from bpfdyno.client.cluster.jobtrace import (
    JOB_ATTEMPTS,
    HostOutcome,
    JobTraceResult,
    idle_wait_s,
    job_evidence,
    plan_start_time_ms,
    trace_job,
    until_idle,
    until_pids_idle,
)
from bpfdyno.client.cluster.nodes import Node
from bpfdyno.client.errors import ClientSetupError
from bpfdyno.core.errors import RequestError
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.detection.events import EventLog
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.diagnosis import Verdict
from bpfdyno.rpc.traces import (
    NO_ITERATIONS,
    ProcessTraceState,
    TraceSpec,
    TraceSummary,
)
from bpfdyno.services.tracing import TracingService, TrainerView
from bpfdyno.tracing.requests import TraceRequest
from bpfdyno.tracing.traces import TraceView

log = logging.getLogger("bpfdyno.detection")

#: How long the peers' part of a job-wide trace is followed beyond the trace's own length
#: (their trainers' next poll, Kineto's warm-up, the files' merges).
PEER_FOLLOW_S = 120.0


class AutoTrace:
    """A component: starts a trace of a job when one of its ranks is confirmed a straggler."""

    name = "detection_auto_trace"

    def __init__(
        self,
        tracing: TracingService,
        iterations: int,
        every_s: float,
        events: EventLog,
        host: str,
        job_ranks: Callable[[str], Iterable[int]],
        seconds: float = 0.0,
        job_peers: Callable[[str], Sequence[tuple[Peer, int]]] | None = None,
        peer_pids: Callable[[str], Mapping[str, Sequence[int]]] | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """
        Args:
            iterations: an iteration trace of this many steps ...
            every_s: at most one trace per job in this many seconds.
            events: where the ``traced`` events go (the detection's event log).
            host: this node's name, for the events.
            job_ranks: the pids of a job's ranks on this node (the detection's latest round).
            seconds: ... or, above 0, a duration trace of this many seconds from a start
                time common to the ranks.
            job_peers: the peers holding ranks of a job, each with how many (the detection's
                peers); None or none: only this node's ranks are traced.
            peer_pids: the pids of a job's ranks on each peer (by target), as its agent
                reported them: a job with no SLURM id is traced there by these.
            wall: the wall clock (epoch seconds) start times are planned on: the tracing
                service's.
        """
        self._tracing = tracing
        self._iterations = iterations
        self._every_s = every_s
        self._events = events
        self._host = host
        self._job_ranks = job_ranks
        self._seconds = seconds
        self._job_peers = job_peers or (lambda job: ())
        self._peer_pids = peer_pids or (lambda job: {})
        self._wall = wall
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: dict[str, float] = {}  # job -> monotonic time of its last trace
        self._following: set[asyncio.Task[None]] = set()
        self.started: list[str] = []  # trace ids
        self.refused = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        self._loop = None
        for task in list(self._following):
            task.cancel()
        await asyncio.gather(*self._following, return_exceptions=True)

    def statuses(self) -> list[PartStatus]:
        return [
            PartStatus(
                self.name,
                PartState.OK,
                f"traces a job's ranks here for {self._length()} when one is a "
                f"confirmed straggler, at most once per {self._every_s:g} s per job; "
                f"{len(self.started)} started, {self.refused} refused",
                errors=self.refused,
            )
        ]

    def _length(self) -> str:
        if self._seconds > 0:
            return f"{self._seconds:g} s from a common start"
        return f"{self._iterations} iterations"

    def on_events(self, events: Iterable[DetectionEvent]) -> None:
        """Hand the confirmations to the event loop (call from any thread)."""
        confirmed = [e for e in events if e.kind is DetectionKind.CONFIRMED]
        loop = self._loop
        if confirmed and loop is not None:
            loop.call_soon_threadsafe(self._consider, confirmed)

    def _consider(self, events: list[DetectionEvent]) -> None:
        now = time.monotonic()
        for e in events:
            last = self._last.get(e.job_id)
            if last is not None and now - last < self._every_s:
                log.info(
                    "detection: job %s traced %.0f s ago: no automatic trace before %g s",
                    e.job_id,
                    now - last,
                    self._every_s,
                )
                continue
            self._last[e.job_id] = now
            self._trace(e)

    def _trace(
        self, e: DetectionEvent, earlier: tuple[str, ...] = (), traced: Collection[int] = ()
    ) -> bool:
        """Start the trace of confirmation ``e``'s job and follow it; False if refused.

        Args:
            earlier: the tries before this one, each in words (its trace id and who
                dropped its config).
            traced: the processes the try before traced here: traced again (a rank the
                detection's latest round missed, say one that was stopped, included).
        """
        # Every rank of the job on this node, by the pids the detection watches (and of the
        # SLURM job, when one names it); the limit is theirs, not a request's default of 3.
        pids = tuple(sorted(set(self._job_ranks(e.job_id)) | {e.pid} | set(traced)))
        spec = TraceSpec(
            iterations=self._iterations,
            job_id=int(e.job_id) if e.job_id.isdigit() else 0,
            pids=pids,
            process_limit=len(pids),
        )
        if self._seconds > 0:
            # Each rank takes its config at its own next poll; a common start time (one the
            # slowest poll and Kineto's warm-up still make) gives them all one window.
            spec = replace(
                spec,
                iterations=NO_ITERATIONS,
                duration_ms=round(self._seconds * 1000),
                profile_start_time_ms=plan_start_time_ms(self._wall(), ()),
            )
        req = TraceRequest(
            job_id=spec.job_id, pids=spec.pids, process_limit=len(pids), options=spec
        )
        try:
            res = self._tracing.start_trace(req)  # no requester: the agent's own, audited
        except RequestError as err:
            self.refused += 1
            log.warning("detection: automatic trace of job %s refused: %s", e.job_id, err)
            return False
        self.started.append(res.trace_id)
        peers = list(self._job_peers(e.job_id))
        log.warning(
            "detection: traced job %s for %s after rank %d was confirmed a "
            "straggler: trace %s, %d processes here%s",
            e.job_id,
            self._length(),
            e.rank,
            res.trace_id,
            len(res.triggered),
            f", and its ranks on {', '.join(p.name for p, _ in peers)}" if peers else "",
        )
        follow = (
            self._follow_job(e, res.trace_id, spec, peers, earlier)
            if peers
            else self._follow(e, res.trace_id, earlier)
        )
        task = asyncio.get_running_loop().create_task(follow)
        self._following.add(task)
        task.add_done_callback(self._following.discard)
        return True

    async def _follow(self, e: DetectionEvent, trace_id: str, earlier: tuple[str, ...]) -> None:
        """Wait for the trace to end, then post its verdict as a ``traced`` event (or try
        it again, when a rank's Kineto dropped its config)."""
        try:
            view = await self._until_done(trace_id)
            dropped = _dropped_here(view)
            if dropped and await self._again(e, trace_id, dropped, _pids(view), earlier):
                return
            summary = await self._tracing.trace_summary(trace_id)
        except RequestError as err:  # forgotten, or the agent is stopping
            log.warning("detection: automatic trace %s: no verdict: %s", trace_id, err)
            return
        self._events.add([self.traced_event(e, summary, earlier)])

    async def _until_done(self, trace_id: str) -> TraceView:
        """The trace once every process is written, failed or timed out."""
        view = self._tracing.get_trace(trace_id)
        async for view in self._tracing.watch_trace(trace_id):  # noqa: B007 (keeps the last)
            pass
        return view

    async def _again(
        self,
        e: DetectionEvent,
        trace_id: str,
        dropped: Sequence[str],
        pids: Collection[int],
        earlier: tuple[str, ...],
        fanout: FanOut | None = None,
        peers: JobTraceResult | None = None,
    ) -> bool:
        """Start the job's trace again, once the processes traced here (``pids``) and on
        the peers are idle, when ``dropped`` processes dropped the config of a timed trace
        and tries are left; True if it started."""
        attempt = len(earlier) + 2
        if self._seconds <= 0 or attempt > JOB_ATTEMPTS or self._loop is None:
            return False
        who = ", ".join(dropped)
        log.info(
            "detection: automatic trace %s of job %s: Kineto dropped its config in %s; "
            "tracing the job again with a new start (try %d of at most %d)",
            trace_id,
            e.job_id,
            who,
            attempt,
            JOB_ATTEMPTS,
        )
        # The processes that wrote their file are busy until their next poll says otherwise:
        # a new request would find them busy and leave them out.
        waits = [until_pids_idle(self._trainers_here, pids, idle_wait_s())]
        if fanout is not None and peers is not None:
            waits.append(until_idle(fanout, peers, idle_wait_s()))
        await asyncio.gather(*waits)
        return self._trace(e, (*earlier, f"trace {trace_id}: config dropped by {who}"), pids)

    async def _trainers_here(self) -> list[TrainerView]:
        return self._tracing.list_trainers()

    async def _follow_job(
        self,
        e: DetectionEvent,
        trace_id: str,
        spec: TraceSpec,
        peers: list[tuple[Peer, int]],
        earlier: tuple[str, ...],
    ) -> None:
        """The peers' part of a job-wide trace (the same request, the same start), then one
        verdict across every node's ranks, posted as the ``traced`` event (or the whole job
        traced again, when a rank's Kineto here or on a peer dropped its config)."""
        job = int(e.job_id) if e.job_id.isdigit() else 0
        # A job no scheduler names (torchrun's run id) has no id a peer could match: its
        # ranks there are named by the pids that peer's agent reported for them.
        pids = {} if job else self._peer_pids(e.job_id)
        nodes = [
            Node(p.name, p.target, (job,) if job else (), tuple(pids.get(p.target, ())))
            for p, _ in peers
        ]
        # Pids are this node's; on a peer the job's ranks are found by its job id, all of
        # them (the most any node holds, not a request's default of three).
        remote = replace(
            spec, pids=(), process_limit=max([spec.process_limit, *(n for _, n in peers)])
        )
        wait_s = PEER_FOLLOW_S + self._seconds
        try:
            fanout = FanOut(nodes)
        except ClientSetupError as err:  # the agent's client TLS/token environment
            log.warning(
                "detection: automatic trace %s: the job's other nodes not traced: %s",
                trace_id,
                err,
            )
            await self._follow(e, trace_id, earlier)
            return
        try:
            async with fanout:
                remote_trace = asyncio.create_task(
                    trace_job(fanout, remote, wait=True, wait_s=wait_s)
                )
                try:
                    view = await self._until_done(trace_id)
                    result = await remote_trace
                finally:
                    remote_trace.cancel()
                dropped = _dropped_here(view) + [
                    f"{h.node.name}:{f.pid}" for h in result.hosts for f in h.files()
                    if f.config_dropped
                ]  # fmt: skip
                if dropped and await self._again(
                    e, trace_id, dropped, _pids(view), earlier, fanout, result
                ):
                    return
                summary = await self._tracing.trace_summary(trace_id)
                got = await job_evidence(fanout, result)
        except RequestError as err:  # forgotten, or the agent is stopping
            log.warning("detection: automatic trace %s: no verdict: %s", trace_id, err)
            return
        here = [replace(p.evidence, host=self._host) for p in summary.processes if p.evidence]
        verdict = compare([*here, *got.evidence], got.offsets)
        notes = got.notes + tuple(_host_notes(result))
        if notes:
            verdict = replace(verdict, notes=verdict.notes + notes)
        self._events.add([self.job_traced_event(e, summary, result, verdict, earlier)])

    def job_traced_event(
        self,
        e: DetectionEvent,
        here: TraceSummary,
        peers: JobTraceResult,
        verdict: Verdict,
        earlier: tuple[str, ...] = (),
    ) -> DetectionEvent:
        """The ``traced`` event of a job-wide trace: this node's files, each peer's (named
        ``node:path``), and the verdict across them all."""
        here_files = [p.path for p in here.processes if not p.error]
        peer_files = {
            h.node.name: [f.path for f in h.files() if f.state == ProcessTraceState.WRITTEN]
            for h in peers.hosts
        }
        files = here_files + [f"{n}:{path}" for n, paths in peer_files.items() for path in paths]
        nodes = int(bool(here_files)) + sum(1 for paths in peer_files.values() if paths)
        head = (
            f"job {e.job_id} rank {e.rank}: automatic trace {here.trace_id}{_tries(earlier)} "
            f"of {len(files)} rank(s) on {nodes} node(s)"
        )
        missing = _host_notes(peers)
        if missing:
            head += f" (not traced: {'; '.join(missing)})"
        if not files or not verdict.ranks:
            return self._traced(
                e, here.trace_id, files, None, f"{head}: no file written, no verdict"
            )
        return self._traced(
            e, here.trace_id, files, verdict, f"{head}: verdict: {verdict.headline}"
        )

    def traced_event(
        self, e: DetectionEvent, summary: TraceSummary, earlier: tuple[str, ...] = ()
    ) -> DetectionEvent:
        """The ``traced`` event of confirmation ``e``'s trace, from its summary."""
        written = [p for p in summary.processes if not p.error]
        files = tuple(p.path for p in written)
        head = f"job {e.job_id} rank {e.rank}: automatic trace {summary.trace_id}{_tries(earlier)}"
        if not written or summary.verdict is None:
            why = "; ".join(p.error for p in summary.processes) or "no process was traced"
            return self._traced(
                e, summary.trace_id, (), None, f"{head}: no file written, no verdict: {why}"
            )
        v = summary.verdict
        return self._traced(
            e,
            summary.trace_id,
            files,
            v,
            f"{head} of {len(files)} rank(s) on this node: verdict: {v.headline}",
        )

    def _traced(
        self,
        e: DetectionEvent,
        trace_id: str,
        files: Sequence[str],
        verdict: Verdict | None,
        summary: str,
    ) -> DetectionEvent:
        """A ``traced`` event of confirmation ``e`` (``verdict`` None: none to attach)."""
        return DetectionEvent(
            DetectionKind.TRACED,
            e.job_id,
            e.rank,
            e.pid,
            self._host,
            time.time(),
            summary=summary,
            trace_id=trace_id,
            trace_files=tuple(files),
            verdict_text=verdict_text(verdict) if verdict is not None else "",
            verdict=verdict,
        )


def _tries(earlier: Sequence[str]) -> str:
    """What the event's head says of the tries before this one (nothing for the first)."""
    return f" (try {len(earlier) + 1}; {'; '.join(earlier)})" if earlier else ""


def _dropped_here(view: TraceView) -> list[str]:
    """The processes of ``view`` whose Kineto dropped the config, as ``pid N``."""
    return [f"pid {p.pid}" for p in view.processes if p.config_dropped]


def _pids(view: TraceView) -> set[int]:
    return {p.pid for p in view.processes}


def _host_notes(result: JobTraceResult) -> list[str]:
    """The peers whose ranks were not traced, and why."""
    return [f"{h.node.name}: {h.reason}" for h in result.hosts if h.outcome is not HostOutcome.OK]
