"""DCGM as an alternative source of the profiling fields: the ``dcgm`` collector.

dynolog reads its GPU profiling fields (SM active, SM occupancy, tensor active, DRAM active,
PCIe/NVLink bytes) from DCGM. bpfdyno reads the same fields from NVML GPM in the ``gpu``
collector, so DCGM is not needed on Hopper-class GPUs. This collector only detects libdcgm:

* no libdcgm -> unavailable, with the package to install;
* libdcgm present -> unavailable too, saying that this version reads those fields through
  NVML GPM (reading them through DCGM's host engine is not implemented yet).

`DYNOLOG_DCGM_FIELDS` maps dynolog's DCGM field ids to the metric each would feed, for a future
DCGM reader and for users comparing the two agents.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Sequence

from bpfdyno.collectors.base import Collector, CollectorUnavailable
from bpfdyno.metrics import Sample

#: Sonames tried in order (DCGM 4, DCGM 3), then the linker's search.
DCGM_SONAMES = ("libdcgm.so.4", "libdcgm.so.3")

#: dynolog's DCGM profiling fields (DCGM_FI_PROF_*) and the metric each corresponds to.
DYNOLOG_DCGM_FIELDS: dict[int, str] = {
    1001: "gpu_gr_engine_active_ratio",  # DCGM_FI_PROF_GR_ENGINE_ACTIVE
    1002: "gpu_sm_active_ratio",  # DCGM_FI_PROF_SM_ACTIVE
    1003: "gpu_sm_occupancy_ratio",  # DCGM_FI_PROF_SM_OCCUPANCY
    1004: "gpu_tensor_active_ratio",  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE
    1005: "gpu_dram_bw_util_ratio",  # DCGM_FI_PROF_DRAM_ACTIVE
    1006: "gpu_fp64_active_ratio",  # DCGM_FI_PROF_PIPE_FP64_ACTIVE
    1007: "gpu_fp32_active_ratio",  # DCGM_FI_PROF_PIPE_FP32_ACTIVE
    1008: "gpu_fp16_active_ratio",  # DCGM_FI_PROF_PIPE_FP16_ACTIVE
    1009: "gpu_prof_pcie_tx_bytes_per_second",  # DCGM_FI_PROF_PCIE_TX_BYTES
    1010: "gpu_prof_pcie_rx_bytes_per_second",  # DCGM_FI_PROF_PCIE_RX_BYTES
    1011: "gpu_prof_nvlink_tx_bytes_per_second",  # DCGM_FI_PROF_NVLINK_TX_BYTES
    1012: "gpu_prof_nvlink_rx_bytes_per_second",  # DCGM_FI_PROF_NVLINK_RX_BYTES
}


def find_libdcgm(
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    sonames: Sequence[str] = DCGM_SONAMES,
) -> str | None:
    """The soname or path of a libdcgm that loads, or None."""
    candidates = [*sonames, find_library("dcgm")]
    for name in candidates:
        if name is None:
            continue
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


class DcgmCollector(Collector):
    """Detects DCGM; the profiling fields themselves come from the ``gpu`` collector's GPM."""

    name = "dcgm"

    def __init__(self, find: Callable[[], str | None] = find_libdcgm) -> None:
        self._find = find

    def start(self) -> None:
        """Always unavailable in this version; the reason says why and what to use.

        Raises:
            CollectorUnavailable: libdcgm is missing, or present but not used.
        """
        library = self._find()
        if library is None:
            raise CollectorUnavailable(
                "libdcgm not found — install datacenter-gpu-manager to use DCGM fields"
            )
        raise CollectorUnavailable(
            f"{library} is installed, but this version reads the DCGM profiling fields through "
            "NVML GPM — use the gpu collector (Hopper-class GPUs); disable this collector "
            "([collectors.dcgm] enabled = false) to silence this line"
        )

    def collect(self) -> Sequence[Sample]:
        """Never called: `start` always reports the collector unavailable."""
        return ()
