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
saying why. Only the ranks on this node are traced: the verdict compares them alone
(docs/detection.md, "Automatic trace").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from bpfdyno.analysis.verdict import verdict_text
from bpfdyno.client.cluster.jobtrace import plan_start_time_ms
from bpfdyno.core.errors import RequestError
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.detection.events import EventLog
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.traces import NO_ITERATIONS, TraceSpec, TraceSummary
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.requests import TraceRequest

log = logging.getLogger("bpfdyno.detection")


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
        """
        self._tracing = tracing
        self._iterations = iterations
        self._every_s = every_s
        self._events = events
        self._host = host
        self._job_ranks = job_ranks
        self._seconds = seconds
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
        log.warning(
            "detection: traced job %s for %s after rank %d was confirmed a "
            "straggler: trace %s, %d processes",
            e.job_id,
            self._length(),
            e.rank,
            res.trace_id,
            len(res.triggered),
        )
        task = asyncio.get_running_loop().create_task(self._follow(e, res.trace_id))
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

    def traced_event(self, e: DetectionEvent, summary: TraceSummary) -> DetectionEvent:
        """The ``traced`` event of confirmation ``e``'s trace, from its summary."""
        written = [p for p in summary.processes if not p.error]
        files = tuple(p.path for p in written)
        head = f"job {e.job_id} rank {e.rank}: automatic trace {summary.trace_id}"
        if not written or summary.verdict is None:
            why = "; ".join(p.error for p in summary.processes) or "no process was traced"
            return DetectionEvent(
                DetectionKind.TRACED,
                e.job_id,
                e.rank,
                e.pid,
                self._host,
                time.time(),
                summary=f"{head}: no file written, no verdict: {why}",
                trace_id=summary.trace_id,
            )
        v = summary.verdict
        return DetectionEvent(
            DetectionKind.TRACED,
            e.job_id,
            e.rank,
            e.pid,
            self._host,
            time.time(),
            summary=f"{head} of {len(files)} rank(s) on this node: verdict: {v.headline}",
            trace_id=summary.trace_id,
            trace_files=files,
            verdict_text=verdict_text(v),
            verdict=v,
        )
