"""Prometheus exporter: every catalog metric at ``http://<listen>/metrics``, off by default.

Each scrape renders the latest round of every collector plus the process table's rows
(`bpfdyno.exporters.rounds`), typed from the metric catalog:

| catalog kind | Prometheus type |
|---|---|
| counter (``_total``) | counter |
| gauge, rate (``_per_second``), ratio (``_ratio``) | gauge (the unit is in the name) |
| histogram | histogram (``_bucket{le}``, ``_sum``, ``_count``) |

Help texts are the catalog's, with the unit; base units (seconds, bytes, ratio...) that
end a name are also declared as the OpenMetrics ``# UNIT``. Series carry no timestamps, so
Prometheus' staleness handling removes a series as soon as it disappears (a process that
left the process table, a GPU that fell off the bus). Per-process series are the process
table's rows: at most ``[events] process_table_size`` processes plus registered trainers.

The HTTP server (`bpfdyno.exporters.bounded_http`) runs prometheus_client's WSGI app on its
own daemon threads, so a scrape never touches the daemon's event loop; it serves at most
``max_connections`` at once, ``max_connections_per_peer`` of one user (or address), and
closes a connection ``timeout_s`` after accepting it, so slow or idle clients cannot take
the agent's threads. If the address cannot be bound the exporter is unavailable, with the
reason in ``bpfdyno status``, and the daemon serves everything else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from bpfdyno.core.budget import ESTIMATE_LABEL
from bpfdyno.core.catalog import Catalog
from bpfdyno.core.config import PrometheusSection
from bpfdyno.core.connections import ConnectionLimits
from bpfdyno.core.metrics import HistogramSample, MetricKind, MetricSpec, Round, Sample
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.exporters.bounded_http import BoundedWSGIServer, Identify, by_address
from bpfdyno.exporters.rounds import ExportView, LatestRounds, SampleProvider

log = logging.getLogger(__name__)

NAME = "export_prometheus"

#: Catalog units that are OpenMetrics base units (declared as ``# UNIT`` when a name ends
#: with them); other units are named in the help text only.
BASE_UNITS = frozenset({"seconds", "bytes", "ratio", "celsius", "watts", "hertz", "joules"})


def split_host_port(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9470"`` -> ("127.0.0.1", 9470); ``"[::1]:9470"`` -> ("::1", 9470)."""
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


def help_text(spec: MetricSpec) -> str:
    """The catalog's help with the unit, as Prometheus shows it."""
    return f"{spec.help} Unit: {spec.unit}."


def families(view: ExportView, catalog: Catalog | None = None) -> list[Metric]:
    """The Prometheus metric families of one export, in catalog order."""
    return [
        _histogram_family(m.spec, m.histograms)
        if m.spec.kind is MetricKind.HISTOGRAM
        else _scalar_family(m.spec, m.samples)
        for m in view.by_metric(catalog)
    ]


def _unit(spec: MetricSpec) -> str:
    # A counter's family name is its name without _total (OpenMetrics); the unit ends that.
    family = spec.name.removesuffix("_total") if spec.kind is MetricKind.COUNTER else spec.name
    return spec.unit if spec.unit in BASE_UNITS and family.endswith("_" + spec.unit) else ""


def _scalar_family(spec: MetricSpec, samples: Sequence[Sample]) -> Metric:
    family: CounterMetricFamily | GaugeMetricFamily
    # A series whose value is an estimate carries one label more than declared; the family
    # then names it, and the exact series give it the empty value (which Prometheus reads
    # as no label at all: their identity does not change).
    names = spec.labels
    if any(len(s.labels) > len(names) for s in samples):
        names = (*names, ESTIMATE_LABEL)
    if spec.kind is MetricKind.COUNTER:
        family = CounterMetricFamily(spec.name, help_text(spec), labels=names, unit=_unit(spec))
    else:
        family = GaugeMetricFamily(spec.name, help_text(spec), labels=names, unit=_unit(spec))
    for s in samples:
        values = [v for _, v in s.labels]
        family.add_metric(values + [""] * (len(names) - len(values)), s.value)
    return family


def _histogram_family(spec: MetricSpec, hists: Sequence[HistogramSample]) -> Metric:
    family = HistogramMetricFamily(spec.name, help_text(spec), labels=spec.labels, unit=_unit(spec))
    for h in hists:
        cumulative = 0
        buckets: list[tuple[str, float]] = []
        for bound, n in zip((*h.upper_bounds, float("inf")), h.counts, strict=True):
            cumulative += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), float(cumulative)))
        family.add_metric([v for _, v in h.labels], buckets, h.sum)
    return family


class _CatalogCollector(Collector):
    """prometheus_client's hook: called on the HTTP server's thread at every scrape."""

    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exporter = exporter

    def collect(self) -> Iterable[Metric]:
        return self._exporter.scrape()


class PrometheusExporter:
    """A `RoundSink` serving the latest rounds (and provider samples) to Prometheus.

    Args:
        cfg: the ``[export.prometheus]`` section.
        providers: samples computed at each scrape (the process table's rows).
        catalog: types, units and help of every metric.
        identify: who a connection is from (default: its address), for the per-peer limit.
    """

    def __init__(
        self,
        cfg: PrometheusSection,
        providers: Sequence[SampleProvider] = (),
        catalog: Catalog | None = None,
        identify: Identify = by_address,
    ) -> None:
        self._latest = LatestRounds(providers)
        self._catalog = catalog
        self._cfg = cfg
        self._identify = identify
        self._listen = cfg.listen
        self._lock = threading.Lock()
        self.scrapes = 0
        self.scrape_errors = 0
        self._last_scrape_ts = 0.0
        self._error = ""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_CatalogCollector(self))
        #: Called on the HTTP thread before each scrape is answered: the daemon's read
        #: (`bpfdyno.core.demand.ReadDemand.read_blocking`); the assembly sets it.
        self.read_by: Callable[[], None] | None = None
        self._server: BoundedWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.address: tuple[str, int] | None = None
        self._start()

    def _start(self) -> None:
        from prometheus_client import make_wsgi_app

        cfg = self._cfg
        limits = ConnectionLimits(cfg.max_connections, cfg.max_connections_per_peer)
        try:
            self._server = BoundedWSGIServer(
                split_host_port(self._listen),
                make_wsgi_app(self.registry),
                limits,
                cfg.timeout_s,
                self._identify,
            )
        except OSError as e:
            self._error = (
                f"cannot listen on {self._listen} ({e.strerror or e}): pick a free address with "
                "[export.prometheus] listen, or stop what holds it"
            )
            log.error("Prometheus exporter unavailable: %s", self._error)
            return
        self._thread = self._server.serve("export-prometheus")
        sockname = self._server.socket.getsockname()
        self.address = (str(sockname[0]), int(sockname[1]))
        log.info("Prometheus metrics on %s", self.url)

    @property
    def url(self) -> str:
        """The /metrics URL (with the port actually bound, if ``listen`` asked for 0)."""
        if self.address is None:
            return f"http://{self._listen}/metrics"
        host, port = self.address
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{port}/metrics"

    def submit(self, rnd: Round) -> None:
        """Keep the round for the next scrape (a dict update; never blocks on I/O)."""
        self._latest.submit(rnd)

    def scrape(self) -> list[Metric]:
        """The families of one scrape (prometheus_client calls this on its HTTP thread).

        A scrape is a read: with `read_by` set, the rounds are made fresh first (no older
        than one normal round).
        """
        if self.read_by is not None:
            self.read_by()
        try:
            out = families(self._latest.view(), self._catalog)
        except Exception:
            with self._lock:
                self.scrape_errors += 1
            log.exception("Prometheus scrape failed")
            raise
        with self._lock:
            self.scrapes += 1
            self._last_scrape_ts = time.time()
        return out

    def status(self) -> PartStatus:
        """ok while serving; unavailable (with the fix) when the address could not be bound."""
        if self._error:
            return PartStatus(NAME, PartState.UNAVAILABLE, self._error)
        with self._lock:
            scrapes, errors, last = self.scrapes, self.scrape_errors, self._last_scrape_ts
        since = f", last {time.time() - last:.0f} s ago" if last else ""
        refused = ""
        if self._server is not None:
            by_rule = self._server.limits.refused
            if by_rule or self._server.timed_out:
                refused = (
                    f"; {sum(by_rule.values())} connections refused over the limits, "
                    f"{self._server.timed_out} closed after {self._cfg.timeout_s:g} s"
                )
        return PartStatus(
            NAME,
            PartState.OK,
            f"serving {self.url} ({scrapes} scrapes{since}){refused}",
            errors=errors,
            last_success_ts=last,
        )

    def close(self) -> None:
        """Stop serving and free the port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
