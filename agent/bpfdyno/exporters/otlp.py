"""OTLP exporter: every catalog metric pushed to an OpenTelemetry collector, off by default.

Every ``[export.otlp] interval_s`` a thread of its own takes the latest round of every
collector plus the process table's rows (`bpfdyno.exporters.rounds`) and sends them with
the OpenTelemetry SDK's OTLP exporter, over gRPC or HTTP (protobuf), with the configured
endpoint, headers and TLS files. The values are already aggregated (the kernel and the
collectors did it), so they are handed to the SDK's exporter as its data model directly,
not recorded again through instruments:

| catalog kind | OTLP |
|---|---|
| counter (``_total``) | Sum, monotonic, cumulative (start: when the exporter started) |
| gauge, rate, ratio | Gauge |
| histogram | Histogram, cumulative, explicit bounds |

Units are UCUM (``By``, ``s``, ``By/s``, ``1``...). The resource says where the data comes
from: ``service.name`` = bpfdyno, ``host.name``, ``cluster`` (``[export.otlp] cluster``),
``slurm.job.id`` / ``slurm.cluster.name`` when the agent runs inside a SLURM job (``bpfdyno
run``), anything in ``resource_attributes`` and in ``$OTEL_RESOURCE_ATTRIBUTES`` (the
DaemonSet puts ``k8s.pod.name``, ``k8s.namespace.name`` and ``k8s.node.name`` there).

A failed export (collector down, TLS or auth refused) is counted and logged once per
distinct failure; the exporter stays degraded with the reason until an export succeeds. It
never blocks the daemon: `submit` is a dict update, the network is on the exporter's thread.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Histogram,
    HistogramDataPoint,
    Metric,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from bpfdyno.core.catalog import Catalog
from bpfdyno.core.config import OtlpSection
from bpfdyno.core.metrics import HistogramSample, MetricKind, Round, Sample
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.exporters.rounds import ExportView, LatestRounds, SampleProvider
from bpfdyno.version import __version__

log = logging.getLogger(__name__)

NAME = "export_otlp"
DEFAULT_ENDPOINTS = {
    "grpc": "http://localhost:4317",
    "http/protobuf": "http://localhost:4318/v1/metrics",
}
SCOPE = InstrumentationScope("bpfdyno", __version__)

#: Catalog units in UCUM, as OTLP wants them; other words become annotations ({threads}).
_UCUM = {
    "seconds": "s",
    "ns": "ns",
    "bytes": "By",
    "bytes/s": "By/s",
    "ratio": "1",
    "1": "1",
    "1/s": "1/s",
    "s/s": "s/s",
    "celsius": "Cel",
    "watts": "W",
    "hertz": "Hz",
    "1e6/s": "10*6/s",
    "boolean": "1",
    "bitmask": "1",
    "info": "1",
    "instructions/cycle": "{instructions}/{cycle}",
}


def ucum_unit(unit: str) -> str:
    """The UCUM spelling of a catalog unit (``bytes/s`` -> ``By/s``, ``threads`` ->
    ``{threads}``)."""
    known = _UCUM.get(unit)
    if known is not None:
        return known
    return "/".join(
        f"{{{part}}}" if re.fullmatch(r"[A-Za-z_]+", part) else part for part in unit.split("/")
    )


def pairs(entries: Sequence[str]) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> {"a": "1", "b": "2"} (validated by the config already)."""
    out: dict[str, str] = {}
    for entry in entries:
        name, _, value = entry.partition("=")
        out[name.strip()] = value.strip()
    return out


#: Set by SLURM in a job's environment, which an agent started by `bpfdyno run` inherits.
_SLURM_ATTRIBUTES = (("SLURM_JOB_ID", "slurm.job.id"), ("SLURM_CLUSTER_NAME", "slurm.cluster.name"))


def resource_attributes(
    cfg: OtlpSection, environ: Mapping[str, str] = os.environ
) -> dict[str, str]:
    """The attributes bpfdyno itself sets (the SDK adds $OTEL_RESOURCE_ATTRIBUTES)."""
    attrs = {
        "service.name": "bpfdyno",
        "service.version": __version__,
        "host.name": socket.gethostname(),
    }
    if cfg.cluster:
        attrs["cluster"] = cfg.cluster
    for env, key in _SLURM_ATTRIBUTES:
        if environ.get(env):
            attrs[key] = environ[env]
    attrs.update(pairs(cfg.resource_attributes))
    return attrs


def metrics_data(
    view: ExportView, resource: Resource, start_ns: int, catalog: Catalog | None = None
) -> MetricsData:
    """One export in the SDK's data model (which its OTLP exporters encode)."""
    now_ns = int(view.ts * 1e9)
    metrics: list[Metric] = []
    for spec, samples, histograms in view.by_metric(catalog):
        data: Any
        if spec.kind is MetricKind.HISTOGRAM:
            data = Histogram(
                data_points=[_histogram_point(h, start_ns, now_ns) for h in histograms],
                aggregation_temporality=AggregationTemporality.CUMULATIVE,
            )
        elif spec.kind is MetricKind.COUNTER:
            data = Sum(
                data_points=[_number_point(s, start_ns, now_ns) for s in samples],
                aggregation_temporality=AggregationTemporality.CUMULATIVE,
                is_monotonic=True,
            )
        else:
            data = Gauge(data_points=[_number_point(s, 0, now_ns) for s in samples])
        metrics.append(Metric(spec.name, spec.help, ucum_unit(spec.unit), data))
    scope = ScopeMetrics(scope=SCOPE, metrics=metrics, schema_url="")
    return MetricsData(
        resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")]
    )


def _number_point(s: Sample, start_ns: int, now_ns: int) -> NumberDataPoint:
    return NumberDataPoint(
        attributes=dict(s.labels),
        start_time_unix_nano=start_ns,
        time_unix_nano=now_ns,
        value=s.value,
    )


def _histogram_point(h: HistogramSample, start_ns: int, now_ns: int) -> HistogramDataPoint:
    return HistogramDataPoint(
        attributes=dict(h.labels),
        start_time_unix_nano=start_ns,
        time_unix_nano=now_ns,
        count=h.count,
        sum=h.sum,
        bucket_counts=list(h.counts),
        explicit_bounds=list(h.upper_bounds),
        # Unknown: the kernel keeps buckets, not extremes; None leaves them unset on the wire.
        min=None,  # type: ignore[arg-type]
        max=None,  # type: ignore[arg-type]
    )


class MetricExporter(Protocol):
    """The part of the SDK's OTLP metric exporters (gRPC and HTTP) used here."""

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = ..., **kwargs: Any
    ) -> MetricExportResult: ...

    def shutdown(self, timeout_millis: float = ..., **kwargs: Any) -> None: ...


def build_sdk_exporter(cfg: OtlpSection) -> MetricExporter:
    """The SDK's OTLP exporter for ``cfg.protocol`` with the endpoint, headers and TLS."""
    endpoint = cfg.endpoint or DEFAULT_ENDPOINTS[cfg.protocol]
    headers = pairs(cfg.headers) or None
    if cfg.protocol == "grpc":
        import grpc
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
            OTLPMetricExporter as GrpcExporter,
        )

        tls = endpoint.startswith("https://")
        credentials = None
        if tls:
            credentials = grpc.ssl_channel_credentials(
                _read(cfg.tls_ca), _read(cfg.tls_key), _read(cfg.tls_cert)
            )
        exporter: MetricExporter = GrpcExporter(
            endpoint=endpoint,
            insecure=not tls,
            credentials=credentials,
            headers=headers,
            timeout=cfg.timeout_s,
        )
        return exporter
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HttpExporter,
    )

    http_exporter: MetricExporter = HttpExporter(
        endpoint=endpoint,
        certificate_file=cfg.tls_ca or None,
        client_key_file=cfg.tls_key or None,
        client_certificate_file=cfg.tls_cert or None,
        headers=headers,
        timeout=cfg.timeout_s,
        session=_session_keeping_ca(),
    )
    return http_exporter


def _session_keeping_ca() -> Any:
    """A requests session whose CA file is not replaced by $REQUESTS_CA_BUNDLE.

    The SDK sets the configured CA as the session's ``verify``, but requests lets
    $REQUESTS_CA_BUNDLE / $CURL_CA_BUNDLE (often set to the system bundle) win over a
    session's setting, so a private CA would silently stop being trusted.
    """
    import requests

    class Session(requests.Session):
        def merge_environment_settings(self, *args: Any, **kwargs: Any) -> Any:
            settings = super().merge_environment_settings(*args, **kwargs)
            if isinstance(self.verify, str):
                settings["verify"] = self.verify
            return settings

    return Session()


def _read(path: str) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


class OtlpExporter:
    """A `RoundSink` pushing the latest rounds (and provider samples) over OTLP.

    Args:
        cfg: the ``[export.otlp]`` section.
        providers: samples computed at each export (the process table's rows).
        catalog: kinds, units and help of every metric.
        sdk_exporter: builds the SDK exporter (tests may wrap the real one).
    """

    def __init__(
        self,
        cfg: OtlpSection,
        providers: Sequence[SampleProvider] = (),
        catalog: Catalog | None = None,
        sdk_exporter: Callable[[OtlpSection], MetricExporter] = build_sdk_exporter,
    ) -> None:
        self._cfg = cfg
        self._latest = LatestRounds(providers)
        self._catalog = catalog
        self._endpoint = cfg.endpoint or DEFAULT_ENDPOINTS[cfg.protocol]
        self._resource = Resource.create(resource_attributes(cfg))
        self._start_ns = time.time_ns()
        self._lock = threading.Lock()
        self.exports = 0
        self.failures = 0
        self._last_success_ts = 0.0
        self._error = ""
        self._logged: set[str] = set()
        self._stop = threading.Event()
        self._exporter: MetricExporter | None = None
        self._closed = False
        try:
            self._exporter = sdk_exporter(cfg)
        except Exception as e:  # bad TLS files and the like: this exporter only
            self._error = f"cannot set up the OTLP exporter ({type(e).__name__}: {e})"
            log.error("%s", self._error)
        self._thread = threading.Thread(target=self._run, name="export-otlp", daemon=True)
        if self._exporter is not None:
            self._thread.start()

    @property
    def resource(self) -> Resource:
        return self._resource

    def submit(self, rnd: Round) -> None:
        """Keep the round for the next export (a dict update; never blocks on I/O)."""
        self._latest.submit(rnd)

    def export_once(self) -> bool:
        """Send the current values now; True when the collector accepted them."""
        assert self._exporter is not None
        data = metrics_data(self._latest.view(), self._resource, self._start_ns, self._catalog)
        try:
            result = self._exporter.export(data, timeout_millis=self._cfg.timeout_s * 1000)
            ok = result is MetricExportResult.SUCCESS
            error = "" if ok else "the collector did not accept it"
        except Exception as e:  # the SDK logs and returns FAILURE; this is for the rest
            error = f"{type(e).__name__}: {e}"
        with self._lock:
            self.exports += 1
            if not error:
                self._error = ""
                self._last_success_ts = time.time()
                return True
            self.failures += 1
            self._error = (
                f"export to {self._endpoint} failed ({error}); check that the collector is "
                "up and [export.otlp] endpoint, protocol, headers and TLS files match it"
            )
        if error not in self._logged and len(self._logged) < 100:
            self._logged.add(error)
            log.error(
                "OTLP export to %s failed: %s (retried every %.0f s)",
                self._endpoint,
                error,
                self._cfg.interval_s,
            )
        return False

    def status(self) -> PartStatus:
        """ok after a successful export; degraded with the reason and the fix otherwise."""
        with self._lock:
            error, exports, failures = self._error, self.exports, self.failures
            last = self._last_success_ts
        if self._exporter is None:
            return PartStatus(NAME, PartState.UNAVAILABLE, error)
        if error:
            return PartStatus(
                NAME,
                PartState.DEGRADED,
                error,
                self._cfg.interval_s,
                exports,
                failures,
                last_success_ts=last,
            )
        what = f"{self._cfg.protocol} to {self._endpoint}"
        reason = f"exporting {what}" if exports else f"first export {what} pending"
        return PartStatus(
            NAME,
            PartState.OK,
            reason,
            self._cfg.interval_s,
            exports,
            failures,
            last_success_ts=last,
        )

    def close(self) -> None:
        """Send a last export (unless the collector is failing), shut the SDK exporter down."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._cfg.timeout_s + 5)
        if self._exporter is not None and not self._closed:
            self._closed = True
            with self._lock:
                reachable = not self._error
            if reachable:  # a collector that is down would only hold up the shutdown
                self.export_once()
            self._exporter.shutdown(timeout_millis=self._cfg.timeout_s * 1000)

    def _run(self) -> None:
        while not self._stop.wait(self._cfg.interval_s):
            try:
                self.export_once()
            except Exception:  # never let the thread die: the next interval tries again
                log.exception("OTLP export failed unexpectedly")
