"""The detection events the agent holds and hands to watchers.

The collector's thread appends; watchers (gRPC streams on the event loop) each get a bounded
queue, filled from the loop (``call_soon_threadsafe``). A watcher that does not keep up loses
its oldest undelivered events, never the agent's memory; the log itself keeps the newest
``max_events``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import Counter, deque
from collections.abc import AsyncGenerator, Callable, Iterable

from bpfdyno.rpc.detection import DetectionEvent

log = logging.getLogger("bpfdyno.detection")

#: Events queued for one watcher before its oldest are dropped.
WATCHER_QUEUE = 256


class EventLog:
    def __init__(self, max_events: int = 256) -> None:
        #: Called with each batch of new events, on the adding thread (the automatic trace).
        self.listeners: list[Callable[[list[DetectionEvent]], None]] = []
        self._events: deque[DetectionEvent] = deque(maxlen=max_events)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()  # events ever added, by kind
        self._watchers: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue[DetectionEvent]]] = set()

    def add(self, events: Iterable[DetectionEvent]) -> None:
        """Keep ``events``, log each in one line, and hand them to every watcher and
        listener."""
        events = list(events)
        for listener in self.listeners:
            listener(events)
        for e in events:
            log.warning("detection: %s (host %s, pid %d)", e.summary, e.host, e.pid)
            with self._lock:
                self._events.append(e)
                self._counts[e.kind.value] += 1
                watchers = list(self._watchers)
            for loop, queue in watchers:
                with contextlib.suppress(RuntimeError):  # its loop closed: the watcher is gone
                    loop.call_soon_threadsafe(_put, queue, e)

    def counts(self) -> dict[str, int]:
        """How many events of each kind were ever added (the collector's and the automatic
        trace's alike), by kind word."""
        with self._lock:
            return dict(self._counts)

    def held(self, job_id: str = "") -> list[DetectionEvent]:
        """The events still held, oldest first (only ``job_id``'s when given)."""
        with self._lock:
            return [e for e in self._events if not job_id or e.job_id == job_id]

    async def watch(self, job_id: str = "") -> AsyncGenerator[DetectionEvent]:
        """The held events, then each new one, until the caller stops iterating."""
        queue: asyncio.Queue[DetectionEvent] = asyncio.Queue(WATCHER_QUEUE)
        entry = (asyncio.get_running_loop(), queue)
        with self._lock:
            held = [e for e in self._events if not job_id or e.job_id == job_id]
            self._watchers.add(entry)
        try:
            for e in held:
                yield e
            while True:
                e = await queue.get()
                if not job_id or e.job_id == job_id:
                    yield e
        finally:
            with self._lock:
                self._watchers.discard(entry)


def _put(queue: asyncio.Queue[DetectionEvent], event: DetectionEvent) -> None:
    if queue.full():
        queue.get_nowait()  # a slow watcher loses its oldest event
    queue.put_nowait(event)
