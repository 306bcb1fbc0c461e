"""Bounded in-memory history of every metric series, and the live fan-out of new rounds.

Answers the two questions the API asks: the latest value of each series, and each series'
points inside a time window. Memory is bounded twice: each series keeps at most
``history_s / interval_s`` points, and the number of series is capped (the least recently
updated series is evicted first, so a churn of short-lived label values — NICs, disks, GPUs
coming and going — cannot grow memory without bound).

Points are kept as two ring buffers of C doubles per series (timestamps and values, 16
bytes a point), not as one Python object each (about 80 bytes with its deque slot): a node
with many CPUs has thousands of per-CPU series, and 15 minutes of them were most of the
agent's heap. `Point` objects are made only for the points a query returns.
"""

from __future__ import annotations

import asyncio
import functools
import math
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from bpfdyno.core.metrics import MetricSpec, Round, Sample, SeriesKey
from bpfdyno.core.status import PartState, PartStatus


@dataclass(frozen=True, slots=True)
class Point:
    """One timestamped value; ``ts`` is wall-clock epoch seconds."""

    ts: float
    value: float


@dataclass(frozen=True, slots=True)
class SeriesView:
    """A read-only copy of (part of) one series, safe to hand to another thread."""

    spec: MetricSpec
    labels: tuple[tuple[str, str], ...]
    points: tuple[Point, ...]


class _Series:
    """One series' last ``capacity`` points, oldest first, in two rings of doubles."""

    __slots__ = ("_capacity", "_next", "_ts", "_values", "count", "spec")

    def __init__(self, spec: MetricSpec, capacity: int) -> None:
        self.spec = spec
        self._ts = array("d")
        self._values = array("d")
        self._next = 0  # where the next point goes once the rings are full
        self.count = 0
        self._capacity = capacity

    @property
    def capacity(self) -> int:
        return self._capacity

    def append(self, ts: float, value: float) -> None:
        if len(self._ts) < self._capacity:
            self._ts.append(ts)
            self._values.append(value)
        else:
            self._ts[self._next] = ts
            self._values[self._next] = value
            self._next = (self._next + 1) % self._capacity
        self.count = len(self._ts)

    def last(self) -> Point | None:
        if not self._ts:
            return None
        i = (self._next - 1) % len(self._ts)
        return Point(self._ts[i], self._values[i])

    def points(self) -> Iterator[tuple[float, float]]:
        n = len(self._ts)
        for k in range(n):
            i = (self._next + k) % n
            yield self._ts[i], self._values[i]

    def resize(self, capacity: int) -> None:
        """Keep at most ``capacity`` points from now on (the newest, when shrinking)."""
        kept = list(self.points())[-capacity:]
        self._ts = array("d", (t for t, _ in kept))
        self._values = array("d", (v for _, v in kept))
        self._next = 0
        self.count = len(self._ts)
        self._capacity = capacity


class MetricStore:
    """Per-series ring buffers. Not thread-safe: owned by the daemon's event loop."""

    def __init__(self, history_s: float, interval_s: float, max_series: int = 50_000) -> None:
        if history_s <= 0 or interval_s <= 0:
            raise ValueError("history_s and interval_s must be positive")
        self.interval_s = interval_s
        self.points_per_series = max(2, math.ceil(history_s / interval_s) + 1)
        self.max_series = max_series
        self._series: OrderedDict[SeriesKey, _Series] = OrderedDict()
        self.evicted_series = 0

    @property
    def history_s(self) -> float:
        """How far back each series reaches at the default interval."""
        return (self.points_per_series - 1) * self.interval_s

    def set_history(self, history_s: float) -> None:
        """Keep ``history_s`` seconds from now on (shrinking drops the oldest points)."""
        self.points_per_series = max(2, math.ceil(history_s / self.interval_s) + 1)
        for series in self._series.values():
            if series.capacity != self.points_per_series:
                series.resize(self.points_per_series)

    def point_count(self) -> int:
        """Points held over every series (what the history costs in memory: 16 B each)."""
        return sum(s.count for s in self._series.values())

    def __len__(self) -> int:
        return len(self._series)

    def append(self, ts: float, samples: Iterable[Sample]) -> None:
        """Record ``samples`` observed at wall-clock time ``ts``."""
        for s in samples:
            key = s.key
            series = self._series.get(key)
            if series is None:
                series = _Series(s.spec, self.points_per_series)
                self._series[key] = series
                if len(self._series) > self.max_series:
                    self._series.popitem(last=False)
                    self.evicted_series += 1
            else:
                self._series.move_to_end(key)
            if math.isnan(s.value):
                # "not available" is represented by the series having no point for this
                # round, never by a fake value.
                continue
            series.append(ts, s.value)

    def latest(
        self, names: Sequence[str] = (), newer_than: float | None = None
    ) -> list[SeriesView]:
        """The last point of every matching series.

        Args:
            names: metric names or name prefixes ending in ``*``; empty matches all.
            newer_than: leave out series whose last point is older than this epoch time
                (a NIC that disappeared stops being reported).
        """
        out: list[SeriesView] = []
        wanted = name_filter(names)
        for (name, labels), series in self._series.items():
            if not series.count or not wanted.matches(name):
                continue
            last = series.last()
            if last is None or (newer_than is not None and last.ts < newer_than):
                continue
            out.append(SeriesView(series.spec, labels, (last,)))
        out.sort(key=lambda v: (v.spec.name, v.labels))
        return out

    def window(self, start: float, end: float, names: Sequence[str] = ()) -> list[SeriesView]:
        """Every matching series' points with ``start <= ts <= end``."""
        out: list[SeriesView] = []
        wanted = name_filter(names)
        for (name, labels), series in self._series.items():
            if not wanted.matches(name):
                continue
            pts = tuple(Point(t, v) for t, v in series.points() if start <= t <= end)
            if pts:
                out.append(SeriesView(series.spec, labels, pts))
        out.sort(key=lambda v: (v.spec.name, v.labels))
        return out


def matches_any(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` equals a pattern or starts with a pattern's prefix before ``*``."""
    return name_filter(patterns).matches(name)


class NameFilter:
    """Metric-name patterns made into an index: a set of exact names and the prefixes
    (shortest only: one that starts with another adds nothing), and every answer kept per
    name (the catalog holds a few hundred names), so matching a series costs a dict lookup
    however many patterns a request holds.

    Args:
        patterns: metric names or prefixes ending in ``*``; none: everything matches.
    """

    def __init__(self, patterns: Iterable[str]) -> None:
        exact: set[str] = set()
        prefixes: list[str] = []
        for p in sorted(set(patterns)):
            if p.endswith("*"):
                head = p[:-1]
                if not prefixes or not head.startswith(prefixes[-1]):
                    prefixes.append(head)  # sorted: a covering prefix comes just before
            else:
                exact.add(p)
        self.everything = not exact and not prefixes
        self._exact = frozenset(exact)
        self._prefixes = tuple(prefixes)
        self._seen: dict[str, bool] = {}

    def matches(self, name: str) -> bool:
        if self.everything:
            return True
        hit = self._seen.get(name)
        if hit is None:
            hit = name in self._exact or name.startswith(self._prefixes)
            if len(self._seen) >= _MAX_NAMES_SEEN:
                self._seen.clear()  # a bound against name churn (cheap to refill)
            self._seen[name] = hit
        return hit


_MAX_NAMES_SEEN = 4096


@functools.lru_cache(maxsize=256)
def _cached_filter(patterns: tuple[str, ...]) -> NameFilter:
    return NameFilter(patterns)


def name_filter(patterns: Sequence[str]) -> NameFilter:
    """The index of ``patterns``, made once per distinct set (the TUI, each stream and each
    scrape ask with the same few sets again and again)."""
    return _cached_filter(tuple(sorted(set(patterns))))


class RoundPublisher:
    """Fans rounds out to stream subscribers; a slow subscriber loses its oldest rounds."""

    def __init__(self, queue_size: int = 64) -> None:
        self._subscribers: set[asyncio.Queue[Round]] = set()
        self._queue_size = queue_size
        self.dropped = 0

    def subscribe(self) -> asyncio.Queue[Round]:
        q: asyncio.Queue[Round] = asyncio.Queue(self._queue_size)
        self._subscribers.add(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[Round]) -> None:
        self._subscribers.discard(q)

    def status(self) -> PartStatus:
        """The metric streams' part of `status`: subscribers, and rounds shed for slow ones."""
        return PartStatus(
            "metric_streams",
            PartState.OK,
            f"{len(self._subscribers)} subscribers; {self.dropped} rounds dropped for readers "
            f"more than {self._queue_size} rounds behind",
            errors=self.dropped,
        )

    def publish(self, rnd: Round) -> None:
        for q in self._subscribers:
            if q.full():
                q.get_nowait()
                self.dropped += 1
            q.put_nowait(rnd)


K = TypeVar("K")
V = TypeVar("V")


class SharedResults(Generic[K, V]):
    """The result of one computation per (object, key), shared by every caller that asks.

    Every metric stream subscriber receives the same round; filtering it and converting it to
    a message once, instead of once per subscriber, keeps the event loop free for the Kineto
    endpoint while many clients stream. Entries are keyed by the object's identity (the object
    is kept alive with its entry, so an id is never reused while cached); the oldest are
    dropped beyond ``size``.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[int, K], tuple[object, V]] = OrderedDict()

    def get(self, obj: object, key: K, compute: Callable[[], V]) -> V:
        """The cached result for ``(obj, key)``, computing it on first request."""
        ident = (id(obj), key)
        hit = self._entries.get(ident)
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = compute()
        self._entries[ident] = (obj, value)
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value
