"""What a merged CUDA trace of the suite's trainer must hold, checked on the file itself.

Used by the suite on the traces it takes, and by ``test_trace_checks.py`` (in CI) on the
traces of the first manual run on an H200 node, so the checks are known to pass on a good
real file and to catch the bugs that run found.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_suite import Checks

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare

#: The kernel tracks `--kernel-tracks all` merges.
ALL_TRACKS = ["net", "sched", "nccl", "gpu", "fabric"]
#: ... in the manual H200 run's files (tests/tracing/fixtures/h200), older than the fabric one.
H200_RUN_TRACKS = ["net", "sched", "nccl", "gpu"]
#: The fabric track's note when the traced process uses no RDMA port and no network interface
#: (the suite's trainer talks over loopback; a node without them): information, not a loss.
NO_FABRIC_NOTE = "no RDMA port or network interface to read"
#: One NCCL call's arguments as the NCCL track writes them: count, datatype, bytes, op, result.
NcclArgs = tuple[int, str, int, str, str]


class NoProfilerSpan(AssertionError):
    """A trace file without Kineto's ``PyTorch Profiler`` span: Kineto recorded nothing."""


@dataclass
class Trace:
    """A merged trace file: its events and the profiler's span (µs, as in the file)."""

    path: Path
    events: list[dict[str, Any]]
    window: tuple[float, float]

    @classmethod
    def load(cls, path: Path) -> Trace:
        data = path.read_bytes()
        events: list[dict[str, Any]] = json.loads(
            gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        )["traceEvents"]
        spans = [e for e in events if e.get("cat") == "Trace" and e.get("ph") == "X"]
        if len(spans) != 1:
            raise NoProfilerSpan(
                f"{path} has {len(spans)} profiler spans (in {len(events)} events): Kineto "
                "recorded nothing (see the trainer's log)"
            )
        span = spans[0]
        return cls(path, events, (span["ts"], span["ts"] + span["dur"]))

    def of(self, cat: str, ph: str = "X") -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("cat") == cat and e.get("ph") == ph]

    def inside(self, e: dict[str, Any]) -> bool:
        """Whether an event overlaps the window."""
        lo, hi = self.window
        return bool(e["ts"] <= hi and e["ts"] + e.get("dur", 0) >= lo)


def check_file(
    t: Trace, pid: int, gpu: str, checks: Checks, tracks: list[str] = ALL_TRACKS
) -> None:
    """Every kernel track merged (``tracks``), in Kineto's window, with GPU kernels and the
    GPU counters of GPU ``gpu`` (its NVML index), net and sched slices all in the window; no
    note or loss but the fabric track's when the process uses no network interface."""
    [info] = t.of("bpfdyno.info")
    lo, hi = t.window
    checks.equal("window", info["args"]["window"], "kineto")
    span = (info["ts"], info["ts"] + info["dur"])
    checks.equal("info slice over the profiler's span", span, (lo, hi))
    checks.equal("tracks in the file", info["args"]["tracks"], tracks)
    expected = {"fabric_note": NO_FABRIC_NOTE} if "fabric" in tracks else {}
    notes = {
        k: v
        for k, v in info["args"].items()
        if k.endswith(("_note", "_ring_buffer_full", "_dropped")) and expected.get(k) != v
    }
    checks.record("no track notes or losses", not any(notes.values()), json.dumps(notes))
    kernels = [e for e in t.of("kernel") if t.inside(e)]
    checks.record("GPU kernels in the window", len(kernels) > 0, f"{len(kernels)}")
    samples = [e for e in t.of("bpfdyno.gpu", "C") if e["name"] == f"GPU {gpu} utilization (%)"]
    inside = [e for e in samples if lo <= e["ts"] <= hi]
    least = int((hi - lo) / 1e6 * 10 * 0.5)  # at 10 a second, at least half of them
    checks.record(
        f"GPU {gpu} counter samples (10/s)",
        len(samples) >= 2 and len(inside) >= least and {e["pid"] for e in samples} == {pid},
        f"{len(inside)} in the window (at least {least}), {len(samples)} in all",
    )
    for cat in ("bpfdyno.net", "bpfdyno.sched"):
        slices = t.of(cat)
        outside = [e for e in slices if not t.inside(e)]
        checks.record(
            f"{cat} slices, all in the window",
            bool(slices) and not outside,
            f"{len(slices)}, {len(outside)} outside",
        )


def optimizer_steps(t: Trace) -> int:
    """The optimizer steps recorded whole inside the window (Kineto counts its iterations
    by them)."""
    lo, hi = t.window
    return sum(
        1
        for e in t.of("user_annotation")
        if e["name"].startswith("Optimizer.step#") and lo <= e["ts"] and e["ts"] + e["dur"] <= hi
    )


def step_range(t: Trace) -> range:
    """How many times a call made once per step may be in the window: Kineto starts and stops
    at optimizer steps, and one more step's calls may fall inside (its stop can come a step
    late), or one fewer (a duration trace cuts steps)."""
    n = optimizer_steps(t)
    return range(max(n - 1, 0), n + 2)


def check_connection(t: Trace, client: str, server: str, step_bytes: int, checks: Checks) -> None:
    """One send of exactly ``step_bytes`` from ``client`` to ``server`` per step, all read
    back on the other end."""

    def on(name: str, local: str, peer: str) -> list[dict[str, Any]]:
        return [
            e
            for e in t.of("bpfdyno.net")
            if e["name"] == name and (e["args"]["local"], e["args"]["peer"]) == (local, peer)
        ]

    sends = [e for e in on("send", client, server) if t.inside(e)]
    sizes = sorted({e["args"]["bytes"] for e in sends})
    checks.equal(f"bytes of each send {client} -> {server}", sizes, [step_bytes])
    steps = step_range(t)
    checks.record("sends, one per step", len(sends) in steps, f"{len(sends)} ({_say(steps)})")
    received = sum(e["args"]["bytes"] for e in on("recv", server, client) if t.inside(e))
    checks.equal(f"bytes received on {server}", received, len(sends) * step_bytes)


def check_allreduces(t: Trace, pid: int, expected: set[NcclArgs], checks: Checks) -> None:
    """The ncclAllReduce calls in the window: each with one of the ``expected`` argument
    sets, from the main thread, each set once per step."""
    calls = [e for e in t.of("bpfdyno.nccl") if e["name"] == "ncclAllReduce" and t.inside(e)]
    seen = collections.Counter(
        (a["count"], a["datatype"], a["bytes"], a["op"], a["result"])
        for a in (e["args"] for e in calls)
    )
    checks.equal("ncclAllReduce arguments", set(seen), expected)
    checks.equal("calling thread", {e["args"]["tid"] for e in calls}, {pid})
    steps = step_range(t)
    checks.record(
        "calls of each, one per step",
        all(n in steps for n in seen.values()),
        f"{sorted(seen.values())} ({_say(steps)})",
    )


def _say(steps: range) -> str:
    return f"{steps.start} to {steps.stop - 1} for {steps.start + 1} optimizer steps"


def check_verdict(t: Trace, pid: int, checks: Checks) -> str:
    """One rank: no straggler; a step's time split, with a GPU-busy part. Returns the
    verdict's headline ("" when the file has no evidence)."""
    summary = summarize_file(str(t.path))
    checks.equal("summary error", summary.error, "")
    if summary.evidence is None:
        return ""
    steps = summary.evidence.steps
    parts = {p.cause: p.seconds for p in steps.parts}
    checks.between("steps found", steps.steps, 5, 1e9)
    checks.between("GPU busy in a step (s)", parts.get("gpu_busy"), 1e-6, steps.step_seconds * 1.1)
    verdict = compare([summary.evidence])
    one_rank = rf"one rank \(pid {pid}( on \S+)?\): nothing to compare it with; a step takes "
    checks.record(
        "verdict",
        re.match(one_rank, verdict.headline) is not None and "GPU busy" in verdict.headline,
        verdict.headline,
    )
    checks.equal("stragglers", (verdict.within_noise, verdict.stragglers), (True, ()))
    return verdict.headline
