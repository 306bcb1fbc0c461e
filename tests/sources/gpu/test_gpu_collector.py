"""The GPU collector against the fake NVML library: exact values, units, per-process data."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_fake_nvml import A100_UUID, H100_UUID, FakeNvml, as_dict, value

from bpfdyno.app.catalog import CATALOG
from bpfdyno.core import config
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.gpu.collector import GpuCollector, ProcGpu, doctor_check

pytest_plugins = ("gpu_fake_nvml",)  # the fake_libs / fake fixtures


@pytest.fixture
def collector(fake: FakeNvml) -> Iterator[GpuCollector]:
    c = GpuCollector(str(fake.library), retry_min_s=0.0)
    c.start()
    yield c
    c.close()


def test_every_field_exact_with_units_converted(collector: GpuCollector, fake: FakeNvml) -> None:
    samples = collector.collect()
    got = as_dict(samples)
    no_pod = (("namespace", ""), ("pod", ""), ("container", ""))  # not on Kubernetes
    h100 = (("gpu", "0"), ("uuid", H100_UUID), *no_pod)
    a100 = (("gpu", "1"), ("uuid", A100_UUID), *no_pod)
    expected = {
        ("gpu_count", ()): 2.0,
        ("gpu_up", h100): 1.0,
        (
            "gpu_info",
            (*h100, ("name", "NVIDIA H100 80GB HBM3"), ("pci_bus_id", "00000000:18:00.0")),
        ): 1.0,
        ("gpu_utilization_ratio", h100): 0.57,  # 57 %: 57 * 0.01 would be off
        ("gpu_memory_utilization_ratio", h100): 0.45,
        ("gpu_memory_used_bytes", h100): 42949672960.0,
        ("gpu_memory_free_bytes", h100): 42278584320.0,
        ("gpu_memory_total_bytes", h100): 85899345920.0,
        ("gpu_memory_reserved_bytes", h100): 671088640.0,
        ("gpu_power_watts", h100): 312.5,  # 312500 mW
        ("gpu_power_limit_watts", h100): 700.0,
        ("gpu_temperature_celsius", h100): 64.0,
        ("gpu_sm_clock_hertz", h100): 1_980_000_000.0,  # 1980 MHz
        ("gpu_memory_clock_hertz", h100): 2_619_000_000.0,
        ("gpu_pcie_tx_bytes_per_second", h100): 123456 * 1024.0,  # KB/s
        ("gpu_pcie_rx_bytes_per_second", h100): 654321 * 1024.0,
        ("gpu_ecc_errors_total", (*h100, ("type", "corrected"))): 3.0,
        ("gpu_ecc_errors_total", (*h100, ("type", "uncorrected"))): 0.0,
        ("gpu_throttle_reasons", h100): float(0x24),
        ("gpu_mig_mode_enabled", h100): 0.0,
        ("gpu_xid_errors_total", h100): 0.0,
        ("gpu_profiling_paused", h100): 0.0,
        ("gpu_utilization_ratio", a100): 0.10,
        ("gpu_power_watts", a100): 90.25,
        ("gpu_ecc_errors_total", (*a100, ("type", "uncorrected"))): 2.0,
        ("gpu_mig_mode_enabled", a100): 1.0,
        ("gpu_pcie_rx_bytes_per_second", a100): 1024.0,
        ("gpu_process_memory_used_bytes", (("gpu", "0"), ("pid", "4242"))): 1073741824.0,
        ("gpu_process_memory_used_bytes", (("gpu", "0"), ("pid", "4343"))): 2147483648.0,
        ("gpu_process_memory_used_bytes", (("gpu", "1"), ("pid", "4343"))): 536870912.0,
        ("gpu_process_sm_utilization_ratio", (("gpu", "0"), ("pid", "4242"))): 0.60,  # newest
        ("gpu_process_memory_utilization_ratio", (("gpu", "0"), ("pid", "4242"))): 0.25,
    }
    for key, want in expected.items():
        assert got[key] == want, key
    reasons = {
        dict(s.labels)["reason"]: s.value
        for s in samples
        if s.spec.name == "gpu_throttle_reason_active" and dict(s.labels)["gpu"] == "0"
    }
    assert reasons == {
        "gpu_idle": 0.0,
        "applications_clocks_setting": 0.0,
        "sw_power_cap": 1.0,
        "hw_slowdown": 0.0,
        "sync_boost": 0.0,
        "sw_thermal_slowdown": 1.0,
        "hw_thermal_slowdown": 0.0,
        "hw_power_brake_slowdown": 0.0,
        "display_clock_setting": 0.0,
    }
    # No sample for pid 4343 on gpu 0: "not available", never 0.
    assert math.isnan(got[("gpu_process_sm_utilization_ratio", (("gpu", "0"), ("pid", "4343")))])
    # NVLink is a rate between two reads: the first round has none.
    assert math.isnan(got[("gpu_nvlink_tx_bytes_per_second", h100)])
    assert all(s.spec.source == "gpu" and s.spec.name in CATALOG for s in samples)


def test_nvlink_rate_from_counter_deltas_and_reset(collector: GpuCollector, fake: FakeNvml) -> None:
    collector.collect()
    # 2 s later (NVML's read timestamps): +4000 KiB sent, +1000 KiB received.
    fake.set({"clock_us": 3_000_000, "gpu.0.nvlink_tx_kib": 5000, "gpu.0.nvlink_rx_kib": 3000})
    samples = collector.collect()
    assert value(samples, "gpu_nvlink_tx_bytes_per_second", gpu="0") == 4000 * 1024 / 2
    assert value(samples, "gpu_nvlink_rx_bytes_per_second", gpu="0") == 1000 * 1024 / 2
    # A counter going backwards (driver reload) gives no rate for that interval, not a
    # negative one; the next interval is measured from the new value.
    fake.set({"clock_us": 4_000_000, "gpu.0.nvlink_tx_kib": 10, "gpu.0.nvlink_rx_kib": 3100})
    samples = collector.collect()
    assert math.isnan(value(samples, "gpu_nvlink_tx_bytes_per_second", gpu="0"))
    assert value(samples, "gpu_nvlink_rx_bytes_per_second", gpu="0") == 100 * 1024.0
    # The A100 has no NVLink counters at all.
    assert math.isnan(value(samples, "gpu_nvlink_tx_bytes_per_second", gpu="1"))


def test_not_supported_fields_are_nan_and_the_rest_stays(
    collector: GpuCollector, fake: FakeNvml, caplog: pytest.LogCaptureFixture
) -> None:
    fake.unset("gpu.0.power_mw", "gpu.0.temp_c", "gpu.0.mem_reserved")
    fake.set({"gpu.0.err.nvmlDeviceGetClockInfo": 4})  # NVML_ERROR_NO_PERMISSION
    caplog.set_level(logging.INFO, "bpfdyno.sources.gpu.collector")
    for _ in range(3):
        samples = collector.collect()
    for name in (
        "gpu_power_watts",
        "gpu_temperature_celsius",
        "gpu_memory_reserved_bytes",
        "gpu_sm_clock_hertz",
    ):
        assert math.isnan(value(samples, name, gpu="0")), name
        assert not math.isnan(value(samples, name, gpu="1")), name
    # The v2 memory call is not supported on gpu 0 any more; v1 still gives used/total.
    assert value(samples, "gpu_memory_used_bytes", gpu="0") == 42949672960.0
    assert value(samples, "gpu_power_limit_watts", gpu="0") == 700.0
    assert value(samples, "gpu_up", gpu="0") == 1.0
    msgs = [r.getMessage() for r in caplog.records]
    power = [x for x in msgs if "nvmlDeviceGetPowerUsage on gpu 0: Not Supported (3)" in x]
    clock_sm = [
        x for x in msgs if "nvmlDeviceGetClockInfo[sm] on gpu 0: Insufficient Permissions (4)" in x
    ]
    assert len(power) == 1 and len(clock_sm) == 1, msgs
    assert [r.levelno for r in caplog.records if "Insufficient Permissions" in r.getMessage()] == [
        logging.WARNING
    ] * 2
    assert collector.health()[0] is PartState.OK


def test_per_process_join(collector: GpuCollector, fake: FakeNvml) -> None:
    collector.collect()
    procs = collector.per_process()
    assert procs[4242] == ProcGpu(
        4242, gpu=0, gpus=(0,), used_memory_bytes=1073741824.0, sm_util_ratio=0.60
    )
    # pid 4343 has contexts on both GPUs: memory summed, primary GPU the larger one, and no
    # utilization sample on it (NaN, not 0).
    p = procs[4343]
    assert (p.pid, p.gpu, p.gpus, p.used_memory_bytes) == (4343, 0, (0, 1), 2684354560.0)
    assert math.isnan(p.sm_util_ratio)
    assert set(procs) == {4242, 4343}
    assert collector.gpu_memory_by_pid() == {4242: 1073741824, 4343: 2684354560}
    # Utilization samples already seen are not reported again (lastSeenTimeStamp).
    fake.set({"gpu.0.procs": "4242:1024"})
    samples = collector.collect()
    assert math.isnan(value(samples, "gpu_process_sm_utilization_ratio", gpu="0", pid="4242"))
    fake.set({"gpu.0.proc_util": "4242:990000:7:3"})
    samples = collector.collect()
    assert value(samples, "gpu_process_sm_utilization_ratio", gpu="0", pid="4242") == 0.07
    assert value(samples, "gpu_process_memory_utilization_ratio", gpu="0", pid="4242") == 0.03
    assert collector.per_process()[4242].used_memory_bytes == 1024.0
    assert set(collector.per_process()) == {4242, 4343}
    # pid 4343 left gpu 0: only its gpu 1 context remains.
    assert collector.per_process()[4343].gpus == (1,)


def test_status_reports_devices_and_functions(collector: GpuCollector) -> None:
    collector.collect()
    st = collector.status()
    assert st.state is PartState.OK
    assert st.driver_version == "550.54.15"
    assert [(d.index, d.uuid, d.name, d.pci_bus_id, d.lost) for d in st.devices] == [
        (0, H100_UUID, "NVIDIA H100 80GB HBM3", "00000000:18:00.0", ""),
        (1, A100_UUID, "NVIDIA A100-SXM4-40GB", "00000000:3B:00.0", ""),
    ]
    assert st.devices[0].gpm == "active"
    assert (
        st.devices[1].gpm
        == "unavailable: NVIDIA A100-SXM4-40GB has no GPM (it needs a Hopper-class or newer GPU)"
    )
    assert st.events == "watching 2 GPU(s) for XID and critical errors"
    assert st.missing_functions == ()
    assert st.retry_in_s is None


def test_driver_not_loaded_at_start(fake: FakeNvml) -> None:
    fake.set({"driver": "unloaded"})
    with pytest.raises(CollectorUnavailable) as e:
        GpuCollector(str(fake.library)).start()
    assert str(e.value) == (
        "the NVIDIA kernel driver is not loaded — load it (modprobe nvidia) or install the "
        "NVIDIA driver; on a machine without GPUs disable this collector ([collectors.gpu] "
        "enabled = false)"
    )


def test_version_mismatch_and_no_gpu_at_start(fake: FakeNvml) -> None:
    fake.set({"driver": "mismatch"})
    with pytest.raises(CollectorUnavailable, match=r"different versions.*reboot, or reload"):
        GpuCollector(str(fake.library)).start()
    fake.set({"driver": "loaded", "device_count": 0})
    with pytest.raises(
        CollectorUnavailable, match=re.escape("NVML works but lists no GPU — check `nvidia-smi -L`")
    ):
        GpuCollector(str(fake.library)).start()
    assert fake.calls("nvmlShutdown") >= 1


def test_missing_library_path(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable, match="does not exist — fix \\[gpu\\] library_path"):
        GpuCollector(str(tmp_path / "nope.so")).start()
    bad = tmp_path / "libbad.so"
    bad.write_text("not an ELF file")
    with pytest.raises(CollectorUnavailable, match="cannot load the NVML library"):
        GpuCollector(str(bad)).start()


def test_doctor_check(fake: FakeNvml) -> None:
    assert doctor_check(str(fake.library)) == (
        True,
        "2 GPU(s) (NVIDIA A100-SXM4-40GB, NVIDIA H100 80GB HBM3), driver 550.54.15; GPM on 1 of 2",
        "",
    )
    fake.set({"driver": "unloaded"})
    ok, detail, fix = doctor_check(str(fake.library))
    assert (ok, detail) == (False, "the NVIDIA kernel driver is not loaded")
    assert "modprobe nvidia" in fix


def test_gpu_config_section(fake: FakeNvml, tmp_path: Path) -> None:
    toml = tmp_path / "bpfdyno.toml"
    toml.write_text(f'[gpu]\nlibrary_path = "{fake.library}"\ngpm_enabled = false\n')
    cfg = config.load(toml)
    assert (cfg.gpu.library_path, cfg.gpu.gpm_enabled, cfg.gpu.events_enabled) == (
        str(fake.library),
        False,
        True,
    )
    assert cfg.collector_enabled("dcgm")
    c = GpuCollector.from_config(cfg.gpu)
    c.start()
    try:
        assert c.status().devices[0].gpm == "disabled ([gpu] gpm_enabled = false)"
        assert c.pause_profiling(1.0) is False
    finally:
        c.close()
    toml.write_text("[gpu]\ngpm = true\n")
    with pytest.raises(config.ConfigError, match=r":2: unknown key 'gpu.gpm'"):
        config.load(toml)


# --- what a round asks NVML: as little as the values allow -----------------------------------


def test_one_field_values_call_reads_power_and_the_nvlink_and_pcie_counters(
    collector: GpuCollector, fake: FakeNvml
) -> None:
    # A driver with the fields: power and both byte counters come in the one call per GPU
    # and round that NVLink already needed; no nvmlDeviceGetPowerUsage, and no
    # nvmlDeviceGetPcieThroughput (which samples for 20 ms per call).
    fake.set(
        {"gpu.0.power_avg_mw": 301000, "gpu.0.pcie_tx_bytes": 1000, "gpu.0.pcie_rx_bytes": 5000}
    )
    fake.reset_calls()
    samples = collector.collect()
    assert value(samples, "gpu_power_watts", gpu="0") == 301.0
    assert math.isnan(value(samples, "gpu_pcie_tx_bytes_per_second", gpu="0"))  # one reading
    fake.set({"clock_us": 3_000_000, "gpu.0.pcie_tx_bytes": 9000, "gpu.0.pcie_rx_bytes": 5400})
    samples = collector.collect()
    assert value(samples, "gpu_pcie_tx_bytes_per_second", gpu="0") == 8000 / 2
    assert value(samples, "gpu_pcie_rx_bytes_per_second", gpu="0") == 400 / 2
    assert fake.calls("nvmlDeviceGetFieldValues", 0) == 2
    assert fake.calls("nvmlDeviceGetPowerUsage", 0) == 0
    assert fake.calls("nvmlDeviceGetPcieThroughput", 0) == 0
    # The A100 of the fake has none of them: after the first round it is not asked for them
    # again and the calls of older drivers give the values.
    assert value(samples, "gpu_power_watts", gpu="1") == 90.25
    assert value(samples, "gpu_pcie_rx_bytes_per_second", gpu="1") == 1024.0
    assert fake.calls("nvmlDeviceGetPowerUsage", 1) == 2


#: GPU 0 with the batched fields (power and the PCIe byte counters).
WITH_FIELDS = {"gpu.0.power_avg_mw": 301000, "gpu.0.pcie_tx_bytes": 1000,
               "gpu.0.pcie_rx_bytes": 5000}  # fmt: skip


@pytest.mark.parametrize(
    ("control", "asked_again"),
    [
        # The whole call fails: an error for the call (UNKNOWN), or NOT_SUPPORTED for it.
        ({**WITH_FIELDS, "gpu.0.err.nvmlDeviceGetFieldValues": 999}, True),
        ({**WITH_FIELDS, "gpu.0.err.nvmlDeviceGetFieldValues": 3}, True),
        # An older driver answers the ids it does not know with INVALID_ARGUMENT per entry.
        ({**dict.fromkeys(WITH_FIELDS), "field_missing_code": 2}, False),
    ],
)
def test_power_and_pcie_come_from_their_own_calls_when_the_batched_fields_fail(
    collector: GpuCollector, fake: FakeNvml, control: dict[str, int | None], asked_again: bool
) -> None:
    fake.set({k: v for k, v in control.items() if v is not None})
    fake.unset(*(k for k, v in control.items() if v is None))
    fake.reset_calls()
    for _ in range(3):
        samples = collector.collect()
        assert value(samples, "gpu_power_watts", gpu="0") == 312.5
        assert value(samples, "gpu_pcie_tx_bytes_per_second", gpu="0") == 123456 * 1024
        assert value(samples, "gpu_pcie_rx_bytes_per_second", gpu="0") == 654321 * 1024
    assert fake.calls("nvmlDeviceGetPowerUsage", 0) == 3
    assert fake.calls("nvmlDeviceGetPcieThroughput", 0) == 2 * 3  # tx and rx
    # A failing call is tried again each round (it may recover; NVLink has no other
    # source); fields the driver lacks are not asked for again.
    assert fake.calls("nvmlDeviceGetFieldValues", 0) == 3
    if asked_again:  # the call works again: the batched power is back
        fake.unset("gpu.0.err.nvmlDeviceGetFieldValues")
        assert value(collector.collect(), "gpu_power_watts", gpu="0") == 301.0


def test_slow_fields_are_read_every_30_s_and_reported_between(fake: FakeNvml) -> None:
    now = [1000.0]
    c = GpuCollector(str(fake.library), clock=lambda: now[0])
    c.start()
    try:
        fake.reset_calls()
        assert value(c.collect(), "gpu_power_limit_watts", gpu="0") == 700.0
        fake.set({"gpu.0.power_limit_mw": 500000, "gpu.0.ecc_corrected": 9})
        for _ in range(29):
            now[0] += 1.0
            samples = c.collect()
            assert value(samples, "gpu_power_limit_watts", gpu="0") == 700.0
            assert value(samples, "gpu_ecc_errors_total", gpu="0", type="corrected") == 3.0
        assert fake.calls("nvmlDeviceGetEnforcedPowerLimit", 0) == 1
        assert fake.calls("nvmlDeviceGetMigMode", 0) == 1
        now[0] += 1.0  # 30 s after the last read
        samples = c.collect()
        assert value(samples, "gpu_power_limit_watts", gpu="0") == 500.0
        assert value(samples, "gpu_ecc_errors_total", gpu="0", type="corrected") == 9.0
        assert fake.calls("nvmlDeviceGetEnforcedPowerLimit", 0) == 2
    finally:
        c.close()


def test_processes_are_asked_for_when_processes_start_or_exit(fake: FakeNvml) -> None:
    now, churn = [1000.0], [0]
    c = GpuCollector(str(fake.library), clock=lambda: now[0], process_churn=lambda: churn[0])
    c.start()
    try:
        fake.reset_calls()

        def rounds(n: int) -> int:
            for _ in range(n):
                now[0] += 1.0
                samples = c.collect()
                assert value(samples, "gpu_process_memory_used_bytes", gpu="0", pid="4242") == 2**30
            # pynvml calls the function twice per query (the count, then the list).
            return fake.calls("nvmlDeviceGetComputeRunningProcesses_v3", 0) // 2

        assert rounds(5) == 1  # the first round; no process started or exited since
        churn[0] += 1  # an exec or exit somewhere on the host
        assert rounds(1) == 2
        assert rounds(8) == 2
        assert rounds(2) == 3  # and at least every 10 s (memory use changes by itself)
        assert c.gpu_memory_by_pid() == {4242: 2**30, 4343: 2684354560}
    finally:
        c.close()


def test_a_fresh_read_of_gpu_processes_is_never_older_than_asked(fake: FakeNvml) -> None:
    """No process started or exited, so the rounds ask for GPU processes only every 10 s; the
    process table's reader asks for them no older than one round and gets what NVML says now."""
    now = [1000.0]
    c = GpuCollector(str(fake.library), clock=lambda: now[0], process_churn=lambda: 0)
    c.start()
    try:
        c.collect()
        # 4343 left GPU 0 (it keeps its 512 MiB on GPU 1); 5151 arrived.
        fake.set({"gpu.0.procs": "4242:1073741824,5151:4096"})
        now[0] += 2.0
        c.collect()  # not due: the rounds still have the old list
        assert c.gpu_memory_by_pid() == {4242: 2**30, 4343: 2684354560}
        fake.reset_calls()
        fresh = {4242: 2**30, 4343: 2**29, 5151: 4096}
        assert c.fresh_gpu_memory_by_pid(1.0) == fresh
        # A second reader within the round shares that query.
        assert c.fresh_gpu_memory_by_pid(1.0) == fresh
        assert fake.calls("nvmlDeviceGetComputeRunningProcesses_v3", 0) // 2 == 1
        assert c.gpu_memory_by_pid() == fresh
        now[0] += 1.0
        samples = c.collect()  # the rounds report what the reader's query found
        assert value(samples, "gpu_process_memory_used_bytes", gpu="0", pid="5151") == 4096
    finally:
        c.close()
