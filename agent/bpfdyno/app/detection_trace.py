"""The automatic trace on a confirmed straggler (opt-in: ``[detection] auto_trace``).

When the detection confirms a straggler, the job's ranks on this node are traced for
``auto_trace_iterations`` steps, as the agent's own request (``in-process``: audited like any
other, under the daemon's identity), into the agent's trace directory (``[tracing]``: where
the operator's configuration puts traces for requests that name no file). At most one trace
per job per ``auto_trace_every_s``; a refusal (the job's ranks busy with a trace, say) is
logged and counted, never retried before the window passes. The events come from the
collector's thread; the trace starts on the event loop, where the tracing service lives.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from bpfdyno.core.errors import RequestError
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.requests import TraceRequest

log = logging.getLogger("bpfdyno.detection")


class AutoTrace:
    """A component: starts a trace of a job when one of its ranks is confirmed a straggler."""

    name = "detection_auto_trace"

    def __init__(self, tracing: TracingService, iterations: int, every_s: float) -> None:
        self._tracing = tracing
        self._iterations = iterations
        self._every_s = every_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: dict[str, float] = {}  # job -> monotonic time of its last trace
        self.started: list[str] = []  # trace ids
        self.refused = 0

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def stop(self) -> None:
        self._loop = None

    def statuses(self) -> list[PartStatus]:
        return [
            PartStatus(
                self.name,
                PartState.OK,
                f"traces a job's ranks here for {self._iterations} iterations when one is a "
                f"confirmed straggler, at most once per {self._every_s:g} s per job; "
                f"{len(self.started)} started, {self.refused} refused",
                errors=self.refused,
            )
        ]

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
        # A SLURM job id names the job; without one, the confirmed rank's own process.
        by_job = e.job_id.isdigit()
        spec = TraceSpec(
            iterations=self._iterations,
            job_id=int(e.job_id) if by_job else 0,
            pids=() if by_job else (e.pid,),
        )
        req = TraceRequest(job_id=spec.job_id, pids=spec.pids, options=spec)
        try:
            res = self._tracing.start_trace(req)  # no requester: the agent's own, audited
        except RequestError as err:
            self.refused += 1
            log.warning("detection: automatic trace of job %s refused: %s", e.job_id, err)
            return
        self.started.append(res.trace_id)
        log.warning(
            "detection: traced job %s for %d iterations after rank %d was confirmed a "
            "straggler: trace %s, %d processes",
            e.job_id,
            self._iterations,
            e.rank,
            res.trace_id,
            len(res.triggered),
        )
