"""What one socket call costs the net collector's programs, by variant of the program.

Run as root, as one command: ``python tests/bench/bench_net_calls.py [--rounds 3]
[--seconds 3] [--storms udp,pingpong] [--variants hash,slots]``.

Each variant is the net collector alone (no daemon, no other collector), loaded with one
setting changed, in interleaved rounds (the order rotates every round): ``hash``
(``proc_slots=0``: every process's byte counters in the hash, as before the slot table) and
``slots`` (the default: a process counts in the slot of its tgid, found without a hash
lookup). For each variant and storm (`bench_budget`'s UDP flood and TCP ping-pong over
loopback), the kernel's run statistics are on for the whole storm (``BPF_ENABLE_STATS``) and
each program's ``run_cnt`` / ``run_time_ns`` is read from this process's own descriptors
before and after: ns per run less what the statistics add to a run (an empty program's,
measured once), and runs per operation (every event on the machine counts, so these are
upper bounds on a busy one). Reported: medians over the rounds, and each round's ns per run
so the spread shows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from bench_budget import UNITS, agent_programs, peer, program_names, start_storm

from bpfdyno.ebpf.runstats import calibrate_stats_overhead, enable_bpf_stats
from bpfdyno.sources.net.collector import PROC_SLOTS, NetCollector

VARIANTS = {"hash": 0, "slots": PROC_SLOTS}


def one_storm(storm: str, seconds: float) -> tuple[int, dict[str, tuple[int, int]]]:
    """(operations, program name -> (runs, run ns)) of one storm, statistics on."""
    with peer(storm) as extra:
        before = agent_programs(os.getpid())
        proc = start_storm(storm, seconds, extra, Path("/nonexistent"), {})
        assert proc.stdout is not None
        lines = [line.split() for line in proc.stdout.read().splitlines() if line.strip()]
        proc.wait()
        after = agent_programs(os.getpid())
    names = program_names()
    ops = int(lines[-1][1]) - int(lines[0][1])
    runs = {}
    for prog, (cnt, ns) in after.items():
        cnt0, ns0 = before.get(prog, (0, 0))
        if cnt > cnt0:
            runs[names.get(prog, str(prog))] = (cnt - cnt0, ns - ns0)
    return ops, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--storms", default="udp,pingpong")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the collector loads BPF programs")
    storms = [s for s in args.storms.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    stats_ns = calibrate_stats_overhead()
    load0 = os.getloadavg()[0]
    # (variant, storm, program) -> [(ns per run, runs per op)] over the rounds
    got: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for r in range(args.rounds):
        for variant in variants[r % len(variants) :] + variants[: r % len(variants)]:
            c = NetCollector(proc_slots=VARIANTS[variant])
            c.start()
            fd = enable_bpf_stats()
            try:
                for storm in storms:
                    ops, runs = one_storm(storm, args.seconds)
                    for name, (cnt, ns) in runs.items():
                        got.setdefault((variant, storm, name), []).append(
                            (max(0.0, ns / cnt - stats_ns), cnt / max(1, ops))
                        )
                    print(f"  round {r + 1} {variant} {storm}: {ops / args.seconds:,.0f} "
                          f"{UNITS[storm]}, " + ", ".join(
                              f"{n} {ns / cnt - stats_ns:.0f} ns" for n, (cnt, ns) in
                              sorted(runs.items())), flush=True)  # fmt: skip
            finally:
                os.close(fd)
                c.close()
    print(
        f"\nMeasured {time.strftime('%Y-%m-%d')} on {os.uname().release}: the net collector "
        f"alone, {args.rounds} interleaved rounds of {args.seconds:.0f} s storms per variant, "
        f"run statistics on (their own {stats_ns:.0f} ns per run subtracted), load average "
        f"{load0:.2f} at the start and {os.getloadavg()[0]:.2f} at the end.\n"
    )
    print("| storm | program | variant | ns per run, median (each round) | runs per op "
          "| ns per op |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for storm in storms:
        for name in sorted({k[2] for k in got if k[1] == storm}):
            for variant in variants:
                rows = got.get((variant, storm, name), [])
                if not rows:
                    continue
                ns = statistics.median(x[0] for x in rows)
                per_op = statistics.median(x[1] for x in rows)
                each = ", ".join(f"{x[0]:.0f}" for x in rows)
                print(f"| {storm} | `{name}` | {variant} | {ns:.0f} ({each}) | {per_op:.2f} | "
                      f"{ns * per_op:.0f} |")  # fmt: skip


if __name__ == "__main__":
    main()
