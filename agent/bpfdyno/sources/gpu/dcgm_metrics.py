"""Metrics of the ``dcgm`` collector, and the DCGM field each one comes from."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable

TABLE = MetricTable("dcgm")


def _declare(name: str, kind: MetricKind, unit: str, help: str) -> MetricSpec:
    return TABLE.declare(name, kind, unit, help, labels=("gpu",))


_RATIO, _RATE, _GAUGE = MetricKind.RATIO, MetricKind.RATE, MetricKind.GAUGE

#: dynolog's DCGM field set: field id -> (metric, factor applied to DCGM's value).
DCGM_FIELDS: dict[int, tuple[MetricSpec, float]] = {
    1002: (
        _declare(
            "gpu_dcgm_sm_active_ratio",
            _RATIO,
            "ratio",
            "SMs with at least one warp assigned, over the update period (DCGM field 1002, "
            "DCGM_FI_PROF_SM_ACTIVE).",
        ),
        1.0,
    ),
    1003: (
        _declare(
            "gpu_dcgm_sm_occupancy_ratio",
            _RATIO,
            "ratio",
            "Resident warps over the SMs' maximum (DCGM field 1003, DCGM_FI_PROF_SM_OCCUPANCY).",
        ),
        1.0,
    ),
    1004: (
        _declare(
            "gpu_dcgm_tensor_active_ratio",
            _RATIO,
            "ratio",
            "Cycles any tensor pipe was active (DCGM field 1004, DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
        ),
        1.0,
    ),
    1005: (
        _declare(
            "gpu_dcgm_dram_active_ratio",
            _RATIO,
            "ratio",
            "Cycles the device memory interface was sending or receiving data (DCGM field "
            "1005, DCGM_FI_PROF_DRAM_ACTIVE; dynolog's hbm_mem_bw_util).",
        ),
        1.0,
    ),
    1006: (
        _declare(
            "gpu_dcgm_fp64_active_ratio",
            _RATIO,
            "ratio",
            "Cycles the FP64 pipe was active (DCGM field 1006).",
        ),
        1.0,
    ),
    1007: (
        _declare(
            "gpu_dcgm_fp32_active_ratio",
            _RATIO,
            "ratio",
            "Cycles the FP32 pipe was active (DCGM field 1007).",
        ),
        1.0,
    ),
    1008: (
        _declare(
            "gpu_dcgm_fp16_active_ratio",
            _RATIO,
            "ratio",
            "Cycles the FP16 pipe was active, HMMA excluded (DCGM field 1008).",
        ),
        1.0,
    ),
    1009: (
        _declare(
            "gpu_dcgm_pcie_tx_bytes_per_second",
            _RATE,
            "bytes/s",
            "PCIe bytes sent by the GPU, headers included (DCGM field 1009, "
            "DCGM_FI_PROF_PCIE_TX_BYTES).",
        ),
        1.0,
    ),
    1010: (
        _declare(
            "gpu_dcgm_pcie_rx_bytes_per_second",
            _RATE,
            "bytes/s",
            "PCIe bytes received by the GPU, headers included (DCGM field 1010, "
            "DCGM_FI_PROF_PCIE_RX_BYTES).",
        ),
        1.0,
    ),
    1011: (
        _declare(
            "gpu_dcgm_nvlink_tx_bytes_per_second",
            _RATE,
            "bytes/s",
            "NVLink bytes sent on all links, headers included (DCGM field 1011, "
            "DCGM_FI_PROF_NVLINK_TX_BYTES).",
        ),
        1.0,
    ),
    1012: (
        _declare(
            "gpu_dcgm_nvlink_rx_bytes_per_second",
            _RATE,
            "bytes/s",
            "NVLink bytes received on all links, headers included (DCGM field 1012, "
            "DCGM_FI_PROF_NVLINK_RX_BYTES).",
        ),
        1.0,
    ),
    100: (
        _declare(
            "gpu_dcgm_sm_clock_hertz",
            _GAUGE,
            "hertz",
            "Current SM clock (DCGM field 100, DCGM_FI_DEV_SM_CLOCK, MHz x 1e6).",
        ),
        1e6,
    ),
    155: (
        _declare(
            "gpu_dcgm_power_watts",
            _GAUGE,
            "watts",
            "Board power draw (DCGM field 155, DCGM_FI_DEV_POWER_USAGE).",
        ),
        1.0,
    ),
}
PROFILING_PAUSED = _declare(
    "gpu_dcgm_profiling_paused",
    _GAUGE,
    "boolean",
    "1 while DCGM profiling is paused by dcgm-pause (the profiling fields are then absent).",
)
