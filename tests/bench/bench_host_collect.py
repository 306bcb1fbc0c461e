"""What the host and self collectors cost per collection on this machine.

Run as a script: ``python tests/bench/bench_host_collect.py [--rounds 10] [--collects 50]
[--extra-procs 500]``. Rounds alternate between the machine as it is ("plain") and the same
machine with ``--extra-procs`` sleeping processes started for the round ("+procs"), because
counting processes is the only part whose cost grows with the host. Each round times
``--collects`` back-to-back ``collect()`` calls of each collector on this thread's CPU clock
(user + system time, so the kernel's work rendering /proc files is included). Printed: the
median CPU microseconds per collect for each collector and round kind, the ratio +procs/plain,
and the share of one core that one collect per second of both collectors costs, against the
product's 1 % budget for the whole agent.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from collections.abc import Callable

from bpfdyno.sources.base import Collector
from bpfdyno.sources.host.collector import HostCollector
from bpfdyno.sources.host.self_stats import SelfCollector


def cpu_us_per_collect(collector: Collector, collects: int) -> float:
    start = time.thread_time()
    for _ in range(collects):
        collector.collect()
    return (time.thread_time() - start) / collects * 1e6


def with_processes(count: int, body: Callable[[], None]) -> None:
    children = [subprocess.Popen(["sleep", "600"]) for _ in range(count)]
    try:
        time.sleep(0.2)  # let them all exec before measuring
        body()
    finally:
        for child in children:
            child.kill()
        for child in children:
            child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each kind")
    parser.add_argument("--collects", type=int, default=50, help="collects timed per round")
    parser.add_argument("--extra-procs", type=int, default=500, help="processes for +procs")
    args = parser.parse_args()

    collectors: dict[str, Collector] = {"host": HostCollector(), "self": SelfCollector()}
    for c in collectors.values():
        c.start()
        c.collect()  # the first collect has no previous reading; leave it out
    results: dict[tuple[str, str], list[float]] = {}

    def measure(kind: str) -> None:
        for name, collector in collectors.items():
            results.setdefault((name, kind), []).append(
                cpu_us_per_collect(collector, args.collects)
            )

    for _ in range(args.rounds):
        measure("plain")
        with_processes(args.extra_procs, lambda: measure("+procs"))

    print(f"{args.rounds} rounds x {args.collects} collects, +procs = {args.extra_procs} extra")
    print(f"{'collector':<10}{'plain us':>12}{'+procs us':>12}{'ratio':>8}")
    for name in collectors:
        plain = statistics.median(results[(name, "plain")])
        more = statistics.median(results[(name, "+procs")])
        print(f"{name:<10}{plain:>12.1f}{more:>12.1f}{more / plain:>8.2f}")
    both = sum(statistics.median(results[(n, "plain")]) for n in collectors)
    print(f"one collect/s of both: {both / 1e4:.3f} % of one core (agent budget: 1 %)")


if __name__ == "__main__":
    main()
