"""GPM profiling metrics, their pausing (dcgm-pause, traces), XID events, and DCGM detection."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator, Sequence

import pytest
from gpu_fake_nvml import A100_UUID, H100_UUID, FakeNvml, value

from bpfdyno.core.events import KernelEvent
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.gpu import gpm
from bpfdyno.sources.gpu.collector import GpuCollector
from bpfdyno.sources.gpu.dcgm import DcgmCollector, find_libdcgm

pytest_plugins = ("gpu_fake_nvml",)  # the fake_libs / fake fixtures

MIB = 1024.0 * 1024.0
XID = 0x8  # nvmlEventTypeXidCriticalError
DOUBLE_BIT_ECC = 0x2
PSTATE = 0x4

#: The GPM values of gpu 0 in the fake (percent / MiB/s) as the metrics they become.
GPM_EXPECTED = {
    "gpu_gr_engine_active_ratio": 0.91,
    "gpu_sm_active_ratio": 0.455,
    "gpu_sm_occupancy_ratio": 0.3025,
    "gpu_tensor_active_ratio": 0.125,
    "gpu_dram_bw_util_ratio": 0.57,
    "gpu_fp64_active_ratio": 0.005,
    "gpu_fp32_active_ratio": 0.20,
    "gpu_fp16_active_ratio": 0.08,
    "gpu_prof_pcie_tx_bytes_per_second": 100 * MIB,
    "gpu_prof_pcie_rx_bytes_per_second": 250 * MIB,
    "gpu_prof_nvlink_tx_bytes_per_second": 512 * MIB,
    "gpu_prof_nvlink_rx_bytes_per_second": 1024 * MIB,
}


class EventBox:
    """An event sink that lets a test wait for the events it expects."""

    def __init__(self) -> None:
        self.events: list[KernelEvent] = []
        self._cond = threading.Condition()

    def __call__(self, events: Sequence[KernelEvent]) -> None:
        with self._cond:
            self.events.extend(events)
            self._cond.notify_all()

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[KernelEvent]:
        with self._cond:
            self._cond.wait_for(lambda: len(self.events) >= count, timeout_s)
            return list(self.events)


@pytest.fixture
def box() -> EventBox:
    return EventBox()


@pytest.fixture
def collector(fake: FakeNvml, box: EventBox) -> Iterator[GpuCollector]:
    c = GpuCollector(str(fake.library), event_sink=box, retry_min_s=0.0, retry_max_s=0.0)
    c.start()
    yield c
    c.close()


def gpm_values(samples: Sequence[object], gpu: str) -> dict[str, float]:
    return {name: value(samples, name, gpu=gpu) for name in GPM_EXPECTED}  # type: ignore[arg-type]


def test_gpm_metrics_over_two_samples(collector: GpuCollector, fake: FakeNvml) -> None:
    first = collector.collect()  # the baseline sample: no interval yet
    assert all(math.isnan(v) for v in gpm_values(first, "0").values())
    second = collector.collect()
    assert gpm_values(second, "0") == GPM_EXPECTED
    assert value(second, "gpu_profiling_paused", gpu="0") == 0.0
    # The A100 has no GPM: GPM alone is unavailable there, its other fields are not.
    assert all(math.isnan(v) for v in gpm_values(second, "1").values())
    assert math.isnan(value(second, "gpu_profiling_paused", gpu="1"))
    assert value(second, "gpu_power_watts", gpu="1") == 90.25
    assert fake.calls("nvmlGpmSampleGet", 0) == 2
    assert fake.calls("nvmlGpmSampleGet", 1) == 0
    # Two computations: the metrics NVML computes cheaply, and the graphics engine's
    # activity (~1.8 ms of CPU on a real H200), the first time over the same interval.
    assert fake.calls("nvmlGpmMetricsGet") == 2


def test_the_slow_gpm_metric_is_computed_every_round_for_readers_else_every_10_s(
    fake: FakeNvml, box: EventBox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The graphics engine's activity (~1.8 ms of CPU a computation on an H200): while nobody
    reads, computed every `SLOW_METRICS_S` and its latest value reported in between (one
    computation a round for the others, one more when it is due); while someone reads,
    every round like the others, the reader's first round at once."""
    reading = False
    c = GpuCollector(str(fake.library), event_sink=box, read_demand=lambda: reading)
    c.start()
    try:
        c.collect()
        c.collect()  # the first interval: both
        assert fake.calls("nvmlGpmMetricsGet") == 2
        fake.set({"gpu.0.gpm.1": "50.0"})
        third = c.collect()
        assert fake.calls("nvmlGpmMetricsGet") == 3
        assert gpm_values(third, "0") == GPM_EXPECTED  # its latest value, the others fresh
        reading = True  # a reader: computed at once, and every round
        fourth = c.collect()
        assert fake.calls("nvmlGpmMetricsGet") == 5
        assert value(fourth, "gpu_gr_engine_active_ratio", gpu="0") == 0.5
        c.collect()
        assert fake.calls("nvmlGpmMetricsGet") == 7
        reading = False
        c.collect()
        assert fake.calls("nvmlGpmMetricsGet") == 8
        monkeypatch.setattr(gpm, "SLOW_METRICS_S", 0.0)  # its interval over at every round
        c.collect()
        assert fake.calls("nvmlGpmMetricsGet") == 10
    finally:
        c.close()


def test_one_gpm_metric_not_supported(
    collector: GpuCollector, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.unset("gpu.0.gpm.10")
    caplog.set_level(logging.INFO, "bpfdyno.sources.gpu.collector")
    for _ in range(3):
        samples = collector.collect()
    got = gpm_values(samples, "0")
    assert math.isnan(got.pop("gpu_dram_bw_util_ratio"))
    assert got == {k: v for k, v in GPM_EXPECTED.items() if k != "gpu_dram_bw_util_ratio"}
    lines = [r.getMessage() for r in caplog.records if "nvmlGpmMetricsGet[10]" in r.getMessage()]
    assert lines == [
        "NVML nvmlGpmMetricsGet[10] on gpu 0: Not Supported (3); the fields it feeds are "
        "reported as not available (logged once)"
    ]


def test_dcgm_pause_and_resume(collector: GpuCollector, fake: FakeNvml) -> None:
    collector.collect()
    collector.collect()
    sampled = fake.calls("nvmlGpmSampleGet", 0)
    assert collector.pause_profiling(30.0) is True
    for _ in range(3):
        samples = collector.collect()
        assert value(samples, "gpu_profiling_paused", gpu="0") == 1.0
        assert all(math.isnan(v) for v in gpm_values(samples, "0").values())
        assert value(samples, "gpu_utilization_ratio", gpu="0") == 0.57  # only GPM pauses
    # Paused means the profiling counters are not touched at all.
    assert fake.calls("nvmlGpmSampleGet", 0) == sampled
    gpm = collector.status().devices[0].gpm
    assert gpm.startswith("paused (dcgm-pause, until ") and gpm.endswith("Z)")
    assert "GPM: paused (dcgm-pause, until " in collector.health()[1]
    assert collector.resume_profiling() is True
    samples = collector.collect()  # a fresh baseline: the interval must not span the pause
    assert value(samples, "gpu_profiling_paused", gpu="0") == 0.0
    assert math.isnan(value(samples, "gpu_sm_active_ratio", gpu="0"))
    assert gpm_values(collector.collect(), "0") == GPM_EXPECTED
    assert collector.status().devices[0].gpm == "active"


def test_pause_expires_and_rejects_bad_durations(fake: FakeNvml) -> None:
    now = [100.0]
    c = GpuCollector(str(fake.library), events_enabled=False, clock=lambda: now[0])
    assert c.pause_profiling(5) is False  # not started: nothing to pause
    c.start()
    try:
        assert c.pause_profiling(5) is True
        now[0] = 104.9
        assert value(c.collect(), "gpu_profiling_paused", gpu="0") == 1.0
        now[0] = 105.0
        assert value(c.collect(), "gpu_profiling_paused", gpu="0") == 0.0
        for bad in (0, -1, math.nan, math.inf, "5", True):
            with pytest.raises(ValueError, match="number of seconds"):
                c.pause_profiling(bad)  # type: ignore[arg-type]
        assert c.resume_profiling() is True
    finally:
        c.close()


def test_no_gpm_gpu_means_nothing_to_pause(fake: FakeNvml) -> None:
    fake.set({"gpu.0.gpm": 0})
    c = GpuCollector(str(fake.library), events_enabled=False)
    c.start()
    try:
        assert c.pause_profiling(10) is False
        assert c.resume_profiling() is False
    finally:
        c.close()


def test_gpm_pauses_on_the_gpu_of_a_traced_process(
    collector: GpuCollector, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.set({"gpu.1.gpm": 1, "gpu.1.gpm.2": "10.0"})  # both GPUs with GPM for this test
    collector.close()
    collector.start()
    traced: set[int] = {4242}  # pid 4242 runs on gpu 0 only
    collector.set_traced_pids_provider(lambda: traced)
    collector.collect()
    sampled = fake.calls("nvmlGpmSampleGet", 0)
    samples = collector.collect()
    assert value(samples, "gpu_profiling_paused", gpu="0") == 1.0
    assert value(samples, "gpu_profiling_paused", gpu="1") == 0.0
    assert value(samples, "gpu_sm_active_ratio", gpu="1") == 0.10
    assert fake.calls("nvmlGpmSampleGet", 0) == sampled
    assert collector.status().devices[0].gpm == "paused (Kineto trace in pid 4242)"
    traced.clear()  # the trace ended
    collector.collect()
    assert value(collector.collect(), "gpu_sm_active_ratio", gpu="0") == 0.455
    traced.add(4343)  # on both GPUs
    samples = collector.collect()
    assert [value(samples, "gpu_profiling_paused", gpu=g) for g in "01"] == [1.0, 1.0]

    def broken() -> set[int]:
        raise RuntimeError("tracing registry unavailable")

    collector.set_traced_pids_provider(broken)
    caplog.set_level(logging.ERROR, "bpfdyno.sources.gpu.collector")
    for _ in range(2):
        assert value(collector.collect(), "gpu_profiling_paused", gpu="0") == 0.0
    assert len([r for r in caplog.records if "traced-pids provider failed" in r.getMessage()]) == 1


def test_xid_event_reaches_the_sink(collector: GpuCollector, fake: FakeNvml, box: EventBox) -> None:
    before = time.time_ns()
    fake.push_event(0, PSTATE, 1)  # not a critical event: not registered, not delivered
    fake.push_event(0, XID, 79)
    fake.push_event(1, DOUBLE_BIT_ECC, 0)
    events = box.wait_for(2)
    after = time.time_ns()
    assert [(e.kind, e.pid, e.tid, e.comm, e.attrs) for e in events] == [
        ("gpu_xid", 0, 0, "", {"gpu": 0, "uuid": H100_UUID, "event_type": XID, "xid": 79}),
        (
            "gpu_ecc_double_bit",
            0,
            0,
            "",
            {"gpu": 1, "uuid": A100_UUID, "event_type": DOUBLE_BIT_ECC, "data": 0},
        ),
    ]
    assert all(before <= e.ts_ns <= after for e in events)
    samples = collector.collect()
    assert value(samples, "gpu_xid_errors_total", gpu="0") == 1.0
    assert value(samples, "gpu_xid_errors_total", gpu="1") == 0.0


def test_events_survive_a_gpu_loss(collector: GpuCollector, fake: FakeNvml, box: EventBox) -> None:
    fake.push_event(0, XID, 13)
    box.wait_for(1)
    fake.set({"gpu.0.lost": 1})
    collector.collect()
    fake.set({"gpu.0.lost": 0})
    collector.collect()  # re-init: a new event set with the new handles
    assert collector.status().events == "watching 2 GPU(s) for XID and critical errors"
    fake.push_event(0, XID, 48)
    events = box.wait_for(2)
    assert [e.attrs["xid"] for e in events] == [13, 48]
    # The count of XIDs is kept across the re-init.
    assert value(collector.collect(), "gpu_xid_errors_total", gpu="0") == 2.0


def test_close_stops_the_event_thread(fake: FakeNvml) -> None:
    c = GpuCollector(str(fake.library), event_sink=lambda events: None)
    c.start()
    assert [t.name for t in threading.enumerate()].count("gpu-events") == 1
    c.close()
    assert "gpu-events" not in [t.name for t in threading.enumerate()]
    assert fake.calls("nvmlEventSetFree") >= 1
    assert fake.init_refcount() == 0
    c.close()  # idempotent


def test_events_unavailable_without_support(fake: FakeNvml) -> None:
    fake.unset("gpu.0.event_types", "gpu.1.event_types")
    c = GpuCollector(str(fake.library))
    c.start()
    try:
        assert c.status().events == "unavailable: no GPU supports critical-error events"
        assert math.isnan(value(c.collect(), "gpu_xid_errors_total", gpu="0"))
    finally:
        c.close()


def test_dcgm_collector_detection(fake: FakeNvml) -> None:
    with pytest.raises(CollectorUnavailable) as e:
        DcgmCollector(find=lambda: None).start()
    assert str(e.value) == "libdcgm not found — install datacenter-gpu-manager to use DCGM fields"
    with pytest.raises(CollectorUnavailable, match=r"^libdcgm-not-here.so.4 does not load: "):
        DcgmCollector(find=lambda: "libdcgm-not-here.so.4").start()
    # Detection dlopens each candidate: names that do not load are skipped.
    missing = ("libdcgm-does-not-exist.so.9",)
    assert find_libdcgm(lambda name: None, missing) is None
    assert find_libdcgm(lambda name: "/nonexistent/libdcgm.so", missing) is None
    assert find_libdcgm(lambda name: str(fake.library), missing) == str(fake.library)
