"""The GPU collector's metrics, declared once, and the tables that feed them.

Per-GPU series carry ``gpu`` (the NVML index) and ``uuid`` (stable across reboots and index
changes), and on Kubernetes the ``namespace``, ``pod`` and ``container`` the kubelet gave the
GPU to (empty when none, or several, hold it: see `bpfdyno.sources.kubelet`); per-process
series carry ``gpu`` and ``pid``. Label values are bounded: GPUs,
ECC error types, throttle reasons, and the processes NVML lists on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable

TABLE = MetricTable("gpu")
_G = ("gpu", "uuid", "namespace", "pod", "container")
_P = ("gpu", "pid")


def _declare(
    name: str, kind: MetricKind, unit: str, help: str, labels: tuple[str, ...] = _G
) -> MetricSpec:
    return TABLE.declare(name, kind, unit, help, labels)


GAUGE, RATIO, RATE, COUNTER = (
    MetricKind.GAUGE,
    MetricKind.RATIO,
    MetricKind.RATE,
    MetricKind.COUNTER,
)

GPU_COUNT = _declare(
    "gpu_count",
    GAUGE,
    "GPUs",
    "GPUs that NVML lists and that answered this round; a GPU falling off the bus or a lost "
    "driver lowers it.",
    (),
)
GPU_INFO = _declare(
    "gpu_info",
    GAUGE,
    "info",
    "Always 1; the labels carry the GPU model and PCI bus id (nvmlDeviceGetName, "
    "nvmlDeviceGetPciInfo_v3).",
    (*_G, "name", "pci_bus_id"),
)
GPU_UP = _declare(
    "gpu_up",
    GAUGE,
    "boolean",
    "1 while NVML answers for this GPU; 0 once it is lost (GPU_IS_LOST, driver gone, no longer "
    "listed) until a re-initialisation finds it again.",
)
UTILIZATION = _declare(
    "gpu_utilization_ratio",
    RATIO,
    "ratio",
    "Fraction of the last sample period a kernel ran on the GPU (nvmlDeviceGetUtilizationRates "
    "gpu, percent / 100).",
)
MEMORY_UTILIZATION = _declare(
    "gpu_memory_utilization_ratio",
    RATIO,
    "ratio",
    "Fraction of the last sample period device memory was read or written "
    "(nvmlDeviceGetUtilizationRates memory, percent / 100).",
)
MEMORY_USED = _declare(
    "gpu_memory_used_bytes", GAUGE, "bytes", "Device memory allocated (nvmlDeviceGetMemoryInfo)."
)
MEMORY_FREE = _declare(
    "gpu_memory_free_bytes", GAUGE, "bytes", "Device memory free (nvmlDeviceGetMemoryInfo)."
)
MEMORY_TOTAL = _declare(
    "gpu_memory_total_bytes", GAUGE, "bytes", "Device memory installed (nvmlDeviceGetMemoryInfo)."
)
MEMORY_RESERVED = _declare(
    "gpu_memory_reserved_bytes",
    GAUGE,
    "bytes",
    "Device memory reserved by the driver and firmware (nvmlDeviceGetMemoryInfo_v2; absent on "
    "drivers without it).",
)
POWER = _declare(
    "gpu_power_watts", GAUGE, "watts", "Board power draw (nvmlDeviceGetPowerUsage, mW / 1000)."
)
POWER_LIMIT = _declare(
    "gpu_power_limit_watts",
    GAUGE,
    "watts",
    "Enforced power limit (nvmlDeviceGetEnforcedPowerLimit, mW / 1000).",
)
TEMPERATURE = _declare(
    "gpu_temperature_celsius",
    GAUGE,
    "celsius",
    "GPU die temperature (nvmlDeviceGetTemperatureV, or nvmlDeviceGetTemperature on older "
    "drivers).",
)
SM_CLOCK = _declare(
    "gpu_sm_clock_hertz", GAUGE, "hertz", "Current SM clock (nvmlDeviceGetClockInfo, MHz x 1e6)."
)
MEMORY_CLOCK = _declare(
    "gpu_memory_clock_hertz",
    GAUGE,
    "hertz",
    "Current memory clock (nvmlDeviceGetClockInfo, MHz x 1e6).",
)
PCIE_TX = _declare(
    "gpu_pcie_tx_bytes_per_second",
    RATE,
    "bytes/s",
    "PCIe bytes sent by the GPU, measured by NVML over 20 ms (nvmlDeviceGetPcieThroughput, "
    "KB/s x 1024).",
)
PCIE_RX = _declare(
    "gpu_pcie_rx_bytes_per_second",
    RATE,
    "bytes/s",
    "PCIe bytes received by the GPU, measured by NVML over 20 ms (nvmlDeviceGetPcieThroughput, "
    "KB/s x 1024).",
)
NVLINK_TX = _declare(
    "gpu_nvlink_tx_bytes_per_second",
    RATE,
    "bytes/s",
    "NVLink data bytes sent on all links over the interval (field "
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: KiB counter delta x 1024 / seconds).",
)
NVLINK_RX = _declare(
    "gpu_nvlink_rx_bytes_per_second",
    RATE,
    "bytes/s",
    "NVLink data bytes received on all links over the interval (field "
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: KiB counter delta x 1024 / seconds).",
)
ECC_ERRORS = _declare(
    "gpu_ecc_errors_total",
    COUNTER,
    "errors",
    "ECC errors since the driver loaded (nvmlDeviceGetTotalEccErrors, volatile); type is "
    "corrected or uncorrected.",
    (*_G, "type"),
)
THROTTLE_REASONS = _declare(
    "gpu_throttle_reasons",
    GAUGE,
    "bitmask",
    "Clocks-event (throttle) reason bits (nvmlDeviceGetCurrentClocksEventReasons, or "
    "...ThrottleReasons on older drivers); gpu_throttle_reason_active names them.",
)
THROTTLE_REASON_ACTIVE = _declare(
    "gpu_throttle_reason_active",
    GAUGE,
    "boolean",
    "1 while this reason holds the clocks down: gpu_idle, applications_clocks_setting, "
    "sw_power_cap, hw_slowdown, sync_boost, sw_thermal_slowdown, hw_thermal_slowdown, "
    "hw_power_brake_slowdown, display_clock_setting.",
    (*_G, "reason"),
)
MIG_MODE = _declare(
    "gpu_mig_mode_enabled", GAUGE, "boolean", "1 when MIG mode is on (nvmlDeviceGetMigMode)."
)
XID_ERRORS = _declare(
    "gpu_xid_errors_total",
    COUNTER,
    "events",
    "XID critical-error events received from the NVML event set since the agent started; each "
    "also goes to the event stream as kind gpu_xid.",
)
PROFILING_PAUSED = _declare(
    "gpu_profiling_paused",
    GAUGE,
    "boolean",
    "1 while GPM sampling is paused on this GPU (dcgm-pause, or a Kineto trace in a process on "
    "it); absent on GPUs without GPM.",
)

# GPM (Hopper and newer): NVML computes these from two samples taken one interval apart.
GR_ENGINE_ACTIVE = _declare(
    "gpu_gr_engine_active_ratio",
    RATIO,
    "ratio",
    "Fraction of the interval the graphics/compute engine was active (GPM GRAPHICS_UTIL; "
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE).",
)
SM_ACTIVE = _declare(
    "gpu_sm_active_ratio",
    RATIO,
    "ratio",
    "SMs busy, averaged over the interval (GPM SM_UTIL; DCGM_FI_PROF_SM_ACTIVE).",
)
SM_OCCUPANCY = _declare(
    "gpu_sm_occupancy_ratio",
    RATIO,
    "ratio",
    "Resident warps over the SMs' maximum (GPM SM_OCCUPANCY; DCGM_FI_PROF_SM_OCCUPANCY).",
)
TENSOR_ACTIVE = _declare(
    "gpu_tensor_active_ratio",
    RATIO,
    "ratio",
    "Fraction of the interval any tensor pipe was active (GPM ANY_TENSOR_UTIL; "
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
)
DRAM_BW_UTIL = _declare(
    "gpu_dram_bw_util_ratio",
    RATIO,
    "ratio",
    "DRAM bandwidth used over its peak (GPM DRAM_BW_UTIL; DCGM_FI_PROF_DRAM_ACTIVE).",
)
FP64_ACTIVE = _declare(
    "gpu_fp64_active_ratio",
    RATIO,
    "ratio",
    "Fraction of the interval the FP64 pipe was active (GPM FP64_UTIL).",
)
FP32_ACTIVE = _declare(
    "gpu_fp32_active_ratio",
    RATIO,
    "ratio",
    "Fraction of the interval the FP32 pipe was active (GPM FP32_UTIL).",
)
FP16_ACTIVE = _declare(
    "gpu_fp16_active_ratio",
    RATIO,
    "ratio",
    "Fraction of the interval the FP16 pipe was active (GPM FP16_UTIL).",
)
PROF_PCIE_TX = _declare(
    "gpu_prof_pcie_tx_bytes_per_second",
    RATE,
    "bytes/s",
    "PCIe bytes sent over the interval (GPM PCIE_TX_PER_SEC, MiB/s x 1048576).",
)
PROF_PCIE_RX = _declare(
    "gpu_prof_pcie_rx_bytes_per_second",
    RATE,
    "bytes/s",
    "PCIe bytes received over the interval (GPM PCIE_RX_PER_SEC, MiB/s x 1048576).",
)
PROF_NVLINK_TX = _declare(
    "gpu_prof_nvlink_tx_bytes_per_second",
    RATE,
    "bytes/s",
    "NVLink bytes sent on all links over the interval (GPM NVLINK_TOTAL_TX_PER_SEC, MiB/s x "
    "1048576).",
)
PROF_NVLINK_RX = _declare(
    "gpu_prof_nvlink_rx_bytes_per_second",
    RATE,
    "bytes/s",
    "NVLink bytes received on all links over the interval (GPM NVLINK_TOTAL_RX_PER_SEC, MiB/s "
    "x 1048576).",
)

PROCESS_MEMORY = _declare(
    "gpu_process_memory_used_bytes",
    GAUGE,
    "bytes",
    "Device memory used by this process (nvmlDeviceGetComputeRunningProcesses_v3; at most 128 "
    "processes per GPU, largest first).",
    _P,
)
PROCESS_SM_UTILIZATION = _declare(
    "gpu_process_sm_utilization_ratio",
    RATIO,
    "ratio",
    "This process's SM utilization in its newest NVML sample since the last round "
    "(nvmlDeviceGetProcessUtilization); absent when NVML took no new sample.",
    _P,
)
PROCESS_MEMORY_UTILIZATION = _declare(
    "gpu_process_memory_utilization_ratio",
    RATIO,
    "ratio",
    "This process's memory-controller utilization in its newest NVML sample since the last "
    "round (nvmlDeviceGetProcessUtilization).",
    _P,
)

#: NVML clocks-event reason bits (nvmlClocksEventReason*), named for the reason label.
THROTTLE_REASON_BITS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


@dataclass(frozen=True, slots=True)
class GpmMetric:
    """One NVML GPM metric: its id (NVML_GPM_METRIC_*), our spec, and the unit conversion
    ``value * factor / divisor`` (percent -> ratio divides: multiplying by 0.01 rounds worse)."""

    metric_id: int
    spec: MetricSpec
    factor: float = 1.0
    divisor: float = 1.0


#: The DCGM profiling field set (as dynolog collects it), read through NVML GPM instead.
GPM_METRICS: tuple[GpmMetric, ...] = (
    GpmMetric(1, GR_ENGINE_ACTIVE, divisor=100),  # NVML_GPM_METRIC_GRAPHICS_UTIL
    GpmMetric(2, SM_ACTIVE, divisor=100),  # NVML_GPM_METRIC_SM_UTIL
    GpmMetric(3, SM_OCCUPANCY, divisor=100),  # NVML_GPM_METRIC_SM_OCCUPANCY
    GpmMetric(5, TENSOR_ACTIVE, divisor=100),  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
    GpmMetric(10, DRAM_BW_UTIL, divisor=100),  # NVML_GPM_METRIC_DRAM_BW_UTIL
    GpmMetric(11, FP64_ACTIVE, divisor=100),  # NVML_GPM_METRIC_FP64_UTIL
    GpmMetric(12, FP32_ACTIVE, divisor=100),  # NVML_GPM_METRIC_FP32_UTIL
    GpmMetric(13, FP16_ACTIVE, divisor=100),  # NVML_GPM_METRIC_FP16_UTIL
    GpmMetric(20, PROF_PCIE_TX, factor=1024 * 1024),  # NVML_GPM_METRIC_PCIE_TX_PER_SEC
    GpmMetric(21, PROF_PCIE_RX, factor=1024 * 1024),  # NVML_GPM_METRIC_PCIE_RX_PER_SEC
    GpmMetric(61, PROF_NVLINK_TX, factor=1024 * 1024),  # NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC
    GpmMetric(60, PROF_NVLINK_RX, factor=1024 * 1024),  # NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC
)
