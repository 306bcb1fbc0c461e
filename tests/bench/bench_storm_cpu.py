"""The pipe storm's own CPU time per round trip, with the agent off, on, and each part off.

Run as root: ``python tests/bench/bench_storm_cpu.py [--rounds 5] [--duration 6]
[--parts sched,net,perf_sw,irq,host,procs,self]``.

``bench_budget.py`` reports a storm's *rate*: on a loaded 2-CPU machine the rate moves
with whoever else runs, by more than the agent's share. This bench reports what the
kernel charges the storm itself: the pipe storm (two processes ping-ponging one byte over
two pipes, both pinned to CPU 0, as in ``bench_budget.py``) reads, when its time is up,
its own user and system time (``getrusage``) and its partner's (``wait4``), and divides
their sum by the round trips it made. A neighbour that takes CPU 0 for a while delays the
storm but is not charged to it; what the kernel does for the agent inside the storm's own
context switches and system calls (tracepoint dispatch, BPF programs, perf events'
per-switch work, cache misses) is. So the number moves with the agent, not with the load.

Variants, interleaved (the order rotates every round), medians over the rounds:

* **off**: no agent;
* **on**: ``bpfdyno serve`` at its defaults with ``[budget] enabled = false`` (it reduces
  nothing during the storm);
* **budget**: ``bpfdyno serve`` at every default, the budget included, measured once the
  budget acted on a first pipe storm (see `budget_storm`);
* **-PART**: as **on** with ``[collectors.PART] enabled = false``, for each part
  (``--parts``; ``a+b`` turns off both: e.g. every collector with a per-event kernel hook
  at once, leaving the agent's process and its idle rounds).

``--empty-switch`` adds two variants without an agent: an empty BPF program (return 0)
attached as a raw tracepoint to ``sched_switch`` (**empty-switch**), and the same with the
kernel's run statistics on (**empty-switch+stats**): what entering any program on every
context switch costs, apart from what a program does.

Reported per variant: ns of the storm's CPU per round trip (user, system, total) and the
difference from **off**. An agent is started for each variant's storm and stopped after it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from daemon_runner import Daemon

from bpfdyno.ebpf.fdops import load_program, open_raw_tracepoint
from bpfdyno.ebpf.runstats import EMPTY_PROGRAM, enable_bpf_stats
from bpfdyno.sources.budget.controller import WARMUP_S

PIPE_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static double secs(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }
int main(int argc, char **argv) {
    double dur = atof(argv[1]), t0 = now();
    int a[2], b[2], status;
    char c = 0;
    long n = 0;
    cpu_set_t set;
    struct rusage self, child;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    sched_setaffinity(0, sizeof set, &set);
    if (pipe(a) || pipe(b)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        for (;;) {
            if (read(a[0], &c, 1) != 1) return 0;
            if (write(b[1], &c, 1) != 1) return 0;
        }
    }
    close(a[0]);
    close(b[1]);
    while (now() - t0 < dur) {
        for (int i = 0; i < 1000; i++) {
            if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) return 1;
        }
        n += 1000;
    }
    close(a[1]);
    getrusage(RUSAGE_SELF, &self);
    if (wait4(pid, &status, 0, &child) != pid) return 1;
    /* round trips, wall s, user s, system s, preemptions (both processes) */
    printf("%ld %f %f %f %ld\n", n, now() - t0, secs(self.ru_utime) + secs(child.ru_utime),
           secs(self.ru_stime) + secs(child.ru_stime), self.ru_nivcsw + child.ru_nivcsw);
    return 0;
}
"""
PARTS = ("sched", "net", "perf_sw", "irq", "host", "procs", "self")


@dataclass
class Storm:
    round_trips: int
    wall_s: float
    user_s: float
    system_s: float
    #: Involuntary context switches of both processes: mostly the partner woken by a write
    #: preempting the writer before it blocks in its read (part of the workload), plus any
    #: neighbour that took CPU 0 (each costs the storm a switch of its own).
    preempted: int

    def ns(self, seconds: float) -> float:
        return seconds / self.round_trips * 1e9


def run_storm(pipe_bin: Path, seconds: float) -> Storm:
    out = subprocess.run(
        [str(pipe_bin), str(seconds)], capture_output=True, text=True, check=True
    ).stdout.split()
    return Storm(int(out[0]), float(out[1]), float(out[2]), float(out[3]), int(out[4]))


def overrides_for(variant: str) -> list[str] | None:
    if variant == "off":
        return None
    base = ["budget.enabled=false"]
    if variant == "on":
        return base
    parts = variant.removeprefix("-").split("+")
    return [*base, *(f"collectors.{part}.enabled=false" for part in parts)]


BPF_PROG_TYPE_RAW_TRACEPOINT = 17
_STEP_LINE = "INFO bpfdyno.sources.budget.controller: budget: "
#: How long the **budget** variant's first storm may take to bring the budget's first step.
PRIME_LIMIT_S = 40.0


def empty_switch_storm(pipe_bin: Path, seconds: float, stats: bool) -> Storm:
    prog, error = load_program(EMPTY_PROGRAM, BPF_PROG_TYPE_RAW_TRACEPOINT, "empty_switch", b"GPL")
    if prog < 0:
        sys.exit(f"loading the empty program failed: {error}")
    link = open_raw_tracepoint("sched_switch", prog)
    stats_fd = enable_bpf_stats() if stats else None
    try:
        return run_storm(pipe_bin, seconds)
    finally:
        if stats_fd is not None:
            os.close(stats_fd)
        os.close(link)
        os.close(prog)


def measure(variant: str, pipe_bin: Path, seconds: float) -> Storm:
    if variant.startswith("empty-switch"):
        return empty_switch_storm(pipe_bin, seconds, stats=variant.endswith("+stats"))
    if variant == "budget":
        return budget_storm(pipe_bin, seconds)
    overrides = overrides_for(variant)
    if overrides is None:
        return run_storm(pipe_bin, seconds)
    with Daemon(overrides, settle_s=3.0):
        return run_storm(pipe_bin, seconds)


def budget_storm(pipe_bin: Path, seconds: float) -> Storm:
    """The storm beside the agent at every default, the budget included, once it acted.

    A first storm runs until the budget logs its first step (past its warm-up), and the
    measured one starts as that one ends: a step is undone only after 30 s of calm, so the
    measured storm runs with what the budget does during a storm.
    """
    with Daemon([], settle_s=WARMUP_S + 3.0, log_level="info") as daemon:
        prime = subprocess.Popen([str(pipe_bin), str(PRIME_LIMIT_S)], stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + PRIME_LIMIT_S

        def taken() -> list[str]:
            """The steps the budget took so far (at INFO; its one WARNING repeats one)."""
            return [
                line.split(_STEP_LINE)[1].split(":")[0]
                for _, line in list(daemon.log)
                if _STEP_LINE in line and " undone " not in line
            ]

        try:
            while time.monotonic() < deadline and not taken():
                time.sleep(0.2)
        finally:
            prime.kill()
            prime.wait()
        if not taken():
            sys.exit(f"the budget took no step in {PRIME_LIMIT_S:.0f} s of the pipe storm")
        storm = run_storm(pipe_bin, seconds)
        steps = sorted(set(taken()))
        print(f"    budget: steps {', '.join(steps)}", flush=True)
        return storm


def report(rounds: int, seconds: float, parts: list[str], empty_switch: bool) -> str:
    variants = ["off", "on", "budget", *(f"-{p}" for p in parts)]
    if empty_switch:
        variants += ["empty-switch", "empty-switch+stats"]
    results: dict[str, list[Storm]] = {v: [] for v in variants}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        pipe_bin = Path(tmp) / "pipe"
        (Path(tmp) / "pipe.c").write_text(PIPE_C)
        subprocess.run(["gcc", "-O2", "-o", str(pipe_bin), str(Path(tmp) / "pipe.c")], check=True)
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for variant in order:
                storm = measure(variant, pipe_bin, seconds)
                results[variant].append(storm)
                print(
                    f"  round {r + 1} {variant:9} {storm.round_trips / storm.wall_s:,.0f} round "
                    f"trips/s, {storm.ns(storm.user_s + storm.system_s):.0f} ns CPU each "
                    f"(user {storm.ns(storm.user_s):.0f}, system {storm.ns(storm.system_s):.0f}), "
                    f"preempted {storm.preempted:,}",
                    file=sys.stderr,
                    flush=True,
                )

    def med(variant: str, which: str) -> float:
        def seconds(s: Storm) -> float:
            return {"user": s.user_s, "system": s.system_s}.get(which, s.user_s + s.system_s)

        return statistics.median(s.ns(seconds(s)) for s in results[variant])

    off = med("off", "total")
    on = med("on", "total")
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{rounds} interleaved rounds of {seconds:.0f} s pipe storms (both processes on CPU 0), "
        f"load average {load0:.2f} at the start (1 min) and {os.getloadavg()[0]:.2f} at the end.",
        "",
        "| agent | storm CPU per round trip | user | system | vs off | part's share of on-off "
        "| round trips/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        total = med(variant, "total")
        rate = statistics.median(s.round_trips / s.wall_s for s in results[variant])
        share = ""
        if variant.startswith("-") and on > off:
            share = f"{(on - total) / (on - off) * 100:.0f} %"
        vs = "" if variant == "off" else f"{total - off:+.0f} ns ({(total / off - 1) * 100:+.1f} %)"
        names = {
            "off": "off",
            "on": "on (defaults, budget off)",
            "budget": "on (every default, the budget acting)",
            "empty-switch": "no agent, an empty program on sched_switch",
            "empty-switch+stats": "no agent, an empty program on sched_switch, run statistics on",
        }
        name = names.get(variant, f"on, {variant[1:]} off")
        lines.append(
            f"| {name} | {total:.0f} ns | {med(variant, 'user'):.0f} ns | "
            f"{med(variant, 'system'):.0f} ns | {vs} | {share} | {rate:,.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of each storm")
    parser.add_argument("--parts", default=",".join(PARTS), help="collectors to turn off in turn")
    parser.add_argument(
        "--empty-switch", action="store_true", help="also an empty program on sched_switch"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    parts = [p for p in args.parts.split(",") if p]
    print(report(args.rounds, args.duration, parts, args.empty_switch))


if __name__ == "__main__":
    main()
