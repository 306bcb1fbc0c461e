"""How the GPU collector survives NVML failing: lost GPUs, a lost driver, old drivers."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator

import pytest
from gpu_fake_nvml import A100_UUID, H100_UUID, FakeLibs, FakeNvml, run_child, value

from bpfdyno.core.status import PartState
from bpfdyno.sources.gpu.collector import GpuCollector

pytest_plugins = ("gpu_fake_nvml",)  # the fake_libs / fake fixtures

GPU_IS_LOST = "GPU is lost (15)"


class ManualClock:
    """A monotonic clock the test advances by hand (for back-off timing)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def collector(fake: FakeNvml) -> Iterator[GpuCollector]:
    c = GpuCollector(str(fake.library), retry_min_s=0.0, retry_max_s=0.0)
    c.start()
    yield c
    c.close()


def test_lost_gpu_keeps_the_others_and_recovers(collector: GpuCollector, fake: FakeNvml) -> None:
    assert value(collector.collect(), "gpu_up", gpu="0") == 1.0
    fake.set({"gpu.0.lost": 1})
    samples = collector.collect()
    assert value(samples, "gpu_up", gpu="0", uuid=H100_UUID) == 0.0
    assert [dict(s.labels)["uuid"] for s in samples if s.spec.name == "gpu_power_watts"] == [
        A100_UUID
    ]
    assert value(samples, "gpu_power_watts", gpu="1") == 90.25
    assert value(samples, "gpu_count") == 1.0
    state, reason = collector.health()
    assert state is PartState.DEGRADED
    assert reason.startswith(
        f"gpu 0 ({H100_UUID}) lost: gpu 0: nvmlDeviceGetUtilizationRates: {GPU_IS_LOST}"
    )
    assert collector.status().devices[0].gpm == "unavailable: the GPU is lost"
    # Still lost: each round re-initialises NVML (no back-off in this test) and the GPU
    # stays lost, the other keeps reporting.
    for _ in range(2):
        samples = collector.collect()
        assert value(samples, "gpu_up", gpu="0") == 0.0
        assert value(samples, "gpu_temperature_celsius", gpu="1") == 41.0
    assert collector.reinit_attempts == 2
    assert "lost: gpu 0: nvmlDeviceGetHandleByIndex_v2: GPU is lost (15)" in collector.health()[1]
    # The GPU comes back: the next round re-initialises and reads it again.
    fake.set({"gpu.0.lost": 0})
    samples = collector.collect()
    assert collector.reinit_attempts == 3
    assert value(samples, "gpu_up", gpu="0", uuid=H100_UUID) == 1.0
    assert value(samples, "gpu_power_watts", gpu="0") == 312.5
    assert collector.health()[0] is PartState.OK
    st = collector.status()
    assert st.retry_in_s is None
    assert st.events == "watching 2 GPU(s) for XID and critical errors"
    assert [d.lost for d in st.devices] == ["", ""]
    collector.collect()  # GPM needs a baseline sample after the re-init
    assert value(collector.collect(), "gpu_sm_active_ratio", gpu="0") == 0.455
    assert fake.init_refcount() == 1  # the re-inits shut the old generation down


def test_gpu_lost_at_start_then_recovers(fake: FakeNvml) -> None:
    fake.set({"gpu.0.lost": 1})
    c = GpuCollector(str(fake.library), retry_min_s=0.0, retry_max_s=0.0)
    c.start()  # one GPU answering is enough to start
    try:
        assert c.health() == (
            PartState.DEGRADED,
            "gpu 0 (index-0) lost: gpu 0: nvmlDeviceGetHandleByIndex_v2: GPU is lost (15); "
            "re-init in 0 s",
        )
        samples = c.collect()
        assert value(samples, "gpu_up", gpu="0", uuid="index-0") == 0.0
        assert value(samples, "gpu_up", gpu="1", uuid=A100_UUID) == 1.0
        fake.set({"gpu.0.lost": 0})
        samples = c.collect()
        assert value(samples, "gpu_up", gpu="0", uuid=H100_UUID) == 1.0
        assert [s for s in samples if dict(s.labels).get("uuid") == "index-0"] == []
    finally:
        c.close()


def test_gpu_that_falls_off_the_bus_stays_reported(collector: GpuCollector, fake: FakeNvml) -> None:
    collector.collect()
    fake.set({"device_count": 1})  # the A100 is no longer listed
    for _ in range(3):
        samples = collector.collect()
        assert value(samples, "gpu_up", gpu="1", uuid=A100_UUID) == 0.0
        assert value(samples, "gpu_up", gpu="0", uuid=H100_UUID) == 1.0
        assert value(samples, "gpu_count") == 1.0
    assert collector.status().devices[1].lost == "no longer listed by NVML"
    fake.set({"device_count": 2})
    samples = collector.collect()
    assert value(samples, "gpu_up", gpu="1", uuid=A100_UUID) == 1.0
    assert value(samples, "gpu_count") == 2.0


def test_driver_unloaded_and_reloaded(collector: GpuCollector, fake: FakeNvml) -> None:
    collector.collect()
    fake.set({"driver": "unloaded"})
    samples = collector.collect()
    assert [s.value for s in samples if s.spec.name == "gpu_up"] == [0.0, 0.0]
    samples = collector.collect()  # re-init: nvmlInit now fails
    assert [s.value for s in samples if s.spec.name == "gpu_up"] == [0.0, 0.0]
    assert value(samples, "gpu_count") == 0.0  # no GPU answers
    state, reason = collector.health()
    assert state is PartState.DEGRADED
    assert reason == "NVML unavailable: the NVIDIA kernel driver is not loaded; re-init in 0 s"
    assert collector.per_process() == {}
    fake.set({"driver": "loaded"})
    samples = collector.collect()
    assert [s.value for s in samples if s.spec.name == "gpu_up"] == [1.0, 1.0]
    assert value(samples, "gpu_memory_used_bytes", gpu="1") == 1073741824.0
    assert set(collector.per_process()) == {4242, 4343}
    assert collector.health()[0] is PartState.OK


def test_driver_gone_error_marks_every_gpu_lost(collector: GpuCollector, fake: FakeNvml) -> None:
    # NVML_ERROR_DRIVER_NOT_LOADED from a device call: the library lost the driver.
    fake.set({"gpu.1.err.nvmlDeviceGetUtilizationRates": 9})
    samples = collector.collect()
    assert [s.value for s in samples if s.spec.name == "gpu_up"] == [0.0, 0.0]
    assert not [s for s in samples if s.spec.name == "gpu_power_watts"]
    fake.unset("gpu.1.err.nvmlDeviceGetUtilizationRates")
    samples = collector.collect()
    assert [s.value for s in samples if s.spec.name == "gpu_up"] == [1.0, 1.0]


def test_reinit_backs_off_exponentially(fake: FakeNvml) -> None:
    clock = ManualClock()
    c = GpuCollector(str(fake.library), retry_min_s=10.0, retry_max_s=40.0, clock=clock)
    c.start()
    try:
        fake.set({"gpu.0.lost": 1})
        c.collect()  # loss seen at t=1000: first re-init due at 1010
        attempts = []
        for t in (1005, 1010, 1015, 1029, 1030, 1069, 1070, 1109, 1110):
            clock.now = t
            c.collect()
            attempts.append(c.reinit_attempts)
        # Delays 10, 20, 40, 40 (capped): attempts at 1010, 1030, 1070, 1110.
        assert attempts == [0, 1, 1, 1, 2, 2, 3, 3, 4]
        assert c.status().retry_in_s == 40.0
        fake.set({"gpu.0.lost": 0})
        clock.now = 1150
        assert value(c.collect(), "gpu_up", gpu="0") == 1.0
        # After a recovery the next loss starts again from the shortest delay.
        fake.set({"gpu.0.lost": 1})
        c.collect()
        assert c.status().retry_in_s == 10.0
    finally:
        c.close()


def test_unexpected_error_is_logged_once_and_costs_one_field(
    collector: GpuCollector, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.set({"gpu.0.err.nvmlDeviceGetEnforcedPowerLimit": 999})  # NVML_ERROR_UNKNOWN
    caplog.set_level(logging.INFO, "bpfdyno.sources.gpu.collector")
    for _ in range(4):
        samples = collector.collect()
        assert math.isnan(value(samples, "gpu_power_limit_watts", gpu="0"))
        assert value(samples, "gpu_power_watts", gpu="0") == 312.5
    lines = [r for r in caplog.records if "nvmlDeviceGetEnforcedPowerLimit" in r.getMessage()]
    assert [(r.levelno, r.getMessage()) for r in lines] == [
        (
            logging.WARNING,
            "NVML nvmlDeviceGetEnforcedPowerLimit on gpu 0: Unknown Error (999); the fields "
            "it feeds are reported as not available (logged once)",
        )
    ]


OLD_DRIVER_SCRIPT = """
import json, logging, math
from bpfdyno.sources.gpu.collector import GpuCollector
records = []
handler = logging.Handler()
handler.emit = lambda r: records.append(r.getMessage())
logging.getLogger("bpfdyno.sources.gpu.collector").addHandler(handler)
logging.getLogger("bpfdyno.sources.gpu.collector").setLevel(logging.INFO)
c = GpuCollector(LIB)
c.start()
rounds = [{f"{s.spec.name}{dict(s.labels)}": s.value for s in c.collect()} for _ in range(3)]
st = c.status()
out = {
    "last": rounds[-1],
    "missing": list(st.missing_functions),
    "gpm": [d.gpm for d in st.devices],
    "skipped": c._nv.skipped_calls,
    "not_found_logs": [m for m in records if "Function Not Found" in m],
}
c.close()
print(json.dumps(out))
"""


def test_old_driver_without_newer_functions(fake_libs: FakeLibs, fake: FakeNvml) -> None:
    out = run_child(OLD_DRIVER_SCRIPT, fake_libs.old, fake.path)
    last = out["last"]
    assert isinstance(last, dict)
    h100 = str({"gpu": "0", "uuid": H100_UUID, "namespace": "", "pod": "", "container": ""})
    # Missing functions: their fields are not available...
    assert math.isnan(last[f"gpu_pcie_tx_bytes_per_second{h100}"])
    assert math.isnan(last[f"gpu_memory_reserved_bytes{h100}"])
    assert math.isnan(last[f"gpu_sm_active_ratio{h100}"])
    # ...older variants stand in where they exist, and everything else works.
    assert last[f"gpu_throttle_reasons{h100}"] == float(0x24)
    assert last[f"gpu_temperature_celsius{h100}"] == 64.0
    assert last[f"gpu_memory_used_bytes{h100}"] == 42949672960.0
    assert last[f"gpu_power_watts{h100}"] == 312.5
    assert last[f"gpu_up{h100}"] == 1.0
    assert out["missing"] == [
        "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetMemoryInfo_v2",
        "nvmlDeviceGetPcieThroughput",
        "nvmlDeviceGetTemperatureV",
        "nvmlGpmQueryDeviceSupport",
    ]
    assert (
        out["gpm"]
        == ["unavailable: the NVIDIA driver is too old for GPM (needs R520 or newer)"] * 2
    )
    # Each missing function is logged once, then never called again.
    logs = out["not_found_logs"]
    assert isinstance(logs, list)
    for fn in out["missing"]:  # type: ignore[union-attr]
        assert len([m for m in logs if f"NVML {fn} on gpu 0: Function Not Found (13)" in m]) == 1, (
            fn,
            logs,
        )
    assert len(logs) == 5
    # Calls not made: at start the GPM query on gpu 1; in round 1 gpu 0's PCIe rx and gpu 1's
    # five (memory v2, temperature V, throttle, PCIe tx and rx); then 2 x 5 in later rounds.
    assert out["skipped"] == 1 + 6 + 10 + 10


NO_LIBRARY_SCRIPT = """
import json
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.gpu.collector import GpuCollector, doctor_check
try:
    GpuCollector(LIB).start()
    reason = None
except CollectorUnavailable as e:
    reason = str(e)
print(json.dumps({"reason": reason, "doctor": doctor_check(LIB)}))
"""


def test_no_nvml_library(fake: FakeNvml) -> None:
    out = run_child(NO_LIBRARY_SCRIPT, None, fake.path)
    assert out["reason"] == (
        "the NVML library libnvidia-ml.so.1 was not found — install the NVIDIA driver (it ships "
        "libnvidia-ml.so.1), or set [gpu] library_path; on a machine without GPUs disable this "
        "collector"
    )
    assert out["doctor"] == [
        None,
        "no NVIDIA driver on this machine (libnvidia-ml.so.1 not found)",
        "install the NVIDIA driver (it ships libnvidia-ml.so.1), or set [gpu] library_path; on "
        "a machine without GPUs disable this collector",
    ]


SYSTEM_LIBRARY_SCRIPT = """
import json
from bpfdyno.sources.gpu.collector import GpuCollector
c = GpuCollector(LIB)
c.start()
power = [s.value for s in c.collect() if s.spec.name == "gpu_power_watts"]
c.close()
print(json.dumps({"power": power}))
"""


def test_library_found_by_the_dynamic_loader(fake_libs: FakeLibs, fake: FakeNvml) -> None:
    # Production: no library_path, pynvml dlopens libnvidia-ml.so.1 from the loader's path.
    out = run_child(
        SYSTEM_LIBRARY_SCRIPT, None, fake.path, LD_LIBRARY_PATH=str(fake_libs.full.parent)
    )
    assert out == {"power": [312.5, 90.25]}
