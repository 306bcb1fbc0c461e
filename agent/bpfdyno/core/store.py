"""Bounded in-memory history of every metric series, and the live fan-out of new rounds.

Answers the two questions the API asks: the latest value of each series, and each series'
points inside a time window. Memory is bounded twice: each series keeps at most
``history_s / interval_s`` points, and the number of series is capped (the least recently
updated series is evicted first, so a churn of short-lived label values — NICs, disks, GPUs
coming and going — cannot grow memory without bound).
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
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
    __slots__ = ("points", "spec")

    def __init__(self, spec: MetricSpec, maxlen: int) -> None:
        self.spec = spec
        self.points: deque[Point] = deque(maxlen=maxlen)


class MetricStore:
    """Per-series ring buffers. Not thread-safe: owned by the daemon's event loop."""

    def __init__(self, history_s: float, interval_s: float, max_series: int = 50_000) -> None:
        if history_s <= 0 or interval_s <= 0:
            raise ValueError("history_s and interval_s must be positive")
        self.points_per_series = max(2, math.ceil(history_s / interval_s) + 1)
        self.max_series = max_series
        self._series: OrderedDict[SeriesKey, _Series] = OrderedDict()
        self.evicted_series = 0

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
            series.points.append(Point(ts, s.value))

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
        for (name, labels), series in self._series.items():
            if not series.points or not matches_any(name, names):
                continue
            last = series.points[-1]
            if newer_than is not None and last.ts < newer_than:
                continue
            out.append(SeriesView(series.spec, labels, (last,)))
        out.sort(key=lambda v: (v.spec.name, v.labels))
        return out

    def window(self, start: float, end: float, names: Sequence[str] = ()) -> list[SeriesView]:
        """Every matching series' points with ``start <= ts <= end``."""
        out: list[SeriesView] = []
        for (name, labels), series in self._series.items():
            if not matches_any(name, names):
                continue
            pts = tuple(p for p in series.points if start <= p.ts <= end)
            if pts:
                out.append(SeriesView(series.spec, labels, pts))
        out.sort(key=lambda v: (v.spec.name, v.labels))
        return out


def matches_any(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` equals a pattern or starts with a pattern's prefix before ``*``."""
    if not patterns:
        return True
    for p in patterns:
        if p.endswith("*"):
            if name.startswith(p[:-1]):
                return True
        elif name == p:
            return True
    return False


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
