"""The GPU track of a real PyTorch trace, from the GPU collector's NVML reads (the C library
implementing the NVML ABI stands in for the driver: there is no GPU here)."""

from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

# The fake NVML library and its fixtures live with the GPU collector's tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "gpu"))
from gpu_fake_nvml import FakeNvml
from kernel_tracks_helpers import events, info, of_cat, window_us
from tracing_harness import Harness

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.sources.gpu.collector import GpuCollector
from bpfdyno.tracing.traces import KernelTrackState

pytest_plugins = ("gpu_fake_nvml",)  # the fake_libs / fake fixtures
pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

HZ = 20.0


async def test_the_traced_process_gpu_counters_at_the_trace_rate(
    short_tmp: Path, fake: FakeNvml
) -> None:
    gpu = GpuCollector(str(fake.library), retry_min_s=0.0)
    gpu.start()
    stop = threading.Event()

    def rounds() -> None:  # the daemon's collection rounds (per-process GPU use, GPM state)
        while not stop.wait(0.3):
            gpu.collect()

    collecting = threading.Thread(target=rounds, daemon=True)
    collecting.start()
    h = Harness(
        short_tmp, capture=True, gpu=gpu, capture_settings=[("capture.gpu_sample_hz", str(HZ))]
    )
    gpu.set_traced_pids_provider(h.service.tracing_pids)
    await h.start()
    try:
        trainer = h.spawn_script("linear.py", "--step-sleep=0.1")
        [pid] = await trainer.wait_ready()
        fake.set({"gpu.0.procs": f"{pid}:1073741824"})  # its context is on GPU 0 only
        async with asyncio.timeout(30):
            while gpu.trace_gpus(pid) != (0,):
                await asyncio.sleep(0.1)
        await h.wait_trainers(lambda ts: [t.pid for t in ts] == [pid])
        res = h.service.start_trace(
            TraceRequest(
                options=TraceSpec(log_file=str(h.trace_dir / "g.json"), iterations=5),
                kernel_tracks=("gpu",),
            )
        )
        view = await h.wait_done(res.trace_id, timeout=90)
    finally:
        h.close()
        await h.comp.stop()
        stop.set()
        collecting.join()
        gpu.close()
    [p] = view.processes
    assert p.kernel_tracks.state is KernelTrackState.MERGED, p.kernel_tracks
    assert p.kernel_tracks.merged == ("gpu",)
    evs = events(p.output_path)
    counters = of_cat(evs, "bpfdyno.gpu", "C")
    assert all(c["pid"] == pid for c in counters)
    values: dict[str, set[float]] = {}
    for c in counters:
        values.setdefault(c["name"], set()).add(c["args"]["value"])
    # The fake's values (util 57 %, 40 GiB used, 312500 mW, 1980 MHz), units converted.
    assert values["GPU 0 utilization (%)"] == {57.0}
    assert values["GPU 0 memory used (MiB)"] == {40960.0}
    assert values["GPU 0 power (W)"] == {312.5}
    assert values["GPU 0 SM clock (MHz)"] == {1980.0}
    assert not [name for name in values if name.startswith("GPU 1 ")]  # not its GPU
    # GPM: the collector's own values when it ran, paused while the trace used the GPU.
    assert values.get("GPU 0 SM active (%)", {45.5}) == {45.5}  # the fake's GPM metric 2
    assert values["GPU 0 GPM paused (1 = for a trace or dcgm-pause)"] <= {0.0, 1.0}
    lo, hi = window_us(evs)
    samples = [c["ts"] for c in counters if c["name"] == "GPU 0 utilization (%)"]
    inside = [ts for ts in samples if lo <= ts <= hi]
    assert len(samples) <= len(inside) + 2  # plus one before and one after the window
    expected = (hi - lo) / 1e6 * HZ
    assert len(inside) >= max(2, int(expected * 0.4)), (len(inside), expected)
    assert info(evs)["events"] == {"gpu": len(counters)}
