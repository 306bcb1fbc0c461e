"""What a metric is: its declaration (`MetricSpec`), one observed value (`Sample`), and the
per-source tables metrics are declared in (`MetricTable`).

Every metric is declared once, in its source's ``metrics`` module; `bpfdyno.core.catalog`
assembles those tables into the one catalog that the gRPC API, the docs and every exporter
read, so no sink can silently drop a metric and every metric carries its unit.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from bpfdyno.core.budget import ESTIMATE_LABEL


class MetricKind(enum.Enum):
    """How a metric's value behaves over time."""

    GAUGE = "gauge"  # a level: memory used, temperature
    RATE = "rate"  # a per-second rate computed from cumulative counters over one interval
    RATIO = "ratio"  # a fraction 0..1 of something over one interval
    COUNTER = "counter"  # monotonically increasing total since a known start
    HISTOGRAM = "histogram"  # cumulative counts per bucket since a known start, with sum


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric's declaration.

    Attributes:
        name: snake_case name ending in its unit (``_bytes``, ``_ratio``, ``_per_second``...).
        kind: how the value behaves over time.
        unit: the unit spelled out for docs and exporters ("bytes", "ratio", "1/s", ...).
        help: one sentence: what it measures and where it comes from.
        labels: names of the labels every sample of this metric carries, in order.
        source: the collector that emits it (for docs and status).
    """

    name: str
    kind: MetricKind
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    source: str = ""


Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One observed value of a declared metric."""

    spec: MetricSpec
    value: float
    labels: Labels = field(default=())

    @property
    def key(self) -> SeriesKey:
        return (self.spec.name, self.labels)


SeriesKey = tuple[str, Labels]


@dataclass(frozen=True, slots=True)
class HistogramSample:
    """One cumulative histogram of a declared `MetricKind.HISTOGRAM` metric.

    Bucket ``i`` counts the observations below ``upper_bounds[i]`` and at or above the bound
    before it; the last count (one more than there are bounds) is everything above the
    last bound. Counts, sum and count are cumulative since the source started, in the
    metric's unit.

    Attributes:
        spec: the declaration.
        upper_bounds: finite bucket bounds, ascending.
        counts: observations per bucket (not cumulative across buckets), ``len(upper_bounds)
            + 1`` of them.
        sum: the sum of every observation.
        labels: as for `Sample`.
    """

    spec: MetricSpec
    upper_bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    labels: Labels = field(default=())

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.upper_bounds) + 1:
            raise ValueError(
                f"histogram {self.spec.name}: {len(self.counts)} counts for "
                f"{len(self.upper_bounds)} bounds; give one count more than bounds (+Inf)"
            )

    @property
    def count(self) -> int:
        """Every observation (the +Inf bucket of the cumulative form)."""
        return sum(self.counts)

    @property
    def key(self) -> SeriesKey:
        return (self.spec.name, self.labels)


@dataclass(frozen=True, slots=True)
class Round:
    """One collection round of one collector, as published to exporters and streams.

    ``histograms`` reach the exporters only: the store and the metric API keep scalar
    series (a histogram's summary, such as its quantiles, is declared as gauges beside it).
    """

    collector: str
    ts: float  # wall-clock epoch seconds
    samples: Sequence[Sample]
    histograms: Sequence[HistogramSample] = ()


class MetricTable:
    """The metrics of one source, declared in that source's ``metrics`` module and nowhere else.

    `bpfdyno.core.catalog` assembles every table into the one catalog the API, the docs and
    every exporter read; a test fails when a metric is declared anywhere else.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self._specs: dict[str, MetricSpec] = {}

    def declare(
        self, name: str, kind: MetricKind, unit: str, help: str, labels: Iterable[str] = ()
    ) -> MetricSpec:
        """Declare one metric of this source; the same name twice is a programming error."""
        if name in self._specs:
            raise ValueError(f"metric {name!r} is declared twice; declare each metric once")
        spec = MetricSpec(name, kind, unit, help, tuple(labels), self.source)
        self._specs[name] = spec
        return spec

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)


def sample(
    spec: MetricSpec, value: float, labels: Mapping[str, str] | None = None, estimate: str = ""
) -> Sample:
    """Build a sample, checking its labels against the declaration.

    Args:
        spec: the declaration.
        value: the value (NaN: not available this round).
        labels: one value for each label the declaration names, in its order.
        estimate: how the value was estimated, when it is not exact (the overhead budget
            sampled its source): the series then carries the label ``estimate`` saying so,
            on top of the declared ones, and is a series of its own. "" for exact values.

    Raises:
        ValueError: the label names differ from the ones declared for ``spec``.
    """
    extra = ((ESTIMATE_LABEL, estimate),) if estimate else ()
    if labels:
        if tuple(labels) != spec.labels:
            raise ValueError(
                f"metric {spec.name} declares labels {spec.labels}, got {tuple(labels)}"
            )
        return Sample(spec, float(value), tuple((k, str(v)) for k, v in labels.items()) + extra)
    if spec.labels:
        raise ValueError(f"metric {spec.name} needs labels {spec.labels}")
    return Sample(spec, float(value), extra)
