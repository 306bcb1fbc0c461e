"""What the whole agent costs an idle machine: CPU share of one core and resident memory.

Run as root, as one command: ``python tests/bench/bench_agent_idle.py [--rounds 3]
[--settle 30] [--window 30] [--breakdown] [--baseline main] [--write-doc docs/performance.md]``.

Each round starts ``bpfdyno serve`` at its defaults (every default collector, 1 s
collection), lets it settle (``--settle`` seconds: compiles done, first rounds, compiler
pages released), then measures its CPU time (all its threads, to the nanosecond, from the
scheduler's per-thread books ``/proc/PID/task/*/schedstat``) over ``--window`` seconds and
its RSS at the end, and stops it.
Reported: the median and range over the rounds, and the memory the agent does not share
with other processes (``Private_*`` of ``smaps_rollup``): RSS counts the compiler's shared
library pages too, which stay resident while another process on the machine maps them.
``--breakdown`` adds rounds with one collector turned off at a time (interleaved with the
default ones), so the difference to the default is what that collector costs;
``--baseline REF`` adds rounds of the agent of a git ref (e.g. ``main``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from daemon_runner import Daemon, baseline_tree
from doc_blocks import write_results

SECTION = "## Agent footprint at idle"
#: Collectors switched off one at a time by --breakdown (those that run by default here).
BREAKDOWN = ("procs", "sched", "net", "perf_sw", "host", "self", "fabric", "irq")


def measure(
    overrides: list[str], settle_s: float, window_s: float, tree: Path | None
) -> tuple[float, int, int, tuple[float, float]]:
    """(CPU share of one core, RSS bytes, private bytes, (seconds to serving, to ready)) of one
    run."""
    with Daemon(overrides, settle_s=settle_s, tree=tree) as daemon:
        cpu0, t0 = daemon.cpu_seconds(), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = daemon.cpu_seconds(), time.monotonic()
        return (
            (cpu1 - cpu0) / (t1 - t0),
            daemon.rss_bytes(),
            private_bytes(daemon.pid),
            (daemon.serving_after_s, daemon.ready_after_s),
        )


def private_bytes(pid: int) -> int:
    """Memory of ``pid`` no other process maps (``Private_Clean + Private_Dirty``)."""
    total = 0
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1]) * 1024
    return total


def processes_now() -> tuple[int, int]:
    """(processes, threads) on the machine now."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    threads = 0
    for pid in pids:
        with contextlib.suppress(OSError):  # exited meanwhile
            threads += len(os.listdir(f"/proc/{pid}/task"))
    return len(pids), threads


def report(args: argparse.Namespace, baseline: Path | None) -> str:
    kinds: dict[str, list[str]] = {"defaults": []}
    if baseline is not None:
        kinds[f"agent of `{args.baseline}`"] = []
    if args.breakdown:
        kinds.update({f"without {c}": [f"collectors.{c}.enabled=false"] for c in BREAKDOWN})
    names = list(kinds)
    cpu: dict[str, list[float]] = {k: [] for k in names}
    rss: dict[str, list[int]] = {k: [] for k in names}
    private: dict[str, list[int]] = {k: [] for k in names}
    ready: list[tuple[float, float]] = []
    load0 = os.getloadavg()[0]
    procs, threads = processes_now()
    for i in range(args.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for kind in order:
            tree = baseline if kind.startswith("agent of") else None
            share, rss_bytes, own_bytes, ready_s = measure(
                kinds[kind], args.settle, args.window, tree
            )
            cpu[kind].append(share)
            rss[kind].append(rss_bytes)
            private[kind].append(own_bytes)
            if kind == "defaults":
                ready.append(ready_s)
            print(
                f"  round {i + 1}/{args.rounds} {kind}: {share * 100:.2f} % of a core, "
                f"RSS {rss_bytes / 1e6:.0f} MB",
                flush=True,
            )
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{procs} processes / {threads} threads on the machine, load average {load0:.2f} at the "
        f"start; {args.rounds} rounds, each {args.settle:.0f} s settling then "
        f"{args.window:.0f} s measured.",
        "",
        "| agent | CPU, median (range) | RSS, median (range) | private memory | target |",
        "|---|---|---|---|---|",
    ]
    base = statistics.median(cpu["defaults"])
    for kind in names:
        c, r = cpu[kind], rss[kind]
        target = "<= 0.5 % of a core, <= 150 MB" if kind == "defaults" else ""
        saving = (
            f" (saves {(base - statistics.median(c)) * 100:.2f})"
            if kind.startswith("without")
            else ""
        )
        lines.append(
            f"| {kind} | {statistics.median(c) * 100:.2f} % ({min(c) * 100:.2f}-"
            f"{max(c) * 100:.2f}){saving} | {statistics.median(r) / 1e6:.0f} MB "
            f"({min(r) / 1e6:.0f}-{max(r) / 1e6:.0f}) | "
            f"{statistics.median(private[kind]) / 1e6:.0f} MB | {target} |"
        )
    serving = [r[0] for r in ready]
    everything = [r[1] for r in ready]
    lines += [
        "",
        f"Ready after start (every metric collector and the tracing endpoints answering): "
        f"{min(serving):.1f}-{max(serving):.1f} s (target <= 3 s); the kernel-track capture, "
        f"which compiles its programs in the background, {min(everything):.1f}-"
        f"{max(everything):.1f} s.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="daemon runs per kind")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    parser.add_argument(
        "--breakdown", action="store_true", help="also run with each collector off in turn"
    )
    parser.add_argument(
        "--baseline", metavar="GIT_REF", help="also measure the agent of this git ref"
    )
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    with tempfile.TemporaryDirectory(prefix="bd-baseline-") as tmp:
        tree = baseline_tree(args.baseline, Path(tmp)) if args.baseline else None
        results = report(args, tree)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_agent_idle", results)


if __name__ == "__main__":
    main()
