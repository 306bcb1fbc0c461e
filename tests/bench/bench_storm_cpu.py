"""Storms' own CPU time per operation, with the agent off, on, and each part off.

Run as root: ``python tests/bench/bench_storm_cpu.py [--rounds 5] [--duration 6]
[--storms pipe,udp,pingpong] [--parts sched,net,perf_sw,irq,host,procs,self]``.

``bench_budget.py`` reports a storm's *rate*: on a loaded 2-CPU machine the rate moves
with whoever else runs, by more than the agent's share. This bench reports what the
kernel charges the storm itself. Each storm is a C program of two processes; when its time
is up it reads its own user and system time (``getrusage``) and its partner's (``wait4``),
adds what the kernel's softirq threads of CPUs 0 and 1 ran meanwhile, and divides the sum by
the operations it made. A neighbour that takes the storm's CPU for a while delays the
storm but is not charged to it; what the kernel does for the agent inside the storm's own
context switches, system calls and softirqs (tracepoint dispatch, BPF programs, perf events'
per-switch work, cache misses) is. So the number moves with the agent, not with the load.

* ``pipe``: one byte ping-ponged over two pipes, both processes on CPU 0 (``perf bench
  sched pipe``'s workload, as in ``bench_budget.py``): per round trip, two context switches
  and two wakeups.
* ``udp``: 64-byte datagrams over loopback in bursts of 64 (sender on CPU 0, receiver on
  CPU 1, a pipe each way between bursts; see `UDP_C`): per datagram, one send, the receive
  path in the sender's softirq and one recv, the programs on each.
* ``pingpong``: 64-byte TCP request/response round trips (client on CPU 0, echo server on
  CPU 1): per round trip, two sends, two receives, two cross-CPU wakeups. On a VM each
  wakeup's interrupt to the other CPU is an exit to the hypervisor, charged to the waker,
  which can outweigh the rest many times over.

Variants, interleaved (the order rotates every round), medians over the rounds:

* **off**: no agent;
* **on**: ``bpfdyno serve`` at its defaults with ``[budget] enabled = false`` (it reduces
  nothing during the storm);
* **budget**: ``bpfdyno serve`` at every default, the budget included, measured once the
  budget acted on a first storm of the same kind (see `budget_storm`);
* **-PART**: as **on** with ``[collectors.PART] enabled = false``, for each part
  (``--parts``; ``a+b`` turns off both: e.g. every collector with a per-event kernel hook
  at once, leaving the agent's process and its idle rounds).

``--empty-switch`` adds two variants without an agent: an empty BPF program (return 0)
attached as a raw tracepoint to ``sched_switch`` (**empty-switch**), and the same with the
kernel's run statistics on (**empty-switch+stats**): what entering any program on every
context switch costs, apart from what a program does.

Reported per storm and variant: ns of the storm's CPU per operation (user, system, softirq
threads, total) and the difference from **off**. An agent is started for each variant's
storm and stopped after it. The rounds run every storm under every variant, the order
rotating by one each round.
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

# The storms' C programs. Each pins itself to CPU 0 (its partner to CPU 0 for the pipe, CPU 1
# for the sockets), runs argv[1] seconds, and prints one line: operations, wall s, user s and
# system s of both processes (getrusage and wait4), and both processes' preemptions.
_C_HEAD = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
static double secs(struct timeval t) { return t.tv_sec + t.tv_usec / 1e6; }
static void pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    sched_setaffinity(0, sizeof set, &set);
}
static int report(long n, double wall, pid_t pid) {
    int status;
    struct rusage self, child;
    getrusage(RUSAGE_SELF, &self);
    if (wait4(pid, &status, 0, &child) != pid) return 1;
    printf("%ld %f %f %f %ld\n", n, wall, secs(self.ru_utime) + secs(child.ru_utime),
           secs(self.ru_stime) + secs(child.ru_stime), self.ru_nivcsw + child.ru_nivcsw);
    return 0;
}
/* A socket of `type` on a free loopback port (listening, for TCP); its address in `addr`. */
__attribute__((unused)) static int bound(int type, struct sockaddr_in *addr) {
    socklen_t len = sizeof *addr;
    memset(addr, 0, len);
    addr->sin_family = AF_INET;
    addr->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, type, 0);
    if (s < 0 || bind(s, (struct sockaddr *)addr, len) || (type == SOCK_STREAM && listen(s, 1)) ||
        getsockname(s, (struct sockaddr *)addr, &len))
        exit(1);
    return s;
}
__attribute__((unused)) static int connected(int type, const struct sockaddr_in *addr) {
    int s = socket(AF_INET, type, 0);
    if (s < 0 || connect(s, (const struct sockaddr *)addr, sizeof *addr)) exit(1);
    return s;
}
"""

PIPE_C = (
    _C_HEAD
    + r"""
int main(int argc, char **argv) {
    double dur = atof(argv[1]), t0 = now(), wall;
    int a[2], b[2];
    char c = 0;
    long n = 0;
    pin(0);
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
    wall = now() - t0;
    close(a[1]);
    return report(n, wall, pid);
}
"""
)
#: 64-byte datagrams in bursts of 64 from CPU 0 to a receiver on CPU 1: the sender sends a
#: burst, then writes a byte to a pipe; the receiver, woken by it, reads the burst's datagrams
#: and answers on a second pipe, which the sender waits for. So each datagram costs one send,
#: loopback's receive path (a softirq in the sender's context) and one recv, and each burst two
#: wakeups, whatever either side's speed: a receiver woken per datagram, as in a plain flood,
#: makes the sender's cost depend on whether it keeps up (a slower receiver needs fewer
#: wakeups), which moves the CPU per datagram by more than the agent's programs cost.
UDP_C = (
    _C_HEAD
    + r"""
#define BURST 64
int main(int argc, char **argv) {
    double dur = atof(argv[1]), t0, wall;
    char buf[2048] = {0}, go = 0;
    long n = 0;
    int up[2], down[2];
    struct sockaddr_in addr;
    int rx = bound(SOCK_DGRAM, &addr);
    if (pipe(up) || pipe(down)) return 1;
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        close(up[1]);
        close(down[0]);
        while (read(up[0], &go, 1) == 1) {
            for (int i = 0; i < BURST; i++) {
                if (recv(rx, buf, sizeof buf, 0) != 64) return 1;
            }
            if (write(down[1], &go, 1) != 1) return 1;
        }
        return 0;
    }
    close(rx);
    close(up[0]);
    close(down[1]);
    pin(0);
    int tx = connected(SOCK_DGRAM, &addr);
    t0 = now();
    while (now() - t0 < dur) {
        for (int b = 0; b < 16; b++) {
            for (int i = 0; i < BURST; i++) {
                if (send(tx, buf, 64, 0) != 64) return 1;
            }
            if (write(up[1], &go, 1) != 1 || read(down[0], &go, 1) != 1) return 1;
        }
        n += 16 * BURST;
    }
    wall = now() - t0;
    close(up[1]);
    return report(n, wall, pid);
}
"""
)
#: 64-byte TCP request/response round trips, TCP_NODELAY, client on CPU 0, echo server on CPU 1.
PINGPONG_C = (
    _C_HEAD
    + r"""
int main(int argc, char **argv) {
    double dur = atof(argv[1]), t0, wall;
    char buf[64] = {0};
    long n = 0;
    int one = 1;
    struct sockaddr_in addr;
    int srv = bound(SOCK_STREAM, &addr);
    pid_t pid = fork();
    if (pid == 0) {
        pin(1);
        int conn = accept(srv, NULL, NULL);
        setsockopt(conn, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        for (;;) {
            ssize_t got = recv(conn, buf, sizeof buf, 0);
            if (got <= 0 || send(conn, buf, got, 0) != got) return 0;
        }
    }
    close(srv);
    pin(0);
    int c = connected(SOCK_STREAM, &addr);
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    t0 = now();
    while (now() - t0 < dur) {
        for (int i = 0; i < 100; i++) {
            if (send(c, buf, 64, 0) != 64) return 1;
            for (ssize_t got = 0; got < 64;) {
                ssize_t r = recv(c, buf + got, 64 - got, 0);
                if (r <= 0) return 1;
                got += r;
            }
        }
        n += 100;
    }
    wall = now() - t0;
    close(c);
    return report(n, wall, pid);
}
"""
)
STORM_C = {"pipe": PIPE_C, "udp": UDP_C, "pingpong": PINGPONG_C}
OPERATION = {"pipe": "round trip", "udp": "datagram", "pingpong": "round trip"}
PARTS = ("sched", "net", "perf_sw", "irq", "host", "procs", "self")


@dataclass
class Storm:
    operations: int
    wall_s: float
    user_s: float
    system_s: float
    #: Involuntary context switches of both processes: mostly a partner woken by a write
    #: preempting the writer before it blocks in its read (part of the workload), plus any
    #: neighbour that took the storm's CPU (each costs the storm a switch of its own).
    preempted: int
    #: The run time of the kernel's softirq threads on CPUs 0 and 1 meanwhile: network receive
    #: work the kernel deferred out of the storm's own context (this kernel charges softirqs
    #: run at a bottom-half enable to the task that ran them, the rest to these threads).
    softirqd_s: float

    @property
    def total_s(self) -> float:
        return self.user_s + self.system_s + self.softirqd_s

    def ns(self, seconds: float) -> float:
        return seconds / self.operations * 1e9


def softirqd_s() -> float:
    """The run time so far of ``ksoftirqd/0`` and ``ksoftirqd/1`` (schedstat), seconds."""
    total = 0
    for task in Path("/proc").glob("[0-9]*"):
        try:
            if (task / "comm").read_text().strip() in ("ksoftirqd/0", "ksoftirqd/1"):
                total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            continue  # gone meanwhile, or not ours to read
    return total / 1e9


def run_storm(storm_bin: Path, seconds: float) -> Storm:
    before = softirqd_s()
    out = subprocess.run(
        [str(storm_bin), str(seconds)], capture_output=True, text=True, check=True
    ).stdout.split()
    deferred = softirqd_s() - before
    return Storm(int(out[0]), float(out[1]), float(out[2]), float(out[3]), int(out[4]), deferred)


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


def empty_switch_storm(storm_bin: Path, seconds: float, stats: bool) -> Storm:
    prog, error = load_program(EMPTY_PROGRAM, BPF_PROG_TYPE_RAW_TRACEPOINT, "empty_switch", b"GPL")
    if prog < 0:
        sys.exit(f"loading the empty program failed: {error}")
    link = open_raw_tracepoint("sched_switch", prog)
    stats_fd = enable_bpf_stats() if stats else None
    try:
        return run_storm(storm_bin, seconds)
    finally:
        if stats_fd is not None:
            os.close(stats_fd)
        os.close(link)
        os.close(prog)


def measure(variant: str, storm_bin: Path, seconds: float) -> Storm:
    if variant.startswith("empty-switch"):
        return empty_switch_storm(storm_bin, seconds, stats=variant.endswith("+stats"))
    if variant == "budget":
        return budget_storm(storm_bin, seconds)
    overrides = overrides_for(variant)
    if overrides is None:
        return run_storm(storm_bin, seconds)
    with Daemon(overrides, settle_s=3.0):
        return run_storm(storm_bin, seconds)


def budget_storm(storm_bin: Path, seconds: float) -> Storm:
    """The storm beside the agent at every default, the budget included, once it acted.

    A first storm of the same kind runs until the budget logs its first step (past its
    warm-up), for at most `PRIME_LIMIT_S`, and the measured one starts as that one ends: a
    step is undone only after 30 s of calm, so the measured storm runs with what the budget
    does during a storm. A storm that brings no step in that time is measured all the same
    (the budget found nothing to reduce) and says so.
    """
    with Daemon([], settle_s=WARMUP_S + 3.0, log_level="info") as daemon:
        prime = subprocess.Popen([str(storm_bin), str(PRIME_LIMIT_S)], stdout=subprocess.DEVNULL)
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
        storm = run_storm(storm_bin, seconds)
        steps = sorted(set(taken()))
        print(
            f"    budget: steps {', '.join(steps) or f'none in {PRIME_LIMIT_S:.0f} s'}",
            file=sys.stderr,
            flush=True,
        )
        return storm


NAMES = {
    "off": "off",
    "on": "on (defaults, budget off)",
    "budget": "on (every default, the budget acting)",
    "empty-switch": "no agent, an empty program on sched_switch",
    "empty-switch+stats": "no agent, an empty program on sched_switch, run statistics on",
}
WHERE = {
    "pipe": "both processes on CPU 0",
    "udp": "bursts of 64: sender on CPU 0, receiver on CPU 1",
    "pingpong": "client on CPU 0, echo server on CPU 1",
}


def table(storm: str, variants: list[str], results: dict[str, list[Storm]]) -> list[str]:
    def med(variant: str, which: str) -> float:
        def seconds(s: Storm) -> float:
            return {"user": s.user_s, "system": s.system_s, "softirqd": s.softirqd_s}.get(
                which, s.total_s
            )

        return statistics.median(s.ns(seconds(s)) for s in results[variant])

    off = med("off", "total")
    on = med("on", "total")
    op = OPERATION[storm]
    lines = [
        f"**{storm}** ({WHERE[storm]}):",
        "",
        f"| agent | storm CPU per {op} | user | system | softirq threads | vs off "
        f"| part's share of on-off | {op}s/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant in variants:
        total = med(variant, "total")
        rate = statistics.median(s.operations / s.wall_s for s in results[variant])
        share = ""
        if variant.startswith("-") and on > off:
            share = f"{(on - total) / (on - off) * 100:.0f} %"
        vs = "" if variant == "off" else f"{total - off:+.0f} ns ({(total / off - 1) * 100:+.1f} %)"
        name = NAMES.get(variant, f"on, {variant[1:]} off")
        lines.append(
            f"| {name} | {total:.0f} ns | {med(variant, 'user'):.0f} ns | "
            f"{med(variant, 'system'):.0f} ns | {med(variant, 'softirqd'):.0f} ns | {vs} | "
            f"{share} | {rate:,.0f} |"
        )
    return lines


def report(
    storms: list[str], rounds: int, seconds: float, parts: list[str], empty_switch: bool
) -> str:
    variants = ["off", "on", "budget", *(f"-{p}" for p in parts)]
    if empty_switch:
        variants += ["empty-switch", "empty-switch+stats"]
    runs = [(storm, variant) for storm in storms for variant in variants]
    results: dict[tuple[str, str], list[Storm]] = {run: [] for run in runs}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        bins = {}
        for storm in storms:
            bins[storm] = Path(tmp) / storm
            source = Path(tmp) / f"{storm}.c"
            source.write_text(STORM_C[storm])
            subprocess.run(["gcc", "-O2", "-o", str(bins[storm]), str(source)], check=True)
        for r in range(rounds):
            for storm, variant in runs[r % len(runs) :] + runs[: r % len(runs)]:
                run = measure(variant, bins[storm], seconds)
                results[storm, variant].append(run)
                print(
                    f"  round {r + 1} {storm:8} {variant:9} {run.operations / run.wall_s:,.0f} "
                    f"{OPERATION[storm]}s/s, {run.ns(run.total_s):.0f} ns CPU each (user "
                    f"{run.ns(run.user_s):.0f}, system {run.ns(run.system_s):.0f}, softirq "
                    f"threads {run.ns(run.softirqd_s):.0f}), preempted {run.preempted:,}",
                    file=sys.stderr,
                    flush=True,
                )
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{rounds} interleaved rounds of {seconds:.0f} s storms, load average {load0:.2f} at "
        f"the start (1 min) and {os.getloadavg()[0]:.2f} at the end.",
    ]
    for storm in storms:
        by_variant = {variant: results[storm, variant] for variant in variants}
        lines += ["", *table(storm, variants, by_variant)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=6.0, help="seconds of each storm")
    parser.add_argument("--storms", default="pipe", help=f"of {','.join(STORM_C)}")
    parser.add_argument("--parts", default=",".join(PARTS), help="collectors to turn off in turn")
    parser.add_argument(
        "--empty-switch", action="store_true", help="also an empty program on sched_switch"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    storms = [s for s in args.storms.split(",") if s]
    unknown = sorted(set(storms) - set(STORM_C))
    if unknown or not storms:
        sys.exit(
            f"--storms: unknown {', '.join(unknown) or 'none given'}; choose from "
            f"{', '.join(STORM_C)}"
        )
    parts = [p for p in args.parts.split(",") if p]
    print(report(storms, args.rounds, args.duration, parts, args.empty_switch))


if __name__ == "__main__":
    main()
