"""What one refresh of the process table costs with hundreds of processes.

Run as root, as one command: ``python tests/bench/bench_process_table.py [--processes 500]
[--updates 30] [--write-doc docs/performance.md]``.

Starts sleeping processes until the machine has ``--processes`` of them, runs the sched
collector (whose per-process books the table uses) and a `ProcessTable` with its default
size (200 rows), and measures the CPU time (this thread's, ``time.thread_time``) of:

- an update nobody reads (what the idle agent pays every second);
- an update whose rows are built (someone watches: ``bpfdyno top``, ``ps --watch``);
- the same without the sched collector (every process's /proc/PID/stat read each time).

One update per collection of the sched collector, ``--interval`` seconds apart; reported:
median and 90th percentile over ``--updates`` updates.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from doc_blocks import write_results

from bpfdyno.sources.procs.table import ProcessTable
from bpfdyno.sources.sched.collector import SchedCollector

SECTION = "## Process table refresh"


def processes_now() -> int:
    return sum(1 for p in os.listdir("/proc") if p.isdigit())


def timed(
    updates: int, interval: float, before: Callable[[], object], run: Callable[[], object]
) -> list[float]:
    """CPU ms of ``run`` (after ``before``, untimed) once per interval."""
    out = []
    for _ in range(updates):
        time.sleep(interval)
        before()
        t0 = time.thread_time()
        run()
        out.append((time.thread_time() - t0) * 1e3)
    return out


def report(args: argparse.Namespace) -> str:
    sleepers = [
        subprocess.Popen(["sleep", "3600"]) for _ in range(max(0, args.processes - processes_now()))
    ]
    try:
        time.sleep(1.0)
        total = processes_now()
        sched = SchedCollector()
        sched.start()
        try:
            table = ProcessTable(sched=sched.per_process)
            table.refresh()
            sched.collect()
            quiet = timed(args.updates, args.interval, sched.collect, table.update)
            table.snapshot  # noqa: B018 - a read: from now on the updates build rows
            watched = timed(args.updates, args.interval, sched.collect, table.refresh)
        finally:
            sched.close()
        plain = ProcessTable()
        plain.refresh()
        no_sched = timed(args.updates, args.interval, lambda: None, plain.refresh)
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()

    def row(name: str, ms: list[float]) -> str:
        p90 = statistics.quantiles(ms, n=10)[-1] if len(ms) > 1 else ms[0]
        return f"| {name} | {statistics.median(ms):.2f} ms | {p90:.2f} ms |"

    return "\n".join(
        [
            f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} "
            f"({os.cpu_count()} CPUs), {total} processes, {args.updates} updates "
            f"{args.interval:g} s apart, load average {os.getloadavg()[0]:.2f}.",
            "",
            "| update of the process table (200 rows) | CPU, median | CPU, p90 |",
            "|---|---|---|",
            row("nobody reads it (sched running)", quiet),
            row("rows built (sched running)", watched),
            row("rows built, no sched collector", no_sched),
            "",
            "Target: <= 5 ms per refresh at 500 processes.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--processes", type=int, default=500, help="processes on the machine")
    parser.add_argument("--updates", type=int, default=30, help="updates measured per kind")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between updates")
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the sched collector loads BPF programs")
    results = report(args)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_process_table", results)


if __name__ == "__main__":
    main()
