"""The OTLP exporter (the SDK's gRPC and HTTP exporters) against an in-process receiver.

The receiver decodes the real OTLP protobufs; rounds built from catalog metrics with known
values must arrive exactly: counters as cumulative monotonic sums, gauges, the run-queue
histogram with its bounds, UCUM units, the resource attributes, the configured headers,
over plain text and TLS. A whole daemon pushes to it too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from export_harness import AgentProcess, free_port, wait_for
from opentelemetry.proto.metrics.v1 import metrics_pb2
from otlp_receiver import (
    GrpcReceiver,
    HttpReceiver,
    attributes,
    metrics_by_name,
    self_signed,
)

from bpfdyno.app.catalog import CATALOG
from bpfdyno.core.config import OtlpSection
from bpfdyno.core.histogram import log2_export_buckets
from bpfdyno.core.metrics import HistogramSample, Round, Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.exporters.otlp import OtlpExporter, ucum_unit
from bpfdyno.rpc.processes import ProcessRow
from bpfdyno.sources.procs.samples import row_samples
from bpfdyno.sources.sched.metrics import RUNQ_HISTOGRAM

CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
HIST_SLOTS = [0] * 10 + [7, 5, 0, 2]  # 2^10..2^14 ns
HIST_SUM_S = 0.000123


def _spec(name: str):  # type: ignore[no-untyped-def]
    spec = CATALOG.get(name)
    assert spec is not None
    return spec


def _round() -> Round:
    bounds, counts = log2_export_buckets(HIST_SLOTS, 1e-9, 35)
    return Round(
        "sched",
        time.time(),  # a fresh round: a stale one (its collector stopped) is not exported
        [
            sample(_spec("sched_dropped_total"), 4, {"reason": "ringbuf_full"}),
            sample(_spec("sched_migrations_per_second"), 12.5),
            sample(_spec("sched_tracked_threads"), 321),
            sample(_spec("sched_runqueue_latency_mean_seconds"), float("nan")),  # unknown
        ],
        [HistogramSample(RUNQ_HISTOGRAM, bounds, counts, HIST_SUM_S)],
    )


ROW = ProcessRow(
    pid=4242, comm="python", user="alice", slurm_job_id="77", rss_bytes=1 << 30, num_threads=9,
    cpu_ratio=1.5, oncpu_ns=2_500_000_000, tcp_tx_bytes=1000,
)  # fmt: skip


def _provider() -> list[Sample]:
    return row_samples([ROW])


@pytest.fixture
def grpc_receiver() -> Iterator[GrpcReceiver]:
    r = GrpcReceiver()
    yield r
    r.stop()


def _check_payload(request: metrics_pb2.ResourceMetrics | object) -> None:
    metrics = metrics_by_name(request)  # type: ignore[arg-type]
    dropped = metrics["sched_dropped_total"]
    assert dropped.WhichOneof("data") == "sum"
    assert dropped.sum.is_monotonic
    assert dropped.sum.aggregation_temporality == CUMULATIVE
    (point,) = dropped.sum.data_points
    assert point.as_double == 4.0
    assert attributes(point.attributes) == {"reason": "ringbuf_full"}
    assert point.time_unix_nano > point.start_time_unix_nano > 0
    assert dropped.unit == "1"
    assert dropped.description == _spec("sched_dropped_total").help

    rate = metrics["sched_migrations_per_second"]
    assert rate.WhichOneof("data") == "gauge" and rate.unit == "1/s"
    assert rate.gauge.data_points[0].as_double == 12.5
    assert metrics["sched_tracked_threads"].unit == "{threads}"
    assert "sched_runqueue_latency_mean_seconds" not in metrics  # NaN: left out, not 0

    hist = metrics["sched_runqueue_latency_histogram_seconds"]
    assert hist.WhichOneof("data") == "histogram" and hist.unit == "s"
    assert hist.histogram.aggregation_temporality == CUMULATIVE
    (hp,) = hist.histogram.data_points
    assert hp.count == 14
    assert hp.sum == HIST_SUM_S
    assert list(hp.explicit_bounds) == [2.0 ** (k + 1) * 1e-9 for k in range(36)]
    assert list(hp.bucket_counts) == [0] * 10 + [7, 5, 0, 2] + [0] * 23
    assert not hp.HasField("min") and not hp.HasField("max")

    rss = metrics["process_rss_bytes"]
    (rp,) = rss.gauge.data_points
    assert rp.as_double == float(1 << 30) and rss.unit == "By"
    assert attributes(rp.attributes) == {
        "pid": "4242", "comm": "python", "user": "alice", "slurm_job_id": "77", "k8s_pod_uid": "",
    }  # fmt: skip
    oncpu = metrics["process_oncpu_seconds_total"]
    assert oncpu.sum.is_monotonic and oncpu.sum.data_points[0].as_double == 2.5
    assert oncpu.unit == "s"


def test_grpc_export_kinds_units_resource_and_headers(
    grpc_receiver: GrpcReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.pod.name=bpfdyno-x1,k8s.node.name=n1")
    cfg = OtlpSection(
        enabled=True,
        endpoint=f"http://127.0.0.1:{grpc_receiver.port}",
        headers=["x-api-key=s3cret"],
        cluster="train-a",
        resource_attributes=["deployment.environment=test"],
        interval_s=3600,
    )
    exporter = OtlpExporter(cfg, [_provider])
    try:
        exporter.submit(_round())
        assert exporter.export_once()
        (got,) = grpc_receiver.wait(1)
        assert got.headers["x-api-key"] == "s3cret"
        (rm,) = got.request.resource_metrics
        res = attributes(rm.resource.attributes)
        assert res["service.name"] == "bpfdyno"
        assert res["host.name"]
        assert res["cluster"] == "train-a"
        assert res["slurm.job.id"] == "77"
        assert res["k8s.pod.name"] == "bpfdyno-x1" and res["k8s.node.name"] == "n1"
        assert res["deployment.environment"] == "test"
        assert rm.scope_metrics[0].scope.name == "bpfdyno"
        _check_payload(got.request)
        status = exporter.status()
        assert status.state is PartState.OK and status.collections == 1
    finally:
        exporter.close()


def test_http_export_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    receiver = HttpReceiver(cert, key)
    cfg = OtlpSection(
        enabled=True,
        protocol="http/protobuf",
        endpoint=f"https://localhost:{receiver.port}/v1/metrics",
        tls_ca=str(cert),
        headers=["authorization=Bearer t0ken"],
        interval_s=3600,
    )
    exporter = OtlpExporter(cfg, [_provider])
    try:
        exporter.submit(_round())
        assert exporter.export_once(), exporter.status().reason
        (got,) = receiver.wait(1)
        assert got.headers["authorization"] == "Bearer t0ken"
        _check_payload(got.request)
    finally:
        exporter.close()
        receiver.stop()


def test_grpc_export_over_tls(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    receiver = GrpcReceiver(cert=cert, key=key)
    cfg = OtlpSection(
        enabled=True,
        endpoint=f"https://localhost:{receiver.port}",
        tls_ca=str(cert),
        interval_s=3600,
        timeout_s=20,
    )
    exporter = OtlpExporter(cfg)
    try:
        exporter.submit(_round())
        assert exporter.export_once(), exporter.status().reason
        (got,) = receiver.wait(1)
        assert "sched_dropped_total" in metrics_by_name(got.request)
    finally:
        exporter.close()
        receiver.stop()


def test_a_missing_collector_degrades_then_recovers() -> None:
    port = free_port()
    cfg = OtlpSection(
        enabled=True, endpoint=f"http://127.0.0.1:{port}", interval_s=3600, timeout_s=3
    )
    exporter = OtlpExporter(cfg)
    try:
        exporter.submit(_round())
        t0 = time.monotonic()
        assert not exporter.export_once()
        assert time.monotonic() - t0 < 30  # bounded by timeout_s (plus the SDK's back-off)
        status = exporter.status()
        assert status.state is PartState.DEGRADED
        assert f"127.0.0.1:{port}" in status.reason and "[export.otlp]" in status.reason
        assert status.errors == 1
        receiver = GrpcReceiver(port)
        try:
            assert exporter.export_once()
            assert exporter.status().state is PartState.OK
            receiver.wait(1)
        finally:
            receiver.stop()
    finally:
        exporter.close()


def test_ucum_units_of_the_catalog() -> None:
    assert ucum_unit("bytes/s") == "By/s"
    assert ucum_unit("celsius") == "Cel"
    assert ucum_unit("threads") == "{threads}"
    for spec in CATALOG:
        assert ucum_unit(spec.unit), spec.name


@pytest.mark.root
@pytest.mark.slow
def test_the_daemon_pushes_every_round_kind(tmp_path: Path) -> None:
    receiver = GrpcReceiver()
    agent = AgentProcess(
        tmp_path,
        "export.otlp.enabled=true",
        f'export.otlp.endpoint="http://127.0.0.1:{receiver.port}"',
        "export.otlp.interval_s=1",
        *(f"collectors.{c}.enabled=false" for c in ("net", "pmu", "perf_sw", "gpu", "dcgm")),
    )
    try:

        def complete() -> dict[str, object] | None:
            for got in reversed(receiver.requests):
                metrics = metrics_by_name(got.request)
                wanted = ("sched_runqueue_latency_histogram_seconds", "process_rss_bytes",
                          "memory_total_bytes", "sched_dropped_total")  # fmt: skip
                if all(name in metrics for name in wanted):
                    return metrics
            return None

        metrics = wait_for("an export with every kind of metric", complete, timeout=90)
        mem = metrics["memory_total_bytes"]
        ours = agent.metrics("memory_total_bytes")[("memory_total_bytes", ())]
        assert mem.gauge.data_points[0].as_double == ours  # type: ignore[attr-defined]
        _, reason = agent.status()["export_otlp"]
        assert f"127.0.0.1:{receiver.port}" in reason
    finally:
        agent.stop()
        receiver.stop()
