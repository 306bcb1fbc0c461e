"""The small interface every data source implements.

A collector is created with its dependencies injected (a root directory, a library path, a
loader) so tests can substitute them. The daemon calls ``start()`` once, then ``collect()``
on its own worker thread at every deadline, then ``close()`` on shutdown.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from bpfdyno.core.budget import Reduction
from bpfdyno.core.metrics import HistogramSample, Sample
from bpfdyno.core.status import PartState

_V = TypeVar("_V")


class CollectorUnavailable(Exception):
    """Raised by ``start()`` when a capability this collector needs is missing.

    The message says what is missing *and how to fix it*; it is shown verbatim by
    ``bpfdyno status`` and ``bpfdyno doctor``.

    Attributes:
        absent: what it needs is simply not part of this host (no NVIDIA driver, not a
            Kubernetes node, no hardware PMU): normal, not a fault, so the daemon names such
            collectors in one INFO line instead of a warning each.
    """

    def __init__(self, message: str, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


class Collector(abc.ABC):
    """A data source polled on a fixed interval."""

    #: Short stable identifier, used in config (``[collectors.<name>]``) and status.
    name: str = ""
    #: Whether ``collect()`` may wait on something outside the agent (a driver call, another
    #: process's locks, as reading its /proc/PID/cmdline does). Such a collector gets a
    #: thread of its own, so a hang delays only itself; the others (procfs counters, BPF
    #: maps, perf counters) share one thread that runs their rounds together.
    may_block: bool = True

    def start(self) -> None:  # noqa: B027 - optional hook
        """Acquire resources (open files, load BPF, init NVML).

        Raises:
            CollectorUnavailable: a capability is missing; the collector stays disabled.
        """

    @abc.abstractmethod
    def collect(self) -> Sequence[Sample]:
        """Read the source once and return the samples for this interval.

        Called on the collector's own worker thread, never concurrently with itself.
        Exceptions are caught by the daemon: counted, logged once per distinct error, and
        followed by a back-off.
        """

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release everything ``start()`` acquired (detach BPF, shut NVML down)."""

    def set_due(self, due: Callable[[], None]) -> None:  # noqa: B027 - optional hook
        """Optional: ``due()`` (any thread) asks the daemon for a round now, before the
        interval is up: for a collector whose work comes when something else is ready (the
        budget, at the end of each run-statistics window). Given once it started. The
        default ignores it."""

    def health(self) -> tuple[PartState, str] | None:
        """Optional: a state to report even though ``collect()`` succeeded.

        A collector that keeps running while part of its source is gone (one GPU lost, a
        ring buffer dropping events) returns ``(PartState.DEGRADED, reason)``; None
        means "ok". Called on the collector's thread right after each successful collect.
        """
        return None

    def histograms(self) -> Sequence[HistogramSample]:
        """Optional: cumulative histograms as of the last ``collect()``, for the exporters.

        Called on the collector's thread right after each successful collect; the daemon
        puts them into that round. The default has none.
        """
        return ()

    def longest_interval_s(self) -> float:
        """The longest interval between rounds that loses nothing now: what the kernel fills
        between two rounds (a map of exited threads, a ring buffer) would fill at most half
        of it at the rate the last round saw. While nobody reads, the daemon's rounds come
        this far apart when it is shorter than its slow cadence (and longer than the normal
        one), so the machine's ordinary churn shortens the slow cadence only as far as it
        must. Called on the event loop: read only what the last round left. The default:
        nothing fills between rounds (infinite)."""
        return math.inf

    def reductions(self) -> Sequence[Reduction]:
        """Optional: the steps this collector offers the overhead budget (after ``start()``).

        Each makes the collector cheaper while keeping its answers true (see
        `bpfdyno.core.budget`); the budget takes and undoes them, the collector labels what
        became estimates. The default has none.
        """
        return ()


class ReadAt(dict[int, _V]):
    """Per-pid values that were all read at one instant, ``read_at`` (monotonic seconds).

    A consumer that turns two readings into rates divides by the time between their
    ``read_at``, not by its own schedule: the values may be older than its own update.
    """

    def __init__(self, values: Mapping[int, _V], read_at: float) -> None:
        super().__init__(values)
        self.read_at = read_at


class FillRate:
    """How fast something the kernel fills between two rounds (a map of exited threads, a
    ring buffer) filled over the last round, against what it holds: whether rounds further
    apart would overflow it (`Collector.longest_interval_s`).

    Args:
        capacity: what it holds (entries, records).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._at: float | None = None
        self._per_s = 0.0

    def saw(self, n: int, now: float) -> None:
        """A round drained ``n`` entries at ``now`` (monotonic seconds)."""
        if self._at is not None and now > self._at:
            self._per_s = n / (now - self._at)
        self._at = now

    def longest_interval_s(self) -> float:
        """The longest interval that fills at most half of it at the last round's rate (the
        other half for a burst until the next round); infinite when nothing came."""
        return self.capacity / 2 / self._per_s if self._per_s > 0 else math.inf
