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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace

from bpfdyno.analysis.verdict import compare, verdict_text
from bpfdyno.app.detection_peers import Peer
from bpfdyno.client.cluster.fanout import FanOut
from bpfdyno.client.cluster.jobtrace import (
    HostOutcome,
    JobTraceResult,
    job_evidence,
    plan_start_time_ms,
    trace_job,
)
from bpfdyno.client.cluster.nodes import Node
from bpfdyno.client.errors import ClientSetupError
from bpfdyno.core.errors import RequestError
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.detection.events import EventLog
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.diagnosis import Verdict
from bpfdyno.rpc.traces import NO_ITERATIONS, ProcessTraceState, TraceSpec, TraceSummary
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.requests import TraceRequest

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

    def _trace(self, e: DetectionEvent) -> None:
        # Every rank of the job on this node, by the pids the detection watches (and of the
        # SLURM job, when one names it); the limit is theirs, not a request's default of 3.
        pids = tuple(sorted(set(self._job_ranks(e.job_id)) | {e.pid}))
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
                profile_start_time_ms=plan_start_time_ms(time.time(), ()),
            )
        req = TraceRequest(
            job_id=spec.job_id, pids=spec.pids, process_limit=len(pids), options=spec
        )
        try:
            res = self._tracing.start_trace(req)  # no requester: the agent's own, audited
        except RequestError as err:
            self.refused += 1
            log.warning("detection: automatic trace of job %s refused: %s", e.job_id, err)
            return
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
            self._follow_job(e, res.trace_id, spec, peers)
            if peers
            else self._follow(e, res.trace_id)
        )
        task = asyncio.get_running_loop().create_task(follow)
        self._following.add(task)
        task.add_done_callback(self._following.discard)

    async def _follow(self, e: DetectionEvent, trace_id: str) -> None:
        """Wait for the trace to end, then post its verdict as a ``traced`` event."""
        try:
            async for _view in self._tracing.watch_trace(trace_id):
                pass  # until every process is written, failed or timed out
            summary = await self._tracing.trace_summary(trace_id)
        except RequestError as err:  # forgotten, or the agent is stopping
            log.warning("detection: automatic trace %s: no verdict: %s", trace_id, err)
            return
        self._events.add([self.traced_event(e, summary)])

    async def _follow_job(
        self, e: DetectionEvent, trace_id: str, spec: TraceSpec, peers: list[tuple[Peer, int]]
    ) -> None:
        """The peers' part of a job-wide trace (the same request, the same start), then one
        verdict across every node's ranks, posted as the ``traced`` event."""
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
            await self._follow(e, trace_id)
            return
        try:
            async with fanout:
                remote_trace = asyncio.create_task(
                    trace_job(fanout, remote, wait=True, wait_s=wait_s)
                )
                try:
                    async for _view in self._tracing.watch_trace(trace_id):
                        pass
                    summary = await self._tracing.trace_summary(trace_id)
                    result = await remote_trace
                finally:
                    remote_trace.cancel()
                got = await job_evidence(fanout, result)
        except RequestError as err:  # forgotten, or the agent is stopping
            log.warning("detection: automatic trace %s: no verdict: %s", trace_id, err)
            return
        here = [replace(p.evidence, host=self._host) for p in summary.processes if p.evidence]
        verdict = compare([*here, *got.evidence], got.offsets)
        notes = got.notes + tuple(_host_notes(result))
        if notes:
            verdict = replace(verdict, notes=verdict.notes + notes)
        self._events.add([self.job_traced_event(e, summary, result, verdict)])

    def job_traced_event(
        self, e: DetectionEvent, here: TraceSummary, peers: JobTraceResult, verdict: Verdict
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
            f"job {e.job_id} rank {e.rank}: automatic trace {here.trace_id} of "
            f"{len(files)} rank(s) on {nodes} node(s)"
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

    def traced_event(self, e: DetectionEvent, summary: TraceSummary) -> DetectionEvent:
        """The ``traced`` event of confirmation ``e``'s trace, from its summary."""
        written = [p for p in summary.processes if not p.error]
        files = tuple(p.path for p in written)
        head = f"job {e.job_id} rank {e.rank}: automatic trace {summary.trace_id}"
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


def _host_notes(result: JobTraceResult) -> list[str]:
    """The peers whose ranks were not traced, and why."""
    return [f"{h.node.name}: {h.reason}" for h in result.hosts if h.outcome is not HostOutcome.OK]
