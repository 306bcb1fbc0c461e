"""Every reader of trace files on the real CUDA traces of a GPU node (fixtures/h200), and on a
500 MB CUDA-shaped trace built from them: the profiler's span mid-file, GPU activities after
it, bpfdyno's events at the end."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from h200_fixtures import DURATION, ITERATIONS, SPAN, cuda_shaped, kineto_body, merged

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.tracing.merge import Insertion, TraceLayout, merge_into_trace

EVENT = b'{"ph":"i","s":"t","cat":"bpfdyno.net","name":"x","pid":1,"tid":2,"ts":5.000}'


def span_ns(doc: dict[str, Any]) -> tuple[int, int]:
    [span] = [e for e in doc["traceEvents"] if e.get("cat") == "Trace"]
    start = round(span["ts"] * 1000)
    return start, start + round(span["dur"] * 1000)


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("trace", [ITERATIONS, DURATION], ids=["iterations", "duration"])
def test_the_merge_finds_the_window_of_a_real_cuda_trace(
    trace: Path, gz: bool, tmp_path: Path
) -> None:
    """Kineto's own CUDA file (without bpfdyno's events): the span is found wherever it is
    (byte 10.9 M of 23.2 M in the 1.5 s trace), so the merge uses Kineto's window."""
    body = kineto_body(trace)
    path = tmp_path / "t.pt.trace.json"
    path.write_bytes(gzip.compress(body, 1) if gz else body)
    seen: list[TraceLayout] = []

    def build(layout: TraceLayout) -> Insertion:
        seen.append(layout)
        return Insertion([EVENT])

    merge_into_trace(str(path), build)
    doc = json.loads(body)
    assert seen[0].window_ns == span_ns(doc)
    after = json.loads(gzip.decompress(path.read_bytes()) if gz else path.read_bytes())
    assert after["traceEvents"] == [*doc["traceEvents"], json.loads(EVENT)]


def reference(doc: dict[str, Any]) -> dict[str, Any]:
    """What the summary must say of ``doc``, computed the plain way: everything inside the
    window (the profiler's span), slices counted for their part inside it."""
    lo, hi = (t / 1000 for t in span_ns(doc))
    pid = next(e["pid"] for e in doc["traceEvents"] if e.get("cat") == "bpfdyno.info")
    out: dict[str, Any] = {"net_sent_bytes": 0, "net_received_bytes": 0, "net_calls": 0}
    offcpu = {"runnable": 0.0, "blocked": 0.0}
    ops: dict[int, list[tuple[float, float]]] = {}
    for e in doc["traceEvents"]:
        cat, ts, dur = e.get("cat"), e.get("ts"), e.get("dur", 0)
        if e.get("ph") != "X" or not isinstance(ts, float | int):
            continue
        if ts + dur < lo or ts > hi:
            continue
        if cat == "bpfdyno.net":
            key = "net_sent_bytes" if e["name"] == "send" else "net_received_bytes"
            out[key] += e["args"]["bytes"]
            out["net_calls"] += e["args"]["calls"]
        elif cat == "bpfdyno.sched":
            kind = "runnable" if e["args"]["cause"] == "runnable" else "blocked"
            offcpu[kind] += (min(ts + dur, hi) - max(ts, lo)) / 1e6
        elif cat == "cpu_op" and e["pid"] == pid:
            ops.setdefault(e["tid"], []).append((max(ts, lo), min(ts + dur, hi)))
    total = 0.0
    for intervals in ops.values():
        end = float("-inf")
        for s, t in sorted(intervals):
            total += max(0.0, t - max(s, end))
            end = max(end, t)
    out["offcpu_runnable_seconds"] = pytest.approx(offcpu["runnable"], rel=1e-9)
    out["offcpu_blocked_seconds"] = pytest.approx(offcpu["blocked"], rel=1e-9)
    out["pytorch_op_seconds"] = pytest.approx(total / 1e6, rel=1e-9)
    return out


@pytest.mark.parametrize("trace", [ITERATIONS, DURATION], ids=["iterations", "duration"])
def test_the_summary_of_a_real_cuda_trace_counts_inside_its_window(
    trace: Path, tmp_path: Path
) -> None:
    """The 1.5 s file carries 17.9 s of kernel events (merged by the version that missed its
    span): only the window's count."""
    path = tmp_path / trace.name
    path.write_bytes(trace.read_bytes())
    doc = json.loads(merged(trace))
    s = summarize_file(str(path))
    assert s.error == ""
    want = reference(doc)
    assert {k: getattr(s, k) for k in want} == want
    assert s.window_seconds == pytest.approx((span_ns(doc)[1] - span_ns(doc)[0]) / 1e9)
    assert s.kernel_tracks == ("net", "sched", "nccl", "gpu")
    if trace is DURATION:  # 3,390 bursts in the file, 284 in the window (2 per step)
        assert (s.net_calls, s.nccl_calls) == (284, 142)


def test_one_rank_of_a_real_cuda_trace_gets_its_step_split(tmp_path: Path) -> None:
    """A job of one rank: no straggler to name; each step's time split, as the kernel saw it."""
    s = summarize_file(str(DURATION))
    assert s.evidence is not None
    ev = s.evidence
    assert len(ev.collectives) == 142 and {c.op for c in ev.collectives} == {"allreduce"}
    assert ev.steps.steps == 142  # one Optimizer.step per step
    assert 0.009 < ev.steps.step_seconds < 0.012  # ~93 steps/s
    parts = {p.cause: p.seconds for p in ev.steps.parts}
    assert parts["gpu_busy"] == pytest.approx(ev.steps.step_seconds, rel=0.1)
    verdict = compare([ev])
    assert verdict.within_noise and verdict.stragglers == ()
    assert verdict.headline.startswith("one rank (pid 652): nothing to compare it with; a step")
    assert "GPU busy" in verdict.headline


@pytest.fixture(scope="module")
def big_cuda_trace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int]]:
    """A 500 MB CUDA-shaped trace (module doc), written in parts."""
    path = tmp_path_factory.mktemp("big") / "big.pt.trace.json"
    head, middle, end, repeat = cuda_shaped(500 << 20)
    with open(path, "wb") as f:
        for part in (head, middle, end):
            f.write(part)
    del head, middle, end
    yield path, repeat
    path.unlink()


@pytest.mark.slow
def test_a_500_mb_cuda_trace_is_merged_and_summarised(big_cuda_trace: tuple[Path, int]) -> None:
    path, repeat = big_cuda_trace
    size = path.stat().st_size
    assert size > 500_000_000 and repeat >= 16
    with open(path, "rb") as f:
        f.seek(size // 2 - 200_000_000)
        assert SPAN not in f.read(100_000_000)  # the span is not near the end
    real = summarize_file(str(DURATION))
    s = summarize_file(str(path))
    assert s.error == ""
    # The CPU and GPU parts are the real file's, ``repeat`` times, at the same times: the
    # same union of op time, the same window; bpfdyno's events once.
    assert s.pytorch_op_seconds == pytest.approx(real.pytorch_op_seconds, rel=1e-9)
    assert (s.window_seconds, s.net_calls, s.nccl_calls) == (
        real.window_seconds,
        real.net_calls,
        real.nccl_calls,
    )
    assert s.evidence is not None and real.evidence is not None
    seen: list[TraceLayout] = []

    def build(layout: TraceLayout) -> Insertion:
        seen.append(layout)
        return Insertion([EVENT])

    merge_into_trace(str(path), build)
    doc_span = span_ns(json.loads(kineto_body(DURATION)))
    assert seen[0].window_ns == doc_span
    assert path.stat().st_size == size + len(b",\n" + EVENT + b"\n")
