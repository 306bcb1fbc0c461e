"""What the pull and push exporters share: the latest round of each collector, and providers.

Prometheus (scraped) and OTLP (pushed on its own schedule) export *current* values, not
every round: each keeps the latest round of every collector here and, when it exports,
adds the samples of its providers (the process table's rows), so what it exports is
bounded by the catalog and the process table, never by history or process churn.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from bpfdyno.core.catalog import Catalog
from bpfdyno.core.metrics import (
    HistogramSample,
    MetricKind,
    MetricSpec,
    Round,
    Sample,
    SeriesKey,
)

log = logging.getLogger(__name__)

#: Samples computed when an export happens (e.g. the process table's rows).
SampleProvider = Callable[[], Sequence[Sample]]

#: A collector whose last round is older than this many of its own intervals (and older
#: than `MIN_STALE_S`) has stopped; its values are no longer exported.
STALE_INTERVALS = 3
MIN_STALE_S = 10.0


@dataclass(frozen=True, slots=True)
class ExportView:
    """Everything one export holds, each series once."""

    ts: float
    samples: tuple[Sample, ...]
    histograms: tuple[HistogramSample, ...]

    def by_metric(self, catalog: Catalog | None = None) -> Iterator[MetricSeries]:
        """The metrics of ``catalog`` this export has series of, in catalog order (by name).

        Samples of metrics that are not in ``catalog`` are left out (they cannot be typed);
        a test keeps every emitted metric declared. Without a catalog, the samples' own
        specs are the catalog.
        """
        samples: dict[str, list[Sample]] = defaultdict(list)
        for s in self.samples:
            samples[s.spec.name].append(s)
        histograms: dict[str, list[HistogramSample]] = defaultdict(list)
        for h in self.histograms:
            histograms[h.spec.name].append(h)
        specs: Iterable[MetricSpec] = catalog if catalog is not None else _specs_of(self)
        for spec in specs:
            if spec.kind is MetricKind.HISTOGRAM:
                if spec.name in histograms:
                    yield MetricSeries(spec, [], histograms[spec.name])
            elif spec.name in samples:
                yield MetricSeries(spec, samples[spec.name], [])


def _specs_of(view: ExportView) -> list[MetricSpec]:
    """The specs of a view's samples and histograms, by name (the order a catalog has)."""
    specs = {s.spec.name: s.spec for s in view.samples}
    specs.update((h.spec.name, h.spec) for h in view.histograms)
    return [specs[name] for name in sorted(specs)]


class MetricSeries(NamedTuple):
    """One metric's series in an export: samples, or histograms for a histogram metric."""

    spec: MetricSpec
    samples: list[Sample]
    histograms: list[HistogramSample]


class LatestRounds:
    """The latest round of each collector; written on the event loop, read by exporters.

    Args:
        providers: called at every export for samples that are not in rounds.
        clock: wall-clock seconds (injectable for tests).
    """

    def __init__(
        self, providers: Sequence[SampleProvider] = (), clock: Callable[[], float] = time.time
    ) -> None:
        self._providers = tuple(providers)
        self._clock = clock
        self._lock = threading.Lock()
        self._rounds: dict[str, Round] = {}
        self._gaps: dict[str, float] = {}
        self._logged: set[str] = set()

    def submit(self, rnd: Round) -> None:
        """Keep ``rnd`` as its collector's latest (never blocks for long: one dict update)."""
        with self._lock:
            prev = self._rounds.get(rnd.collector)
            if prev is not None and rnd.ts > prev.ts:
                self._gaps[rnd.collector] = rnd.ts - prev.ts
            self._rounds[rnd.collector] = rnd

    def view(self) -> ExportView:
        """The current values: fresh rounds, then the providers' samples; one per series."""
        now = self._clock()
        with self._lock:
            rounds = [
                r
                for name, r in self._rounds.items()
                if now - r.ts <= max(MIN_STALE_S, STALE_INTERVALS * self._gaps.get(name, 0.0))
            ]
        samples: dict[SeriesKey, Sample] = {}
        histograms: dict[SeriesKey, HistogramSample] = {}
        for r in rounds:
            for s in r.samples:
                if s.value == s.value:  # NaN: not available this round
                    samples[s.key] = s
            for h in r.histograms:
                histograms[h.key] = h
        for provider in self._providers:
            try:
                extra = provider()
            except Exception as e:  # a provider's failure costs its samples, not the export
                msg = f"{type(e).__name__}: {e}"
                if msg not in self._logged and len(self._logged) < 100:
                    self._logged.add(msg)
                    log.warning("exporter sample provider failed: %s", msg)
                continue
            for s in extra:
                if s.value == s.value:
                    samples[s.key] = s
        return ExportView(now, tuple(samples.values()), tuple(histograms.values()))
