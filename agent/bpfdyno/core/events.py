"""Kernel events and the flight recorder that keeps the last minutes of them.

Collectors (scheduler exec/exit, network connect/close/retransmit/reset) drain their BPF ring
buffers on their own worker threads and hand the decoded `KernelEvent`s to
`FlightRecorder.add`. The recorder keeps them bounded twice — by age and by an estimated memory
size — so a trace request can include the seconds *before* its trigger, and fans them out to
asyncio subscribers (the gRPC ``StreamEvents`` call).

Thread → loop hand-off: ``add`` may be called from any thread. It takes a lock only to update
the history, then schedules delivery to each subscriber with ``loop.call_soon_threadsafe`` on
that subscriber's own loop; the subscriber's queue is only ever touched on its loop, so no
asyncio object is shared across threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

AttrValue = int | float | str

#: Fixed part of the memory estimate of one event: the dataclass object, its int fields, the
#: attrs dict header and the deque slot, as measured with sys.getsizeof on CPython 3.11
#: (rounded up). An estimate, not an exact accounting: it only has to scale with the data.
EVENT_BASE_BYTES = 320
#: Added per attribute: the dict entry, key object and a boxed int/float value.
ATTR_BASE_BYTES = 120

#: The kind a subscriber receives when it lagged and lost events; ``attrs["count"]`` says how
#: many were dropped since the last delivery.
KIND_LOST = "events_lost"


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One rare kernel event (a process exec, a TCP retransmit...).

    Attributes:
        ts_ns: wall-clock time of the event, nanoseconds since the Unix epoch.
        kind: what happened, e.g. ``tcp_retransmit``, ``tcp_connect``, ``exec``.
        pid: the process (thread group id) it is attributed to; 0 if unknown.
        tid: the thread; 0 if unknown (events raised in softirq context).
        comm: the process name as the kernel saw it ("" if unknown).
        attrs: kind-specific details (addresses, ports, states, byte counts).
    """

    ts_ns: int
    kind: str
    pid: int
    tid: int
    comm: str
    attrs: dict[str, AttrValue] = field(default_factory=dict)


#: Where a collector hands the events it decoded (the daemon's flight recorder), in batches.
EventSink = Callable[[Sequence[KernelEvent]], None]


def estimate_event_bytes(ev: KernelEvent) -> int:
    """Estimated memory one stored event takes, for the recorder's memory cap.

    Deterministic (depends only on the event's content), so caps are reproducible.
    """
    size = EVENT_BASE_BYTES + len(ev.kind) + len(ev.comm)
    for key, value in ev.attrs.items():
        size += ATTR_BASE_BYTES + len(key)
        if isinstance(value, str):
            size += len(value)
    return size


class MonotonicClock:
    """Converts CLOCK_MONOTONIC nanoseconds (``bpf_ktime_get_ns``) to wall-clock epoch ns.

    The offset is measured once, when the object is made: the wall clock read between two
    monotonic reads, taking the tightest of a few tries, so the error is below a microsecond
    on an idle machine. Measured once on purpose: every event of a run then shares one
    timeline, even if NTP steps the wall clock later.
    """

    def __init__(self, tries: int = 5) -> None:
        best_gap = None
        offset = 0
        for _ in range(max(1, tries)):
            m0 = time.monotonic_ns()
            wall = time.time_ns()
            m1 = time.monotonic_ns()
            gap = m1 - m0
            if best_gap is None or gap < best_gap:
                best_gap = gap
                offset = wall - (m0 + gap // 2)
        self.offset_ns = offset

    def to_wall_ns(self, monotonic_ns: int) -> int:
        """Wall-clock epoch nanoseconds for a CLOCK_MONOTONIC timestamp."""
        return monotonic_ns + self.offset_ns


@dataclass(frozen=True, slots=True)
class RecorderStats:
    """Counters of a flight recorder, for status and metrics."""

    events: int
    bytes: int
    added: int
    evicted_age: int
    evicted_memory: int
    subscribers: int
    subscriber_drops: int
    oldest_ts_ns: int  # 0 when empty


class FlightRecorder:
    """A bounded, thread-safe history of kernel events with asyncio subscriptions.

    Args:
        max_age_s: events older than this (by their ``ts_ns``, against the wall clock) are
            evicted.
        max_bytes: estimated memory cap (see `estimate_event_bytes`); the oldest events are
            evicted first when a new one would take the total past it.
        clock_ns: wall-clock source in epoch ns; injectable so tests control ages exactly.
    """

    def __init__(
        self,
        max_age_s: float,
        max_bytes: int,
        clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        if max_age_s <= 0:
            raise ValueError(f"max_age_s must be positive, got {max_age_s}")
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, got {max_bytes}")
        self.max_age_ns = int(max_age_s * 1e9)
        self.max_bytes = max_bytes
        self._clock_ns = clock_ns
        self._lock = threading.Lock()
        # Arrival order. Batches from different collectors may interleave slightly out of
        # timestamp order; `since` sorts its result, eviction by age tolerates it.
        self._events: deque[tuple[KernelEvent, int]] = deque()
        self._bytes = 0
        self._added = 0
        self._evicted_age = 0
        self._evicted_memory = 0
        self._subscribers: set[Subscription] = set()
        self._closed_subscriber_drops = 0

    # -- history -------------------------------------------------------------------------

    def add(self, events: Iterable[KernelEvent]) -> None:
        """Record ``events`` and deliver them to subscribers. Safe from any thread."""
        batch = list(events)
        if not batch:
            return
        with self._lock:
            for ev in batch:
                size = estimate_event_bytes(ev)
                self._events.append((ev, size))
                self._bytes += size
                self._added += 1
            while self._bytes > self.max_bytes and self._events:
                _, size = self._events.popleft()
                self._bytes -= size
                self._evicted_memory += 1
            self._evict_old_locked()
            subscribers = list(self._subscribers)
        for sub in subscribers:
            sub._offer(batch)

    def since(self, ts_ns: int, kinds: Collection[str] | None = None) -> list[KernelEvent]:
        """Events with ``ts_ns >= ts_ns`` (and of ``kinds``, if given), oldest first."""
        with self._lock:
            self._evict_old_locked()
            out = [
                ev
                for ev, _ in self._events
                if ev.ts_ns >= ts_ns and (not kinds or ev.kind in kinds)
            ]
        out.sort(key=lambda e: e.ts_ns)
        return out

    def stats(self) -> RecorderStats:
        """Sizes and eviction counters (after evicting what has aged out)."""
        with self._lock:
            self._evict_old_locked()
            drops = self._closed_subscriber_drops + sum(s.dropped for s in self._subscribers)
            return RecorderStats(
                events=len(self._events),
                bytes=self._bytes,
                added=self._added,
                evicted_age=self._evicted_age,
                evicted_memory=self._evicted_memory,
                subscribers=len(self._subscribers),
                subscriber_drops=drops,
                oldest_ts_ns=min((ev.ts_ns for ev, _ in self._events), default=0),
            )

    def _evict_old_locked(self) -> None:
        cutoff = self._clock_ns() - self.max_age_ns
        while self._events and self._events[0][0].ts_ns < cutoff:
            _, size = self._events.popleft()
            self._bytes -= size
            self._evicted_age += 1

    # -- subscriptions -------------------------------------------------------------------

    def subscribe(
        self, kinds: Collection[str] | None = None, queue_size: int = 1024
    ) -> Subscription:
        """Start receiving events added from now on. Call from the asyncio loop thread.

        Use as ``async with recorder.subscribe() as sub: async for ev in sub: ...``; when the
        reader falls ``queue_size`` events behind, the oldest queued events are dropped and
        the reader gets one `KIND_LOST` event saying how many.
        """
        sub = Subscription(self, asyncio.get_running_loop(), kinds, queue_size)
        with self._lock:
            self._subscribers.add(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscribers:
                self._subscribers.discard(sub)
                self._closed_subscriber_drops += sub.dropped


class Subscription:
    """One reader's bounded queue of events; iterate it on the loop that created it."""

    def __init__(
        self,
        recorder: FlightRecorder,
        loop: asyncio.AbstractEventLoop,
        kinds: Collection[str] | None,
        queue_size: int,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be at least 1, got {queue_size}")
        self._recorder = recorder
        self._loop = loop
        self._kinds = frozenset(kinds) if kinds else None
        self._queue: deque[KernelEvent] = deque()
        self._queue_size = queue_size
        self._wakeup = asyncio.Event()
        self._closed = False
        self._unreported_drops = 0
        #: Events this reader lost because it lagged (oldest dropped first).
        self.dropped = 0

    def _offer(self, batch: list[KernelEvent]) -> None:
        """Called on the producer's thread: filter, then hop onto the subscriber's loop."""
        if self._closed:
            return
        wanted = batch if self._kinds is None else [e for e in batch if e.kind in self._kinds]
        if not wanted:
            return
        # The loop may have been closed under us (a client went away during shutdown); then
        # there is nobody left to deliver to.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._push, wanted)

    def _push(self, events: list[KernelEvent]) -> None:
        """Runs on the subscriber's loop: the only place its queue grows."""
        if self._closed:
            return
        self._queue.extend(events)
        overflow = len(self._queue) - self._queue_size
        if overflow > 0:
            for _ in range(overflow):
                self._queue.popleft()
            self.dropped += overflow
            self._unreported_drops += overflow
        self._wakeup.set()

    def __aiter__(self) -> AsyncIterator[KernelEvent]:
        return self

    async def __anext__(self) -> KernelEvent:
        while not self._queue and not self._unreported_drops:
            if self._closed:
                raise StopAsyncIteration
            self._wakeup.clear()
            await self._wakeup.wait()
        if self._unreported_drops:
            count = self._unreported_drops
            self._unreported_drops = 0
            return KernelEvent(time.time_ns(), KIND_LOST, 0, 0, "", {"count": count})
        return self._queue.popleft()

    def close(self) -> None:
        """Stop receiving; a pending ``async for`` ends after the queued events.

        Call on the subscriber's loop (the queue and its wake-up event live there).
        """
        if not self._closed:
            self._closed = True
            self._recorder._unsubscribe(self)
            self._wakeup.set()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
