"""Storms against the overhead budget: what the workload loses, what the agent costs.

Run as root, as one command: ``python tests/bench/bench_budget.py [--rounds 3]
[--duration 14] [--storms udp,pingpong,churn,pipe] [--traced] [--baseline main]
[--write-doc docs/performance.md]``.

Four storms over loopback, each a child process that prints its progress four times a
second (so rates can be taken over any part of it):

* ``udp``: one thread sending 64-byte UDP datagrams as fast as it can (CPU 0; a receiver
  drains them on CPU 1): every send and receive runs the per-call socket programs.
* ``pingpong``: 64-byte TCP request/response round trips (client CPU 0, server CPU 1).
* ``churn``: threads started and joined in a loop, thousands of exits a second.
* ``pipe``: two processes ping-ponging one byte over pipes on CPU 0 (``perf bench sched
  pipe``'s workload, compiled here so it reports its progress): two context switches and
  two wakeups per round trip.

Each storm runs under three kinds of agent, interleaved (the order rotates every round):
**off** (no agent), **on** (``bpfdyno serve`` at its defaults but ``[budget] enabled =
false``: it measures its cost and reduces nothing, as before the budget) and **budget**
(every default: a budget of 2 % of one CPU). An agent is started for its kind's storms and
waits out the budget's warm-up first; between two storms the budget's agent waits until
every step it took is undone (``[budget] restore_after_s``, 30 s by default), so each storm
starts from an agent at rest. Reading the agent's BPF share at a storm's end is a read like
any other: the agent keeps its normal cadence for ``HOLD_S`` (30 s) after it. So before its
next storm every agent waits until that hold is over, and each storm finds the agent at the
cadence it has while nobody reads (before 2026-11-29 only each agent's first storm did: the
later ones ran beside an agent collecting at the readers' cadence).

Reported per storm and kind (medians over the rounds):

* the workload's rate over the whole storm and over its steady part (from 6 s on: after
  the budget acted), and the slowdown against **off**;
* the agent's cost in the steady part: its threads' CPU time (``/proc/PID/task/*/schedstat``)
  and its BPF programs' cost as it measures it itself (``agent_cost_ratio{part="bpf"}``:
  their run time, the statistics' own cost left out, and the kernel's entry into them at
  every run; the median of its windows in the steady part), against the budget;
* how long the budget took to take its first step after the storm began, and to undo its
  last after the storm ended (from its log lines), and which steps it took (what was lost).

``--traced`` adds the same storms while a trace records every kernel track of the storm's
process (for ``pipe``, of an idle process beside it: every context switch then pays the
capture's filter): the trace is requested before the storm and completed after it.

What each BPF program costs per event, independent of the machine's load (``--costs``, on
by default): after the timed rounds, one more agent of kind **on** runs each storm once with
the kernel's run statistics on for the whole storm (``BPF_ENABLE_STATS``); each of its
programs' ``run_cnt`` / ``run_time_ns`` is read from the agent's own file descriptors
(``/proc/PID/fdinfo``: other agents on the machine load programs of the same names) before
and after. Reported per storm and program: runs per operation, ns per run (less what the
statistics add to a run, an empty program's time, measured once) and ns per operation.
These rounds are not timed: the statistics' clock reads would slow the workload.
``--baseline REF`` runs the costs phase first with the agent of a git ref (e.g. ``main``),
then with this checkout's: the per-program costs before and after a change, from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import grpc
from daemon_runner import Daemon, baseline_tree
from doc_blocks import write_results

from bpfdyno.core.config import BudgetSection
from bpfdyno.core.demand import HOLD_S
from bpfdyno.ebpf.runstats import calibrate_stats_overhead, enable_bpf_stats
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.sources.budget.controller import WARMUP_S

SECTION = "## The overhead budget under storms"
#: The default budget, which the "budget" kind runs with (a share of one CPU).
BUDGET = BudgetSection().cpu_ratio
KINDS = ("off", "on", "budget")
#: The part of a storm after which the budget has acted (the steady part).
STEADY_FROM_S = 6.0

#: Sends a Kineto poll (as libkineto does) every 0.5 s from a thread, so the storm's own
#: process is a registered trainer that can be traced. Prepended to the Python storms.
KINETO = r"""
import os, socket, struct, threading, uuid
def _kineto(socket_dir):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(os.path.join(socket_dir, f"dynoconfigclient{uuid.uuid4()}"))
    s.settimeout(0.5)
    body = struct.pack("<iiqi", 3, 1, 0, os.getpid())
    msg = struct.pack("<Q32s", len(body), b"req") + body
    while True:
        try:
            s.sendto(msg, os.path.join(socket_dir, "dynolog"))
            s.recv(300000)
        except OSError:
            pass
        threading.Event().wait(0.5)
if os.environ.get("BENCH_KINETO_DIR"):
    threading.Thread(target=_kineto, args=(os.environ["BENCH_KINETO_DIR"],), daemon=True).start()
"""

#: Progress lines: "<monotonic s> <operations so far>" every 0.25 s, for ``argv[1]`` seconds.
PROGRESS = r"""
import sys, time
_dur = float(sys.argv[1])
_t0 = time.monotonic()
_next = _t0
def progress(n):
    global _next
    now = time.monotonic()
    if now >= _next:
        print(f"{now} {n}", flush=True)
        _next = now + 0.25
    return now - _t0 < _dur
"""

UDP = r"""
import os, socket
os.sched_setaffinity(0, {0})
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.connect(("127.0.0.1", int(sys.argv[2])))
msg, send, n = b"x" * 64, tx.send, 0
while progress(n):
    for _ in range(200):
        send(msg)
    n += 200
"""
UDP_SINK = r"""
import os, socket, sys
os.sched_setaffinity(0, {1})
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
rx.bind(("127.0.0.1", 0))
print(rx.getsockname()[1], flush=True)
while rx.recv(2048):
    pass
"""
PING = r"""
import os, socket
os.sched_setaffinity(0, {0})
c = socket.create_connection(("127.0.0.1", int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
msg, n = b"p" * 64, 0
while progress(n):
    for _ in range(100):
        c.sendall(msg)
        got = 0
        while got < 64:
            got += len(c.recv(64 - got))
    n += 100
"""
PONG = r"""
import os, socket
os.sched_setaffinity(0, {1})
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while True:
    data = conn.recv(64)
    if not data:
        break
    conn.sendall(data)
"""
CHURN = r"""
import threading
def work():
    pass
n = 0
while progress(n):
    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n += 16
"""
IDLE = r"""
while progress(0):
    time.sleep(0.25)
"""
PIPE_C = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(int argc, char **argv) {
    double dur = atof(argv[1]), t0 = now(), next = t0;
    int a[2], b[2];
    char c = 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    sched_setaffinity(0, sizeof set, &set);
    if (pipe(a) || pipe(b)) return 1;
    if (fork() == 0) {
        close(a[1]);
        close(b[0]);
        for (;;) {
            if (read(a[0], &c, 1) != 1) return 0;
            if (write(b[1], &c, 1) != 1) return 0;
        }
    }
    close(a[0]);
    close(b[1]);
    for (long n = 0;; n += 1000) {
        double t = now();
        if (t >= next) { printf("%f %ld\n", t, n); fflush(stdout); next = t + 0.25; }
        if (t - t0 >= dur) break;
        for (int i = 0; i < 1000; i++) {
            if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1) return 1;
        }
    }
    close(a[1]);
    return 0;
}
"""
STORMS = ("udp", "pingpong", "churn", "pipe")
UNITS = {"udp": "sends/s", "pingpong": "round trips/s", "churn": "thread exits/s",
         "pipe": "round trips/s"}  # fmt: skip


@dataclass
class Run:
    """One storm under one kind of agent."""

    rate: float  # operations per second over the whole storm
    steady_rate: float  # ... from STEADY_FROM_S on
    agent_cpu: float = float("nan")  # share of one core, steady part
    agent_bpf: float = float("nan")  # share of one core, as the agent measured its programs
    degrade_s: float = float("nan")  # storm start -> first step taken
    restore_s: float = float("nan")  # storm end -> last step undone
    steps: list[str] = field(default_factory=list)


def python_child(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


@contextmanager
def peer(storm: str) -> Iterator[list[str]]:
    """The storm's other end (UDP receiver, TCP echo server); yields its extra arguments."""
    code = {"udp": UDP_SINK, "pingpong": PONG}.get(storm)
    if code is None:
        yield []
        return
    p = python_child(code)
    assert p.stdout is not None
    try:
        yield [p.stdout.readline().strip()]
    finally:
        p.kill()
        p.wait()


def start_storm(
    storm: str, seconds: float, extra: list[str], pipe_bin: Path, env: dict[str, str]
) -> subprocess.Popen[str]:
    if storm == "pipe":
        return subprocess.Popen([str(pipe_bin), str(seconds)], stdout=subprocess.PIPE, text=True)
    code = {"udp": UDP, "pingpong": PING, "churn": CHURN}[storm]
    return python_child(KINETO + PROGRESS + code, str(seconds), *extra, env=env)


def rates(lines: list[str]) -> tuple[float, float, float]:
    """(start time, rate over everything, rate from STEADY_FROM_S on) of progress lines."""
    points = [(float(t), int(n)) for t, n in (line.split() for line in lines if line.strip())]
    (t0, n0), (t1, n1) = points[0], points[-1]
    steady = [(t, n) for t, n in points if t - t0 >= STEADY_FROM_S] or points[-2:]
    (s0, m0), (s1, m1) = steady[0], steady[-1]
    return t0, (n1 - n0) / (t1 - t0), (m1 - m0) / (s1 - s0) if s1 > s0 else float("nan")


#: When the benchmark last read each agent (by pid), monotonic: its hold of the normal
#: cadence must be over before that agent's next storm.
_LAST_READ: dict[int, float] = {}


def wait_for_no_reader(daemon: Daemon) -> None:
    """Until the agent has gone back to the cadence it keeps while nobody reads."""
    read = _LAST_READ.get(daemon.pid)
    if read is not None:
        time.sleep(max(0.0, read + HOLD_S + 1.0 - time.monotonic()))


def agent_bpf_share(daemon: Daemon, since_unix_s: float) -> float:
    """The agent's BPF cost as it measures it (its run time and the kernel's entry into its
    programs), the median of its windows since ``since_unix_s``: NaN when none came (a read:
    it keeps the normal cadence)."""
    _LAST_READ[daemon.pid] = time.monotonic()
    sock = daemon.sock
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        snap = pb_grpc.AgentStub(ch).GetMetrics(
            pb.GetMetricsRequest(names=["agent_cost_ratio"]), timeout=10
        )
    for s in snap.series:
        if {lab.name: lab.value for lab in s.labels}.get("part") == "bpf":
            return median([p.value for p in s.points if p.unix_seconds >= since_unix_s])
    return float("nan")


#: A budget log line: every step taken and undone is at INFO (one WARNING per storm, its first
#: step's reason again, which `_TAKEN` does not match).
_LOG_TIME = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (?:INFO|WARNING) bpfdyno\.sources\.budget"
)
_TAKEN = re.compile(r"budget: ([a-z_.]+): ")
_UNDONE = re.compile(r"budget: ([a-z_.]+) undone")


def budget_log(daemon: Daemon, since: float) -> list[tuple[float, str, str]]:
    """(wall time, "taken" or "undone", step) of the budget's log lines since ``since``."""
    out = []
    for _, line in list(daemon.log):
        m = _LOG_TIME.match(line)
        if not m:
            continue
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if t < since:
            continue
        undone, taken = _UNDONE.search(line), _TAKEN.search(line)
        if undone:
            out.append((t, "undone", undone.group(1)))
        elif taken:
            out.append((t, "taken", taken.group(1)))
    return out


def held(daemon: Daemon) -> set[str]:
    steps: set[str] = set()
    for _, what, step in budget_log(daemon, 0):
        (steps.add if what == "taken" else steps.discard)(step)
    return steps


def request_trace(daemon: Daemon, pid: int, workdir: Path) -> str:
    """Trace every kernel track of ``pid`` (already polling); returns the file it writes."""
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run(
            [sys.executable, "-m", "bpfdyno", "gputrace", "--socket", daemon.sock, "--pids",
             str(pid), "--duration-ms", "30000", "--log-file", str(workdir / "t.json"), "--json"],
            capture_output=True, text=True,
        )  # fmt: skip
        if out.returncode == 0:
            answer = json.loads(out.stdout)
            triggered = answer.get("request", answer).get("triggered", [])
            if triggered:
                return str(triggered[0]["output_path"])
        if time.monotonic() > deadline:
            raise RuntimeError(f"could not trace pid {pid}: {out.stdout} {out.stderr}")
        time.sleep(0.3)


def run_storm(
    storm: str, kind: str, daemon: Daemon | None, seconds: float, pipe_bin: Path,
    with_trace: bool, workdir: Path,
) -> Run:  # fmt: skip
    env: dict[str, str] = {}
    trace_file = ""
    bystander = None
    if daemon is not None:
        wait_for_no_reader(daemon)
    if with_trace and daemon is not None:
        env = {"BENCH_KINETO_DIR": daemon.kineto_dir}
        if storm == "pipe":
            bystander = python_child(KINETO + PROGRESS + IDLE, "3600", env=env)
    with peer(storm) as extra:
        began = time.time()
        proc = start_storm(
            storm, seconds + (1.5 if with_trace and daemon else 0), extra, pipe_bin, env
        )
        assert proc.stdout is not None
        lines = [proc.stdout.readline()]
        if with_trace and daemon is not None:
            target = bystander.pid if bystander is not None else proc.pid
            time.sleep(1.0)  # its first polls reach the agent
            trace_file = request_trace(daemon, target, workdir)
        cpu: list[tuple[float, float]] = []
        steady_unix = 0.0
        while True:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            t0 = float(lines[0].split()[0])
            if daemon is not None and not cpu and float(line.split()[0]) - t0 >= STEADY_FROM_S:
                cpu.append((time.monotonic(), daemon.cpu_seconds()))
                steady_unix = time.time()
        if daemon is not None and cpu:
            cpu.append((time.monotonic(), daemon.cpu_seconds()))
        bpf = agent_bpf_share(daemon, steady_unix) if daemon is not None and cpu else float("nan")
        proc.wait()
        ended = time.time()
    if bystander is not None:
        bystander.kill()
        bystander.wait()
    if trace_file:
        Path(trace_file).write_text('{"traceEvents": []}')  # as Kineto would: the trace ends
    _, rate, steady = rates(lines)
    run = Run(rate, steady, agent_bpf=bpf)
    if len(cpu) == 2:
        run.agent_cpu = (cpu[1][1] - cpu[0][1]) / (cpu[1][0] - cpu[0][0])
    if kind == "budget" and daemon is not None:
        deadline = time.monotonic() + 240
        while held(daemon) and time.monotonic() < deadline:
            time.sleep(1.0)
        log = budget_log(daemon, began)
        taken = [(t, s) for t, w, s in log if w == "taken"]
        undone = [t for t, w, _ in log if w == "undone"]
        run.steps = sorted({s for _, s in taken})
        if taken:
            run.degrade_s = taken[0][0] - began
        if undone and not held(daemon):
            run.restore_s = max(undone) - ended
    else:
        time.sleep(3.0)
    return run


def agent_programs(pid: int) -> dict[int, tuple[int, int]]:
    """Program id -> (run_cnt, run_time_ns) of every BPF program ``pid`` holds a fd of."""
    out: dict[int, tuple[int, int]] = {}
    for info in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(
                line.split(":", 1) for line in info.read_text().splitlines() if ":" in line
            )
        except OSError:
            continue  # closed meanwhile
        if "prog_type" in fields:  # a program's fd (a link's names its program's id too)
            out[int(fields["prog_id"])] = (
                int(fields.get("run_cnt", "0")),
                int(fields.get("run_time_ns", "0")),
            )
    return out


def program_names() -> dict[int, str]:
    shown = json.loads(
        subprocess.run(
            ["bpftool", "prog", "show", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    return {int(p["id"]): str(p.get("name", "?")) for p in shown}


@dataclass
class ProgramCost:
    """One program's cost in one storm."""

    name: str
    runs_per_op: float
    ns_per_run: float  # less the run statistics' own time per run

    @property
    def ns_per_op(self) -> float:
        return self.runs_per_op * self.ns_per_run


def storm_costs(
    storm: str, daemon: Daemon, seconds: float, pipe_bin: Path, stats_ns: float
) -> tuple[float, list[ProgramCost]]:
    """(operations per second, each program that ran) of one storm with run statistics on."""
    with peer(storm) as extra:
        before = agent_programs(daemon.pid)
        proc = start_storm(storm, seconds, extra, pipe_bin, {})
        assert proc.stdout is not None
        lines = proc.stdout.read().splitlines()
        proc.wait()
        after = agent_programs(daemon.pid)
    points = [line.split() for line in lines if line.strip()]
    ops = int(points[-1][1]) - int(points[0][1])
    rate = ops / (float(points[-1][0]) - float(points[0][0]))
    names = program_names()
    costs = []
    for prog, (cnt, ns) in after.items():
        cnt0, ns0 = before.get(prog, (0, 0))
        if cnt > cnt0 and ops > 0:
            costs.append(
                ProgramCost(
                    names.get(prog, str(prog)),
                    (cnt - cnt0) / ops,
                    max(0.0, (ns - ns0) / (cnt - cnt0) - stats_ns),
                )
            )
    costs.sort(key=lambda c: -c.ns_per_op)
    return rate, costs


def costs_report(
    storms: list[str], seconds: float, pipe_bin: Path, agents: list[tuple[str, Path | None]]
) -> str:
    """The per-program table: for each of ``agents`` (label, tree of another version or
    None for this checkout) in turn, one agent of kind "on", each storm once, statistics
    on."""
    stats_ns = calibrate_stats_overhead()
    load0 = os.getloadavg()[0]
    lines = [
        "| agent | storm | rate (stats on) | program | runs per op | ns per run | ns per op |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, tree in agents:
        with Daemon(["budget.enabled=false"], settle_s=WARMUP_S + 6, tree=tree) as daemon:
            fd = enable_bpf_stats()
            try:
                for storm in storms:
                    rate, costs = storm_costs(storm, daemon, seconds, pipe_bin, stats_ns)
                    total = sum(c.ns_per_op for c in costs)
                    lines.append(
                        f"| {label} | {storm} | {rate:,.0f} {UNITS[storm]} | all | | | "
                        f"{total:,.0f} |"
                    )
                    for c in costs:
                        if c.ns_per_op >= 1.0:
                            lines.append(
                                f"| {label} | {storm} | | {c.name} | {c.runs_per_op:.3f} | "
                                f"{c.ns_per_run:.0f} | {c.ns_per_op:.0f} |"
                            )
                    print(f"  costs {label} {storm}: {rate:,.0f} {UNITS[storm]}, BPF "
                          f"{total:,.0f} ns/op "
                          + ", ".join(f"{c.name} {c.ns_per_op:.0f}" for c in costs[:6]),
                          flush=True)  # fmt: skip
            finally:
                os.close(fd)
    head = (
        f"Per-program cost, measured {time.strftime('%Y-%m-%d')} on {os.uname().release}: "
        f"per agent, one agent of kind on, each storm {seconds:.0f} s with the kernel's run "
        f"statistics on (their own {stats_ns:.0f} ns per run subtracted), load average "
        f"{load0:.2f} at the start and {os.getloadavg()[0]:.2f} at the end. Programs under "
        "1 ns per operation left out."
    )
    return "\n".join([head, "", *lines])


def median(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]
    return statistics.median(xs) if xs else float("nan")


def report(args: argparse.Namespace) -> str:
    storms = [s for s in args.storms.split(",") if s]
    variants = [(s, False) for s in storms] + ([(s, True) for s in storms] if args.traced else [])
    results: dict[tuple[str, bool, str], list[Run]] = {}
    load0 = os.getloadavg()[0]
    costs = ""
    with tempfile.TemporaryDirectory(prefix="bd-budget-") as tmp:
        pipe_bin = Path(tmp) / "pipe"
        (Path(tmp) / "pipe.c").write_text(PIPE_C)
        subprocess.run(["gcc", "-O2", "-o", str(pipe_bin), str(Path(tmp) / "pipe.c")], check=True)
        if args.costs:
            agents: list[tuple[str, Path | None]] = [("this", None)]
            if args.baseline:
                agents.insert(0, (args.baseline, baseline_tree(args.baseline, Path(tmp) / "base")))
            costs = costs_report(storms, min(args.duration, 6.0), pipe_bin, agents)
        for r in range(args.rounds):
            order = KINDS[r % 3 :] + KINDS[: r % 3]
            for kind in order:
                overrides = {"off": None, "on": ["budget.enabled=false"], "budget": []}[kind]
                with daemon_for(overrides) as daemon:
                    for storm, with_trace in variants:
                        if with_trace and daemon is None:
                            continue  # no agent, no trace: the untraced rounds are the baseline
                        run = run_storm(storm, kind, daemon, args.duration, pipe_bin,
                                        with_trace, Path(tmp))  # fmt: skip
                        results.setdefault((storm, with_trace, kind), []).append(run)
                        label = f"{storm}{' traced' if with_trace else ''}"
                        print(f"  round {r + 1} {kind:6s} {label}: "
                              f"{run.steady_rate:,.0f} {UNITS[storm]} steady, agent "
                              f"{run.agent_cpu * 100:.2f} % + BPF {run.agent_bpf * 100:.2f} %, "
                              f"steps {run.steps} in {run.degrade_s:.1f} s, undone "
                              f"{run.restore_s:.1f} s after", flush=True)  # fmt: skip
    table = render(args, variants, results, load0) if args.rounds else ""
    return "\n\n".join(part for part in (table, costs) if part)


@contextmanager
def daemon_for(overrides: list[str] | None) -> Iterator[Daemon | None]:
    if overrides is None:
        yield None
        return
    # At INFO, as `serve` logs by default: the budget logs its steps and undos there.
    with Daemon(overrides, settle_s=WARMUP_S + 6, log_level="info") as daemon:
        yield daemon


def render(
    args: argparse.Namespace,
    variants: list[tuple[str, bool]],
    results: dict[tuple[str, bool, str], list[Run]],
    load0: float,
) -> str:
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{args.rounds} interleaved rounds of {args.duration:.0f} s storms, load average "
        f"{load0:.2f} at the start (1 min) and {os.getloadavg()[0]:.2f} at the end; budget "
        f"{BUDGET * 100:g} % of one CPU; steady = from {STEADY_FROM_S:.0f} s into the storm.",
        "",
        "| storm | agent | rate, whole storm | rate, steady | slowdown (steady) | agent threads "
        "| agent BPF | agent total vs budget | first step after | undone after | steps taken |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for storm, with_trace in variants:
        name = f"{storm} ({UNITS[storm]})" + (", traced" if with_trace else "")
        off = results.get((storm, False, "off"), [])
        base = median([r.steady_rate for r in off])
        for kind in KINDS:
            runs = results.get((storm, with_trace, kind), [])
            if not runs:
                continue
            steady = median([r.steady_rate for r in runs])
            cells = [name, kind, f"{median([r.rate for r in runs]):,.0f}", f"{steady:,.0f}"]
            if kind == "off":
                cells += [""] * 7
            else:
                slow = (base / steady - 1) * 100 if steady > 0 else float("nan")
                cpu = median([r.agent_cpu for r in runs])
                bpf = median([r.agent_bpf for r in runs])
                cells += [
                    f"{slow:+.1f} %",
                    f"{cpu * 100:.2f} %",
                    f"{bpf * 100:.2f} %",
                    f"{(cpu + bpf) * 100:.2f} % ({(cpu + bpf) / BUDGET:.1f}x)",
                ]
                if kind == "budget":
                    steps = sorted({step for r in runs for step in r.steps})
                    cells += [
                        f"{median([r.degrade_s for r in runs]):.1f} s",
                        f"{median([r.restore_s for r in runs]):.1f} s",
                        ", ".join(steps) or "none",
                    ]
                else:
                    cells += ["", "", ""]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=14.0, help="seconds of each storm")
    parser.add_argument("--storms", default=",".join(STORMS))
    parser.add_argument("--traced", action="store_true", help="also the storms during a trace")
    parser.add_argument("--no-costs", dest="costs", action="store_false",
                        help="leave out the per-program cost per event")  # fmt: skip
    parser.add_argument(
        "--baseline", metavar="GIT_REF", help="costs phase: also the agent of this git ref, first"
    )
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    results = report(args)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_budget", results)


if __name__ == "__main__":
    main()
