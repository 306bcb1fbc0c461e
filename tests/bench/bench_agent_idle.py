"""What the whole agent costs an idle machine: CPU share of one core and resident memory.

Run as root, as one command: ``python tests/bench/bench_agent_idle.py [--rounds 3]
[--settle 30] [--window 30] [--breakdown] [--write-doc docs/performance.md]``.

Each round starts ``bpfdyno serve`` at its defaults (every default collector, 1 s
collection), lets it settle (``--settle`` seconds: compiles done, first rounds, compiler
pages released), then measures its CPU time (user + system of all its threads, from
``/proc/PID/stat``) over ``--window`` seconds and its RSS at the end, and stops it.
Reported: the median and range over the rounds. ``--breakdown`` adds rounds with one
collector turned off at a time (interleaved with the default ones), so the difference to the
default is what that collector costs.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import textwrap
import time
from pathlib import Path

from daemon_runner import Daemon

SECTION = "## Agent footprint at idle"
#: Collectors switched off one at a time by --breakdown (those that run by default here).
BREAKDOWN = ("procs", "sched", "net", "perf_sw", "host", "self")


def measure(overrides: list[str], settle_s: float, window_s: float) -> tuple[float, int, float]:
    """(CPU share of one core, RSS bytes, seconds to ready) of one daemon run."""
    with Daemon(overrides, settle_s=settle_s) as daemon:
        cpu0, t0 = daemon.cpu_seconds(), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = daemon.cpu_seconds(), time.monotonic()
        return (cpu1 - cpu0) / (t1 - t0), daemon.rss_bytes(), daemon.ready_after_s


def processes_now() -> tuple[int, int]:
    """(processes, threads) on the machine now."""
    pids = [p for p in os.listdir("/proc") if p.isdigit()]
    threads = 0
    for pid in pids:
        with contextlib.suppress(OSError):  # exited meanwhile
            threads += len(os.listdir(f"/proc/{pid}/task"))
    return len(pids), threads


def report(args: argparse.Namespace) -> str:
    kinds: dict[str, list[str]] = {"defaults": []}
    if args.breakdown:
        kinds.update({f"without {c}": [f"collectors.{c}.enabled=false"] for c in BREAKDOWN})
    names = list(kinds)
    cpu: dict[str, list[float]] = {k: [] for k in names}
    rss: dict[str, list[int]] = {k: [] for k in names}
    ready: list[float] = []
    load0 = os.getloadavg()[0]
    procs, threads = processes_now()
    for i in range(args.rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for kind in order:
            share, rss_bytes, ready_s = measure(kinds[kind], args.settle, args.window)
            cpu[kind].append(share)
            rss[kind].append(rss_bytes)
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
        "| agent | CPU, median (range) | RSS, median (range) | target |",
        "|---|---|---|---|",
    ]
    base = statistics.median(cpu["defaults"])
    for kind in names:
        c, r = cpu[kind], rss[kind]
        target = "<= 0.5 % of a core, <= 150 MB" if kind == "defaults" else ""
        saving = "" if kind == "defaults" else f" (saves {(base - statistics.median(c)) * 100:.2f})"
        lines.append(
            f"| {kind} | {statistics.median(c) * 100:.2f} % ({min(c) * 100:.2f}-"
            f"{max(c) * 100:.2f}){saving} | {statistics.median(r) / 1e6:.0f} MB "
            f"({min(r) / 1e6:.0f}-{max(r) / 1e6:.0f}) | {target} |"
        )
    lines += ["", f"Ready after start: {min(ready):.1f}-{max(ready):.1f} s (target <= 3 s)."]
    return "\n".join(lines)


def write_section(doc: Path, results: str) -> None:
    """Replace the results block of the section in ``doc`` (creating either if missing)."""
    start, end = "<!-- bench_agent_idle:begin -->", "<!-- bench_agent_idle:end -->"
    block = f"{start}\n{results}\n{end}"
    text = doc.read_text() if doc.exists() else "# Performance\n"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    elif SECTION in text:
        at = text.index(SECTION) + len(SECTION)
        text = text[:at] + "\n\n" + block + text[at:]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    doc.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="daemon runs per kind")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds before measuring")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    parser.add_argument(
        "--breakdown", action="store_true", help="also run with each collector off in turn"
    )
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    results = report(args)
    print(results)
    if args.write_doc:
        write_section(args.write_doc, results)


if __name__ == "__main__":
    main()
