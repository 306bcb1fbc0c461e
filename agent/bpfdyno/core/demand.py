"""Who reads the agent's data, and when they last did: what sets the collection cadence.

While nobody reads, the kernel keeps counting (its counters are cumulative) and the daemon
reads them at a slow cadence (``[daemon] idle_interval_s``): nothing summed is lost, the
rates cover longer intervals. A read (a metrics query, a process listing, a stream, a
Prometheus scrape) is noted here: it wakes the collectors whose last round is older than
one normal round, and keeps the normal cadence for `HOLD_S` after the last read, or for as
long as a stream is open. Work done for readers is theirs (`bpfdyno.core.budget.REQUESTED`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable

#: The normal cadence is kept this long after the last read (a `top` or a scraper reads
#: every few seconds; one read and nothing after it goes back to the slow cadence soon).
HOLD_S = 30.0
#: Readers remembered by name (past it, the longest-quiet is forgotten).
_MAX_READERS = 1024


class ReadDemand:
    """When the agent's data was last read, by whom, and the streams open now; thread-safe.

    Args:
        hold_s: how long after a read the normal cadence is kept.
        clock: monotonic seconds.
    """

    def __init__(self, hold_s: float = HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.hold_s = hold_s
        self._clock = clock
        self._lock = threading.Lock()
        self._readers: dict[str, float] = {}
        self._streams: dict[str, int] = {}
        self._last = -float("inf")
        self._active_since = 0.0  # when the current spell of reading began
        #: The daemon's slow interval (`bind`).
        self.idle_interval_s = 0.0
        #: Called (on the reader's thread) at every read: the daemon wakes idle collectors.
        self.listeners: list[Callable[[], None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fresh: Callable[[float], Awaitable[None]] | None = None

    def bind(
        self,
        loop: asyncio.AbstractEventLoop,
        fresh: Callable[[float], Awaitable[None]],
        idle_interval_s: float,
    ) -> None:
        """The daemon's loop, its wait for rounds no older than one normal round
        (`bpfdyno.app.daemon.Daemon.fresh`), and its slow interval."""
        self._loop, self._fresh, self.idle_interval_s = loop, fresh, idle_interval_s

    def active_for(self) -> float:
        """Seconds someone has been reading without a pause longer than the hold (0: nobody
        reads now)."""
        now = self._clock()
        with self._lock:
            if not self._streams and now - self._last >= self.hold_s:
                return 0.0
            return now - self._active_since

    async def read(self, who: str, within_s: float) -> None:
        """``who`` reads now (on the daemon's loop): note it, and return once the data is no
        older than one normal round, at most ``within_s`` later."""
        self.note(who)
        if self._fresh is not None:
            await self._fresh(within_s)

    def read_blocking(self, who: str, within_s: float) -> None:
        """`read` from another thread (an exporter's HTTP thread): waits at most
        ``within_s`` (and not at all before the daemon runs). While someone has read for
        longer than the slow interval, every collector is at the normal cadence: nothing to
        wait for, and no trip through the loop (a scraper reads every few seconds)."""
        steady = self.active_for() > self.idle_interval_s
        self.note(who)
        loop, fresh = self._loop, self._fresh
        if steady or loop is None or fresh is None or loop.is_closed():
            return

        async def wait() -> None:
            await fresh(within_s)

        # Past the wait, the reader is answered with what there is: the rounds are late.
        with contextlib.suppress(
            concurrent.futures.TimeoutError, concurrent.futures.CancelledError, RuntimeError
        ):
            asyncio.run_coroutine_threadsafe(wait(), loop).result(within_s + 1.0)

    def note(self, who: str) -> None:
        """``who`` read now: wake the idle collectors and keep the normal cadence."""
        now = self._clock()
        with self._lock:
            if who not in self._readers and len(self._readers) >= _MAX_READERS:
                del self._readers[min(self._readers, key=self._readers.__getitem__)]
            self._readers[who] = now
            if not self._streams and now - self._last >= self.hold_s:
                self._active_since = now
            self._last = now
        for fn in self.listeners:
            fn()

    def stream_opened(self, who: str) -> None:
        """``who`` opened a stream: a reader for as long as it stays open."""
        self.note(who)
        with self._lock:
            self._streams[who] = self._streams.get(who, 0) + 1

    def stream_closed(self, who: str) -> None:
        with self._lock:
            left = self._streams.get(who, 0) - 1
            if left > 0:
                self._streams[who] = left
            else:
                self._streams.pop(who, None)
            # The hold counts from the stream's end.
            self._readers[who] = self._last = self._clock()

    def readers(self) -> list[str]:
        """Who reads now: streams open, reads within the hold."""
        now = self._clock()
        with self._lock:
            recent = {w for w, t in self._readers.items() if now - t < self.hold_s}
            return sorted(recent | self._streams.keys())

    def active(self) -> bool:
        """Whether anyone reads now (the normal cadence)."""
        now = self._clock()
        with self._lock:
            return bool(self._streams) or now - self._last < self.hold_s
