"""``bpfdyno timeline``: ranks side by side on the wall clock their files carry, slices where
their events are, and a clear refusal of a file that is not a trace."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from bpfdyno.cli.timeline import COLOURS, LABEL_W, LANE_H, TITLE_H, TOP, WIDTH

H200 = Path(__file__).resolve().parents[1] / "tracing/fixtures/h200"
SVG = "{http://www.w3.org/2000/svg}"
BASE_NS = 1_800_000_000_000_000_000


def _trace(base_ns: int, pid: int, events: list[dict[str, Any]], rank: int) -> dict[str, Any]:
    return {
        "baseTimeNanoseconds": base_ns,
        "distributedInfo": {"rank": rank},
        "traceEvents": [
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
             "tid": "PyTorch Profiler", "ts": 0.0, "dur": 1000.0},
            {"ph": "X", "cat": "bpfdyno.info", "name": "bpfdyno kernel tracks", "pid": pid,
             "tid": 1_000_000_009, "ts": 0.0, "dur": 1000.0, "args": {}},
            *events,
        ],
    }  # fmt: skip


def _rects(svg: Path) -> list[tuple[float, float, float, str]]:
    """(x, y, width, fill) of every slice (not the legend, not the lanes' grey ground)."""
    root = ET.parse(svg).getroot()
    out = []
    for r in root.iter(f"{SVG}rect"):
        fill, y = r.get("fill", ""), float(r.get("y", 0))
        if y >= TOP and fill not in ("#f3f3f3", "#ffffff"):
            out.append((float(r.get("x", 0)), y, float(r.get("width", 0)), fill))
    return sorted(out)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bpfdyno", "timeline", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_two_ranks_on_one_clock_with_their_slices_where_they_are(tmp_path: Path) -> None:
    r0 = _trace(BASE_NS, 100, [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100,
         "ts": 100.0, "dur": 200.0},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 100,
         "tid": 100, "ts": 300.0, "dur": 600.0},
        # Another thread's op: not the main thread's, not drawn.
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 100, "tid": 101,
         "ts": 100.0, "dur": 50.0},
    ], rank=0)  # fmt: skip
    # Rank 1's file starts 500 us later on the wall clock; its main thread waits for a CPU.
    r1 = _trace(BASE_NS + 500_000, 200, [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 200, "tid": 200,
         "ts": 100.0, "dur": 600.0},
        {"ph": "X", "cat": "bpfdyno.sched", "name": "runnable: preempted", "pid": 200,
         "tid": 1_000_000_003, "ts": 150.0, "dur": 250.0,
         "args": {"tid": 200, "cause": "runnable"}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7,
         "ts": 800.0, "dur": 100.0},
    ], rank=1)  # fmt: skip
    (tmp_path / "r0.json").write_text(json.dumps(r0))
    (tmp_path / "r1.json.gz").write_bytes(gzip.compress(json.dumps(r1).encode()))
    out = tmp_path / "job.svg"
    # Given rank 1 first: drawn in rank order.
    r = _run(str(tmp_path / "r1.json.gz"), str(tmp_path / "r0.json"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{out}: 2 rank(s), 5 slices\n"
    scale = (WIDTH - LABEL_W - 10) / 1500.0  # from rank 0's start to rank 1's end
    band = TITLE_H + 4 * LANE_H + 8
    lane = {name: i for i, name in enumerate(("ops", "comm", "gpu", "off"))}

    def at(rank: int, lane_name: str) -> float:
        return TOP + rank * band + TITLE_H + lane[lane_name] * LANE_H + 1

    expected = [
        (LABEL_W + 100 * scale, at(0, "ops"), 200 * scale, COLOURS["ops"]),
        (LABEL_W + 300 * scale, at(0, "comm"), 600 * scale, COLOURS["comm"]),
        (LABEL_W + 600 * scale, at(1, "ops"), 600 * scale, COLOURS["ops"]),
        (LABEL_W + 650 * scale, at(1, "off"), 250 * scale, COLOURS["runnable"]),
        (LABEL_W + 1300 * scale, at(1, "gpu"), 100 * scale, COLOURS["gpu"]),
    ]
    got = _rects(out)
    assert [(round(x, 2), y, round(w, 2), f) for x, y, w, f in got] == sorted(
        (round(x, 2), y, round(w, 2), f) for x, y, w, f in expected
    )
    text = out.read_text()
    assert "rank 0 (pid 100)" in text and "rank 1 (pid 200)" in text


def test_a_real_h200_trace(tmp_path: Path) -> None:
    out = tmp_path / "h200.svg"
    r = _run(str(H200 / "cuda_iterations_merged.pt.trace.json.gz"), "-o", str(out))
    assert r.returncode == 0, r.stderr
    rects = _rects(out)
    fills = {f for _, _, _, f in rects}
    # Its PyTorch ops, NCCL all-reduces, GPU kernels and the main thread's futex waits.
    assert {COLOURS["ops"], COLOURS["comm"], COLOURS["gpu"], COLOURS["lock"]} <= fills
    assert "(pid 652)" in out.read_text()


def test_a_file_that_is_not_a_trace_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"hello": 1}')
    r = _run(str(bad), "-o", str(tmp_path / "x.svg"))
    assert r.returncode == 2
    assert r.stderr == f"bpfdyno timeline: {bad} is not a trace: it has no traceEvents list\n"
    assert not (tmp_path / "x.svg").exists()
