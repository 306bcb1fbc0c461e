"""The exporters' own rules without a server: what an export holds, the exposition of each
kind, failures that only degrade the exporter, and the config keys' errors."""

from __future__ import annotations

import re
import socket
import urllib.request

import pytest

from bpfdyno.core.config import ConfigError, PrometheusSection, load
from bpfdyno.core.histogram import log2_export_buckets
from bpfdyno.core.metrics import HistogramSample, MetricKind, MetricTable, Round, sample
from bpfdyno.core.status import PartState
from bpfdyno.exporters.prometheus import PrometheusExporter, families
from bpfdyno.exporters.rounds import LatestRounds

T = MetricTable("t")
USED = T.declare("t_used_bytes", MetricKind.GAUGE, "bytes", "Used.", ("dev",))
DROPS = T.declare("t_drops_total", MetricKind.COUNTER, "1", "Drops.")
WAIT = T.declare("t_wait_seconds", MetricKind.HISTOGRAM, "seconds", "Waits.")


class Catalog:
    """A catalog of the test table (the exporters take any iterable of specs)."""

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(T, key=lambda s: s.name))


def test_log2_export_buckets_fixes_the_bounds_and_folds_the_overflow() -> None:
    bounds, counts = log2_export_buckets([1, 0, 4, 0, 2, 9], 1.0, 3)
    assert bounds == (2.0, 4.0, 8.0, 16.0)
    assert counts == (1, 0, 4, 0, 11)  # slots 4 and 5 -> +Inf
    bounds, counts = log2_export_buckets([3], 1e-9, 2)
    assert bounds == (2e-9, 4e-9, 8e-9) and counts == (3, 0, 0, 0)
    with pytest.raises(ValueError, match="last_slot"):
        log2_export_buckets([], 1.0, 63)


def test_a_histogram_needs_one_count_more_than_bounds() -> None:
    with pytest.raises(ValueError, match="one count more than bounds"):
        HistogramSample(WAIT, (1.0, 2.0), (1, 2), 0.0)


def test_latest_rounds_keep_one_value_per_series_and_drop_stale_collectors() -> None:
    now = [1000.0]
    latest = LatestRounds([lambda: [sample(USED, 7, {"dev": "p"})]], clock=lambda: now[0])
    latest.submit(Round("a", 990.0, [sample(USED, 1, {"dev": "x"}), sample(DROPS, 3)]))
    latest.submit(Round("a", 999.0, [sample(USED, 2, {"dev": "x"}), sample(DROPS, float("nan"))]))
    view = latest.view()
    assert sorted((s.spec.name, s.labels, s.value) for s in view.samples) == [
        ("t_used_bytes", (("dev", "p"),), 7.0),  # the provider's
        ("t_used_bytes", (("dev", "x"),), 2.0),  # the latest round only; NaN left out
    ]
    now[0] = 999.0 + 9  # rounds 9 s apart: stale after max(10, 3 x 9) = 27 s
    assert len(latest.view().samples) == 2
    now[0] = 999.0 + 28
    assert [s.value for s in latest.view().samples] == [7.0]


def test_a_failing_provider_costs_only_its_samples() -> None:
    def broken() -> list[object]:
        raise RuntimeError("table gone")

    latest = LatestRounds([broken], clock=lambda: 100.0)  # type: ignore[list-item]
    latest.submit(Round("a", 100.0, [sample(DROPS, 4)]))
    assert [s.value for s in latest.view().samples] == [4.0]


def test_prometheus_families_per_kind() -> None:
    latest = LatestRounds(clock=lambda: 100.0)
    bounds, counts = log2_export_buckets([0, 2, 1], 1.0, 1)
    latest.submit(Round("a", 100.0, [sample(DROPS, 4), sample(USED, 5, {"dev": "d"})],
                        [HistogramSample(WAIT, bounds, counts, 6.5)]))  # fmt: skip
    got = {m.name: m for m in families(latest.view(), Catalog())}  # type: ignore[arg-type]
    assert got["t_drops"].type == "counter"  # OpenMetrics family name; sample t_drops_total
    assert [(s.name, s.value) for s in got["t_drops"].samples] == [("t_drops_total", 4.0)]
    assert got["t_used_bytes"].type == "gauge" and got["t_used_bytes"].unit == "bytes"
    assert got["t_used_bytes"].documentation == "Used. Unit: bytes."
    hist = got["t_wait_seconds"]
    assert hist.type == "histogram" and hist.unit == "seconds"
    assert [(s.name, s.labels.get("le"), s.value) for s in hist.samples] == [
        ("t_wait_seconds_bucket", "2.0", 0.0),
        ("t_wait_seconds_bucket", "4.0", 2.0),
        ("t_wait_seconds_bucket", "+Inf", 3.0),
        ("t_wait_seconds_count", None, 3.0),
        ("t_wait_seconds_sum", None, 6.5),
    ]


def test_a_busy_port_makes_the_exporter_unavailable_not_the_daemon() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        exporter = PrometheusExporter(PrometheusSection(True, f"127.0.0.1:{port}"))
        status = exporter.status()
        assert status.state is PartState.UNAVAILABLE
        assert f"cannot listen on 127.0.0.1:{port}" in status.reason
        assert "[export.prometheus] listen" in status.reason
        exporter.submit(Round("a", 1.0, [sample(DROPS, 1)]))  # still takes rounds
        exporter.close()


def test_the_exporter_serves_and_frees_its_port() -> None:
    exporter = PrometheusExporter(PrometheusSection(True, "127.0.0.1:0"))
    try:
        assert exporter.address is not None
        with urllib.request.urlopen(exporter.url, timeout=10) as r:
            assert r.status == 200
        assert exporter.status().state is PartState.OK
        assert "1 scrapes" in exporter.status().reason
    finally:
        exporter.close()
    with socket.socket() as again:
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(exporter.address)  # closed: the port is free again


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("export.prometheus.listen", '"9470"', "must be host:port"),
        ("export.prometheus.listen", '"127.0.0.1:70000"', "must be host:port"),
        ("export.otlp.protocol", '"udp"', "must be one of grpc, http/protobuf"),
        ("export.otlp.endpoint", '"otel:4317"', "must be a URL starting with http://"),
        ("export.otlp.headers", '["novalue"]', "entries must be name=value"),
        ("export.otlp.interval_s", "0.5", "must be at least 1 second"),
        ("export.otlp.tls_cert", '"/x.pem"', "export.otlp.tls_key' is missing"),
    ],
)
def test_bad_export_settings_name_the_key(key: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load(None, [(key, value)])


def test_an_unreadable_tls_file_is_refused_when_enabled() -> None:
    with pytest.raises(ConfigError, match=r"cannot read /nonexistent/ca\.pem"):
        load(
            None, [("export.otlp.enabled", "true"), ("export.otlp.tls_ca", '"/nonexistent/ca.pem"')]
        )
