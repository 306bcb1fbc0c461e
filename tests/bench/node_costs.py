"""What one round of each collector costs on this node, and each NVML call on its GPUs.

Used by ``bench_agent_idle.py --gpu-node`` (after the whole agent was measured): the real
collectors, started in this process one at a time, each timed over a number of rounds (CPU
time of this thread, µs per round, median), and every NVML call a GPU round makes, timed one
by one on each GPU against the real driver (µs per call, median): the per-CPU and per-GPU
costs of the cost model (docs/performance.md, "The idle agent's cost model"), measured where
they are real.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from bpfdyno.sources.base import Collector, CollectorUnavailable


def _median_us(fn: Callable[[], object], rounds: int, pause_s: float = 0.0) -> float:
    times = []
    for _ in range(rounds):
        if pause_s:
            time.sleep(pause_s)
        t0 = time.thread_time_ns()
        fn()
        times.append((time.thread_time_ns() - t0) / 1e3)
    return statistics.median(times)


def collector_round_us(rounds: int = 20) -> dict[str, float | str]:
    """µs of CPU per round of each collector that starts here (or why it does not)."""
    from bpfdyno.sources.gpu.collector import GpuCollector
    from bpfdyno.sources.host.collector import HostCollector
    from bpfdyno.sources.net.collector import NetCollector
    from bpfdyno.sources.perf.collector import PerfSwCollector
    from bpfdyno.sources.procs.table import ProcessTable
    from bpfdyno.sources.sched.collector import SchedCollector

    makers: dict[str, Callable[[], Collector]] = {
        "host (every CPU every round)": HostCollector,
        "sched (thread walk every round)": SchedCollector,
        "net": NetCollector,
        "perf_sw (every CPU every round)": PerfSwCollector,
        "gpu (processes every round)": GpuCollector,
        "gpu (processes on exec/exit)": partial(GpuCollector, process_churn=lambda: 0),
    }
    out: dict[str, float | str] = {}
    for name, make in makers.items():
        c = make()
        try:
            c.start()
        except CollectorUnavailable as e:
            out[name] = f"unavailable: {e}"
            continue
        try:
            c.collect()
            out[name] = round(_median_us(c.collect, rounds, pause_s=0.2), 1)
        finally:
            c.close()
    table = ProcessTable()
    table.update()
    out["process table refresh"] = round(_median_us(table.update, rounds, pause_s=0.2), 1)
    return out


def nvml_call_us(reps: int = 20) -> dict[str, float | str]:
    """µs per call of each NVML function a GPU round uses, on every GPU (median of wall
    time and of this thread's CPU time: a call may wait in the driver)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        return {"nvml": f"unavailable: {e}"}
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        fields = [
            (pynvml.NVML_FI_DEV_POWER_AVERAGE, 0),
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
            (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
            (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
        ]
        calls: dict[str, Callable[[Any], object]] = {
            "nvmlDeviceGetUtilizationRates": pynvml.nvmlDeviceGetUtilizationRates,
            "nvmlDeviceGetMemoryInfo_v2": partial(
                _memory_v2, pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlMemory_v2
            ),
            "nvmlDeviceGetFieldValues (5 fields)": lambda h: pynvml.nvmlDeviceGetFieldValues(
                h, fields
            ),
            "nvmlDeviceGetPowerUsage": pynvml.nvmlDeviceGetPowerUsage,
            "nvmlDeviceGetTemperatureV": lambda h: pynvml.nvmlDeviceGetTemperatureV(
                h, pynvml.NVML_TEMPERATURE_GPU
            ),
            "nvmlDeviceGetClockInfo (sm)": lambda h: pynvml.nvmlDeviceGetClockInfo(
                h, pynvml.NVML_CLOCK_SM
            ),
            "nvmlDeviceGetPcieThroughput (tx)": lambda h: pynvml.nvmlDeviceGetPcieThroughput(
                h, pynvml.NVML_PCIE_UTIL_TX_BYTES
            ),
            "nvmlDeviceGetCurrentClocksEventReasons": (
                pynvml.nvmlDeviceGetCurrentClocksEventReasons
            ),
            "nvmlDeviceGetEnforcedPowerLimit": pynvml.nvmlDeviceGetEnforcedPowerLimit,
            "nvmlDeviceGetTotalEccErrors": lambda h: pynvml.nvmlDeviceGetTotalEccErrors(
                h, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
            ),
            "nvmlDeviceGetMigMode": pynvml.nvmlDeviceGetMigMode,
            "nvmlDeviceGetComputeRunningProcesses_v3": (
                pynvml.nvmlDeviceGetComputeRunningProcesses_v3
            ),
            "nvmlDeviceGetProcessUtilization": lambda h: pynvml.nvmlDeviceGetProcessUtilization(
                h, 0
            ),
            "nvmlGpmSampleGet": _gpm_sample_get,
        }
        out: dict[str, float | str] = {"gpus": count}
        for name, call in calls.items():
            per_gpu = []
            for h in handles:
                try:
                    call(h)
                except pynvml.NVMLError as e:
                    per_gpu.append(f"{e}")
                    continue
                wall, cpu = [], []
                for _ in range(reps):
                    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
                    call(h)
                    cpu.append((time.thread_time_ns() - c0) / 1e3)
                    wall.append((time.perf_counter_ns() - t0) / 1e3)
                per_gpu.append(
                    f"{statistics.median(wall):.0f} wall / {statistics.median(cpu):.0f} cpu"
                )
            out[name] = per_gpu[0] if len(set(map(str, per_gpu))) == 1 else str(per_gpu)
        return out
    finally:
        pynvml.nvmlShutdown()


def _memory_v2(get: Callable[..., object], version: int, h: Any) -> object:
    return get(h, version=version)


_gpm_samples: dict[int, Any] = {}


def _gpm_sample_get(h: Any) -> object:
    import pynvml

    sample = _gpm_samples.get(id(h))
    if sample is None:
        sample = _gpm_samples[id(h)] = pynvml.nvmlGpmSampleAlloc()
    return pynvml.nvmlGpmSampleGet(h, sample)
