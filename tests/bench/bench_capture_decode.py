"""How many sched-track records the capture keeps up with, and what each costs the agent.
Run as root: ``python tests/bench/bench_capture_decode.py [--rounds 5] [--seconds 5]
[--baseline DIR]``.

Each round, in a fresh child process: a `CaptureManager` (the agent's capture part, at its
defaults: a 1 MiB ring, drained every 10-100 ms) records the ``sched`` track of
``perf bench sched pipe -T`` — two threads of one process passing a byte back and forth
through pipes, each pass two context switches, so one off-CPU record each — for
``--seconds``. The workload is pinned to CPU 0 and the capture to CPU 1, so the capture
has a whole CPU and the record rate is the workload's: far above what a training job's
threads switch (a few thousand a second), to find where the capture stops keeping up.

Reported per round and as medians: records the programs wrote a second (kept + lost), the
share lost in the kernel (the ring was full when a record came), and the capture process's
CPU time per record it read (user + system, its garbage collections included; their share
is given too). With ``--baseline DIR`` (the ``agent`` directory of another checkout) each
round runs that code too, the two in alternating order, and the ratio new/old per round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = r"""
import gc, json, os, resource, subprocess, sys, time
os.sched_setaffinity(0, {1})
from bpfdyno.core.config import load
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import KernelTrackRequest, Track
seconds = float(sys.argv[1])
gc_s = [0.0, 0.0]
def timed(phase, info):
    if phase == "start":
        gc_s[1] = time.perf_counter()
    else:
        gc_s[0] += time.perf_counter() - gc_s[1]
gc.callbacks.append(timed)
m = CaptureManager(load(None).capture)
m.start()
assert m.wait_loaded(120)
work = subprocess.Popen(
    ["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-T", "-l", "100000000"],
    stdout=subprocess.DEVNULL,
)
time.sleep(0.3)
key = CaptureKey("bench", work.pid)
m.begin(key, KernelTrackRequest(frozenset({Track.SCHED}), 0.0)).result(60)
gc_s[0] = 0.0
before = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.monotonic()
time.sleep(seconds)
capture = m.end(key).result(120)
elapsed = time.monotonic() - t0
after = resource.getrusage(resource.RUSAGE_SELF)
work.kill()
work.wait()
m.stop()
stats = capture.stats[Track.SCHED]
cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
print(json.dumps({
    "seconds": elapsed, "read": stats.events, "lost": stats.lost_kernel, "cpu": cpu,
    "gc": gc_s[0], "kept": len(capture.records),
}))
"""


def child(seconds: float, source: str) -> dict[str, float]:
    """One capture run in a fresh interpreter; ``source``: an ``agent`` directory first."""
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(seconds)], capture_output=True, text=True, env=env
    )
    if r.returncode != 0:
        raise SystemExit(f"the capture run failed: {r.stderr[-3000:]}")
    out: dict[str, float] = json.loads(r.stdout.strip().splitlines()[-1])
    return out


def figures(run: dict[str, float]) -> dict[str, float]:
    """A run's rates: written/s, lost share, CPU per read record (µs), GC share of the CPU."""
    written = run["read"] + run["lost"]
    return {
        "written_per_s": written / run["seconds"],
        "lost": run["lost"] / written if written else 0.0,
        "us_per_record": run["cpu"] / run["read"] * 1e6 if run["read"] else float("nan"),
        "gc_share": run["gc"] / run["cpu"] if run["cpu"] else 0.0,
    }


def line(name: str, f: dict[str, float]) -> str:
    return (
        f"| {name} | {f['written_per_s']:,.0f} | {f['lost'] * 100:.1f} % | "
        f"{f['us_per_record']:.2f} | {f['gc_share'] * 100:.0f} % |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--baseline", default="", help="an agent directory to compare with")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the capture loads BPF programs")
    if shutil.which("perf") is None or shutil.which("taskset") is None:
        raise SystemExit("needs perf and taskset (Debian: linux-perf, util-linux)")
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two CPUs: the workload on CPU 0, the capture on CPU 1")
    codes = {"this code": ""}
    if args.baseline:
        codes["baseline"] = str(Path(args.baseline).resolve())
    results: dict[str, list[dict[str, float]]] = {name: [] for name in codes}
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    header = (
        "| code | records written/s | lost in the kernel | agent CPU per record read (µs) "
        "| of it in GC |"
    )
    print(header)
    print("|---|---|---|---|---|")
    for n in range(args.rounds):
        order = list(codes.items())
        if n % 2:
            order.reverse()
        for name, source in order:
            f = figures(child(args.seconds, source))
            results[name].append(f)
            print(line(f"{name}, round {n + 1}", f), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}\n")
    print("Medians over the rounds:\n")
    print(header)
    print("|---|---|---|---|---|")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(line(name, med))
    if args.baseline:
        ratios = [
            new["us_per_record"] / old["us_per_record"]
            for new, old in zip(results["this code"], results["baseline"], strict=True)
        ]
        print(
            f"\nCPU per record, new/old per round: median {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}-{max(ratios):.2f})"
        )


if __name__ == "__main__":
    main()
