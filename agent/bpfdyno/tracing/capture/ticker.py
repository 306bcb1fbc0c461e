"""`Ticker`: a thread that calls a function at a fixed rate while there is work, and sleeps
(woken on demand) while there is none; shared by the capture's samplers (GPU, fabric)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class Ticker:
    """Calls ``tick()`` every ``interval_s`` while ``busy()`` is true.

    A tick that falls behind (a slow NVML call, a slow adapter) skips the missed deadlines
    instead of running them back to back; an exception in a tick is logged and the next tick
    comes as usual.

    Args:
        name: the thread's name.
        interval_s: seconds between ticks.
        busy: whether there is work (checked before each tick; False: sleep until `wake`).
        tick: the work of one tick.
    """

    def __init__(
        self, name: str, interval_s: float, busy: Callable[[], bool], tick: Callable[[], None]
    ) -> None:
        self._name = name
        self._interval = interval_s
        self._busy = busy
        self._tick = tick
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Ticks done and the time they took (for status and benchmarks).
        self.rounds = 0
        self.busy_s = 0.0

    @property
    def running(self) -> bool:
        """Whether the thread is started."""
        return self._thread is not None

    def start(self) -> None:
        """Start the thread (it sleeps until there is work)."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread (after the tick in progress)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def wake(self) -> None:
        """There is work now: tick without waiting for the idle sleep to end."""
        self._wake.set()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            if not self._busy():
                self._wake.wait()
                self._wake.clear()
                next_at = time.monotonic()
                continue
            t0 = time.monotonic()
            try:
                self._tick()
            except Exception:  # a bug or a device's trouble must not end the ticks for good
                log.exception("%s: a tick failed; retrying", self._name)
            self.rounds += 1
            self.busy_s += time.monotonic() - t0
            next_at += self._interval
            delay = next_at - time.monotonic()
            if delay <= 0:  # fell behind: skip, do not burst
                next_at = time.monotonic()
                delay = 0
            self._stop.wait(delay)
