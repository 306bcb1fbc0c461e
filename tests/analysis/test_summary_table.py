"""The summary table says what its numbers are: sums over threads say over how many, the
GPUs' busy time has a row, and a GPU-bound process is called GPU-bound."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.readings import GPU_BOUND_SHARE
from bpfdyno.analysis.summary import summarize_file
from bpfdyno.cli.trace_summary import format_summary
from bpfdyno.rpc.traces import ProcessSummary

PID = 41


def kernel(name: str, ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts,
            "dur": dur, "args": {"device": 0, "stream": 7}}  # fmt: skip


def test_the_gpu_busy_time_is_the_union_of_its_kernels_in_the_window(tmp_path: Path) -> None:
    """Window 1000-2000 µs: a compute kernel 900-1300 (100 µs before the window), another
    1200-1400 overlapping it, an NCCL kernel 1600-1700: busy 1000-1400 and 1600-1700."""
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 1000.0, "dur": 1000.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": PID, "ts": 1000.0,
         "dur": 10.0, "args": {}},
        kernel("void gemm_kernel", 900.0, 400.0),
        kernel("void elementwise_kernel", 1200.0, 200.0),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 1600.0, 100.0),
        kernel("void late_kernel", 2100.0, 100.0),  # after the window
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": events}))
    s = summarize_file(str(path))
    assert s.error == ""
    assert s.gpu_busy_seconds == pytest.approx(500e-6)


def column(rank: int, threads: int, gpu_busy: float = 0.0) -> dict[str, Any]:
    s = ProcessSummary(
        path=f"/t/r{rank}.json",
        pid=100 + rank,
        rank=rank,
        window_seconds=1.5,
        offcpu_runnable_seconds=0.5,
        offcpu_blocked_seconds=16.5,
        blocked_seconds_by_cause={"lock": 16.5},
        offcpu_threads=threads,
        gpu_busy_seconds=gpu_busy,
    )
    out = dataclasses.asdict(s)
    out["kernel_tracks"] = list(out["kernel_tracks"])
    return out


def labels(text: str) -> list[str]:
    return [line.split("  ")[0] for line in text.splitlines()[1:]]


def test_rows_summed_over_threads_say_over_how_many() -> None:
    """16.5 s blocked in a 1.5 s window is each of 12 threads' own time, said so."""
    text = format_summary([column(0, 12), column(1, 12)])
    assert "off-CPU: blocked (sum over 12 threads)" in labels(text)
    assert "off-CPU: waiting for a CPU (sum over 12 threads)" in labels(text)
    threads = next(line for line in text.splitlines() if line.startswith("threads seen off-CPU"))
    assert threads.split()[-2:] == ["12", "12"]
    text = format_summary([column(0, 9), column(1, 12)])
    assert "off-CPU: blocked (sum over 9-12 threads)" in labels(text)


def test_the_header_names_rank_and_pid() -> None:
    header = format_summary([column(0, 1), column(1, 1)]).splitlines()[0]
    assert header.split("  ")[-1].strip() == "rank 1 / pid 101"
    assert "rank 0 / pid 100" in header


def test_a_gpu_row_and_gpu_bound_in_words() -> None:
    """Rank 0's GPUs busy 1.35 of 1.5 s (90 %): GPU-bound, said in its cell and in a sentence;
    rank 1's 0.6 s (40 %): not."""
    assert 0.4 < GPU_BOUND_SHARE <= 0.9
    text = format_summary([column(0, 4, 1.35), column(1, 4, 0.6)])
    [gpu] = [line for line in text.splitlines() if line.startswith("GPU busy")]
    cells = [c for c in gpu.split("  ") if c.strip()][1:]
    assert [c.strip() for c in cells] == [
        "1.350 s (90% of the window, GPU-bound)",
        "600.000 ms (40% of the window)",
    ]
    assert (
        "rank 0 / pid 100 is GPU-bound: its GPUs ran kernels 90% of the window (GPU-bound from "
        "80%): the GPU's work sets its pace, not its CPU, data or network"
    ) in text.splitlines()
    assert "rank 1 / pid 101 is GPU-bound" not in text


def test_no_gpu_row_without_gpu_activities() -> None:
    text = format_summary([column(0, 4), column(1, 4)])
    assert "GPU busy" not in labels(text) and "GPU-bound" not in text


def test_a_real_h200_trace_reads_gpu_bound() -> None:
    """The GPU node's 1.5 s trace (a matmul loop): its GPU ran kernels 1.425 s, 95 % of the
    window, and 12 threads' off-CPU time adds up to 16.5 s."""
    path = (
        Path(__file__).parent.parent / "tracing/fixtures/h200/cuda_duration_merged.pt.trace.json.gz"
    )
    s = summarize_file(str(path))
    assert s.gpu_busy_seconds == pytest.approx(1.42497, abs=1e-5)
    assert s.offcpu_threads == 12
    row = dataclasses.asdict(dataclasses.replace(s, evidence=None))
    text = format_summary([row])
    assert "off-CPU: blocked (sum over 12 threads)" in labels(text)
    assert any(line.startswith("no rank / pid 652 is GPU-bound") for line in text.splitlines())
