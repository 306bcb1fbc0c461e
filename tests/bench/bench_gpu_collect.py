"""What the GPU collector costs per collection, against the bare NVML calls it makes.

Run as a script: ``python tests/bench/bench_gpu_collect.py [--gpus 8] [--rounds 10]
[--collects 50]``. No GPU is needed: the fake NVML library of the tests is compiled and loaded
through the real pynvml, set up as ``--gpus`` H100s with GPM, running processes and every
field supported. Rounds alternate between "bare" (the same pynvml calls in a plain loop: the
cost of NVML through ctypes, which the collector cannot avoid) and "collector"
(``GpuCollector.collect()``: the calls plus error handling, unit conversion, samples, GPM
bookkeeping and the process join). Each round times ``--collects`` back-to-back rounds on this
thread's CPU clock. Printed: the median CPU microseconds per round of each kind, the ratio
collector/bare, and the share of one core one collection per second costs.

The fake answers each call in a few microseconds; a real driver takes longer per call
(ioctls into the kernel module), so on a GPU host the bare part grows and the ratio shrinks.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sources" / "gpu"))

import pynvml
from gpu_fake_nvml import DEFAULT_VALUES, build_fake_nvml

from bpfdyno.sources.gpu.collector import GpuCollector


def control_values(gpus: int) -> dict[str, str]:
    """``gpus`` copies of the fake's gpu 0 (an H100 with GPM and two processes)."""
    values = {k: v for k, v in DEFAULT_VALUES.items() if not k.startswith("gpu.")}
    values["device_count"] = str(gpus)
    for i in range(gpus):
        for key, value in DEFAULT_VALUES.items():
            if key.startswith("gpu.0."):
                values[f"gpu.{i}." + key[len("gpu.0.") :]] = value
        values[f"gpu.{i}.uuid"] = f"GPU-00000000-0000-0000-0000-{i:012d}"
    return values


def bare_round(handles: list[Any], samples: list[list[Any]]) -> None:
    """The NVML calls of one collector round, without the collector."""
    nvlink = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)]
    nvlink.append((pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF))
    for h, (s1, s2) in zip(handles, samples, strict=True):
        pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        pynvml.nvmlDeviceGetPowerUsage(h)
        pynvml.nvmlDeviceGetEnforcedPowerLimit(h)
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
        pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_TX_BYTES)
        pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
        pynvml.nvmlDeviceGetFieldValues(h, nvlink)
        for etype in (0, 1):
            pynvml.nvmlDeviceGetTotalEccErrors(h, etype, pynvml.NVML_VOLATILE_ECC)
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
        pynvml.nvmlDeviceGetMigMode(h)
        pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h)
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlDeviceGetProcessUtilization(h, 0)
        pynvml.nvmlGpmSampleGet(h, s2)
        req = pynvml.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics, req.sample1, req.sample2 = 1, 12, s1, s2
        pynvml.nvmlGpmMetricsGet(req)


def cpu_us(body: Any, collects: int) -> float:
    start = time.thread_time()
    for _ in range(collects):
        body()
    return (time.thread_time() - start) / collects * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs the fake NVML lists")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each kind")
    parser.add_argument("--collects", type=int, default=50, help="collections timed per round")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        lib = build_fake_nvml(Path(tmp) / "lib")
        ctl = Path(tmp) / "nvml.ctl"
        ctl.write_text("".join(f"{k}={v}\n" for k, v in control_values(args.gpus).items()))
        os.environ["FAKE_NVML_CONTROL"] = str(ctl)
        ctypes.CDLL(str(lib), mode=os.RTLD_NOW | os.RTLD_GLOBAL)

        collector = GpuCollector(str(lib), events_enabled=False)
        collector.start()
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(args.gpus)]
        samples = [[pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()] for _ in handles]
        for h, (s1, _) in zip(handles, samples, strict=True):
            pynvml.nvmlGpmSampleGet(h, s1)
        collector.collect()  # warm-up, and the GPM baseline
        bare_round(handles, samples)

        bare: list[float] = []
        full: list[float] = []
        for _ in range(args.rounds):  # interleaved, so drift hits both kinds alike
            bare.append(cpu_us(lambda: bare_round(handles, samples), args.collects))
            full.append(cpu_us(collector.collect, args.collects))
        collector.close()
        pynvml.nvmlShutdown()

    b, f = statistics.median(bare), statistics.median(full)
    print(f"GPUs: {args.gpus}, rounds: {args.rounds} x {args.collects} collections")
    print(f"bare NVML calls : {b:9.0f} us CPU per round (median)")
    print(f"GpuCollector    : {f:9.0f} us CPU per round (median)")
    print(f"ratio collector/bare: {f / b:.2f}")
    print(f"one collection per second: {f / 1e4:.2f} % of one core")


if __name__ == "__main__":
    main()
