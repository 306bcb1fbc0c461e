"""What analysing a big trace costs: bpfdyno's summary and evidence against Holistic Trace
Analysis loading the same file, time and peak memory, in interleaved rounds.

Run: ``python tests/bench/bench_trace_analysis.py [--size-mb 500] [--rounds 3] [--dir /tmp]
[--no-hta] [--baseline DIR]``.

1. A CUDA-shaped trace of ``--size-mb`` MB is written once from the real trace of a GPU node
   (tests/tracing/fixtures/h200): Kineto's CPU ops repeated, the profiler's span, the GPU
   activities repeated, bpfdyno's kernel tracks at the end — the span mid-file, as Kineto
   writes CUDA traces (`h200_fixtures.cuda_shaped`).
2. Each round, in a fresh child process each: bpfdyno's `summarize_file` (one pass: the
   numbers, the rank's evidence for the verdict) and the verdict of that one rank; then HTA's
   ``TraceAnalysis(trace_dir=...)`` with ``get_trace(0)`` (what loading a rank for its
   straggler analysis costs). Wall time of the work and the child's peak RSS (``VmHWM``),
   the file in the page cache for both.

With ``--baseline DIR`` (the ``agent`` directory of another checkout of bpfdyno, e.g. a
``git worktree`` of main), each round also runs that code's summary on the same file, in the
same way, the two in alternating order: the times of both, and the ratio new/old per round
(its median is what a loaded machine leaves comparable), and whether the two codes' summaries
are the same (not when the baseline predates evidence this code adds); the load average
before and after.

Reported: median, min and max per tool, and the targets (≤ 5 s and ≤ 200 MB for 500 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tracing"))
from h200_fixtures import cuda_shaped

BPFDYNO = r"""
import json, sys, time
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
from bpfdyno.analysis.verdict import compare
from bpfdyno.analysis import summary
from bpfdyno.analysis.summary import summarize_file
t0, c0 = time.perf_counter(), time.process_time()
s = summarize_file(sys.argv[1])
verdict = compare([s.evidence])
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "peak_rss": peak(), "error": s.error, "source": summary.__file__,
                  "collectives": len(s.evidence.collectives), "headline": verdict.headline,
                  "summary": repr(s)}))
"""

HTA = r"""
import json, sys, time
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
events = len(TraceAnalysis(trace_dir=sys.argv[1]).t.get_trace(0))
print(json.dumps({"seconds": time.perf_counter() - t0, "peak_rss": peak(), "events": events}))
"""


def child(code: str, arg: str, source: str = "") -> dict[str, object]:
    """Run ``code`` in a fresh interpreter; ``source``: an ``agent`` directory imported first."""
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise SystemExit(f"child failed: {r.stderr[-3000:]}")
    out: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def stats(values: list[float], fmt: str) -> str:
    return (
        f"{fmt.format(statistics.median(values))} "
        f"(min {fmt.format(min(values))}, max {fmt.format(max(values))})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp")
    ap.add_argument("--no-hta", action="store_true", help="measure bpfdyno only")
    ap.add_argument("--baseline", default="", help="an agent directory to compare with")
    args = ap.parse_args()
    baseline = str(Path(args.baseline).resolve()) if args.baseline else ""
    work = Path(tempfile.mkdtemp(prefix="bench-analysis-", dir=args.dir))
    try:
        ranks = work / "ranks"
        ranks.mkdir()
        path = ranks / "rank0.pt.trace.json"
        head, middle, end, repeat = cuda_shaped(args.size_mb << 20)
        with open(path, "wb") as f:
            for part in (head, middle, end):
                f.write(part)
        size = path.stat().st_size
        print(f"trace: {size / 1e6:.0f} MB (the real CPU and GPU parts x{repeat}), ", end="")
        print(f"{args.rounds} rounds")
        ours: dict[str, list[float]] = {"s": [], "mb": [], "cpu": []}
        old: dict[str, list[float]] = {"s": [], "mb": [], "cpu": []}
        theirs: dict[str, list[float]] = {"s": [], "mb": []}
        last: dict[str, object] = {}
        # Per code, one summary: every round gives the same, every digit.
        summaries: dict[str, set[str]] = {"": set(), baseline: set()}
        load_before = os.getloadavg()
        for n in range(args.rounds):
            runs = [("", ours), (baseline, old)] if baseline else [("", ours)]
            for source, into in runs if n % 2 == 0 else runs[::-1]:
                got = child(BPFDYNO, str(path), source)
                assert got["error"] == "", got
                assert not source or str(got["source"]).startswith(source), got["source"]
                into["s"].append(float(str(got["seconds"])))
                into["cpu"].append(float(str(got["cpu"])))
                into["mb"].append(int(str(got["peak_rss"])) / 1e6)
                summaries[source].add(str(got["summary"]))
                last = got
            if not args.no_hta:
                hta = child(HTA, str(ranks))
                theirs["s"].append(float(str(hta["seconds"])))
                theirs["mb"].append(int(str(hta["peak_rss"])) / 1e6)
        load_after = os.getloadavg()
        assert all(len(v) <= 1 for v in summaries.values()), "the summaries differ by round"
        rows = [
            "| what | time (s) | CPU time (s) | peak RSS (MB) |",
            "|---|---|---|---|",
            f"| bpfdyno summary + evidence + verdict | {stats(ours['s'], '{:.2f}')} "
            f"| {stats(ours['cpu'], '{:.2f}')} | {stats(ours['mb'], '{:.0f}')} |",
        ]
        if old["s"]:
            rows.append(
                f"| the same, baseline code | {stats(old['s'], '{:.2f}')} "
                f"| {stats(old['cpu'], '{:.2f}')} | {stats(old['mb'], '{:.0f}')} |"
            )
        if theirs["s"]:
            rows.append(
                f"| HTA TraceAnalysis + get_trace(0) | {stats(theirs['s'], '{:.1f}')} "
                f"| | {stats(theirs['mb'], '{:.0f}')} |"
            )
        print("\n".join(rows))
        if old["s"]:
            ratio = [a / b for a, b in zip(ours["s"], old["s"], strict=True)]
            cpu = [a / b for a, b in zip(ours["cpu"], old["cpu"], strict=True)]
            print(
                f"\nnew/baseline per round: time {stats(ratio, '{:.2f}')}, "
                f"CPU time {stats(cpu, '{:.2f}')}"
            )
        if baseline:
            # A baseline from before evidence this code adds has fewer fields: said, not
            # asserted (the exact facts are tests/tracing/test_trace_facts_exact.py's).
            same = summaries[""] == summaries[baseline]
            print(f"the two codes' summaries: {'the same' if same else 'differ'}")
        print(f"load average before: {load_before[0]:.1f}, after: {load_after[0]:.1f}")
        print(f"\nverdict: {last['headline']}")
        print(f"Targets: <= 5 s and <= 200 MB for 500 MB ({size / 1e6:.0f} MB here).")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
