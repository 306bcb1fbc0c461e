"""What the whole agent costs a scheduler-heavy workload, against the tool a user would pick.

Run as root, as one command: ``python tests/bench/bench_sched_overhead.py [--rounds 6]
[--write-doc docs/performance.md]``.

1. Context-switch microbenchmark: ``taskset -c 0 perf bench sched pipe -l 200000`` (two
   processes ping-pong over a pipe on one CPU: about two context switches and two wakeups
   per op, the worst case for scheduler probes), in interleaved rounds of three kinds:
   ``off`` (nothing loaded), ``agent`` (``bpfdyno serve`` at its defaults, every default
   collector, started before the round and stopped after it) and ``runqlat`` (the anchor:
   bcc's runqlat algorithm on raw tracepoints -- wakeup stores a timestamp in a hash, switch
   looks it up, adds to a log2 histogram, deletes -- the cheapest single-purpose bcc tool
   that measures one of the things the agent measures). The order of the kinds rotates every
   round so drift of the shared machine hits all alike. Reported: median ops/s per kind and
   the slowdown of the medians (``off / kind - 1``), and the same for the CPU time the
   benchmark's tasks used per op (steadier on a shared machine: it leaves out the time other
   processes held CPU 0). ``--baseline REF`` adds rounds of the agent of a git ref (e.g.
   ``main``: before and after in one run); ``--variant NAME='k=v k=v'`` adds rounds
   of the agent with config overrides (e.g. one collector off), to find what costs what.
2. ns per event of every BPF program of the agent and of the anchor over one pipe run, from
   the kernel's run statistics (``BPF_ENABLE_STATS``; they add ~20 ns per run themselves,
   included).
3. A PyTorch CPU training loop (one thread on CPU 0, MLP 512-1024-10, batch 64): median step
   time per round, ``off`` and ``agent`` interleaved.

Before each round the benchmark lists BPF tracing programs that belong to neither the agent
nor the benchmark (another test suite on a shared machine); they are reported with the
results.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from daemon_runner import (
    Daemon,
    baseline_tree,
    bpf_programs,
    foreign_scheduler_programs,
    program_counters,
)
from doc_blocks import write_results

from bpfdyno.ebpf.compiler import compile_bpf
from bpfdyno.ebpf.kheaders import ensure_headers
from bpfdyno.ebpf.runstats import enable_bpf_stats

PIPE = ["taskset", "-c", "0", "perf", "bench", "sched", "pipe"]
T = TypeVar("T")
SECTION = "## Kernel telemetry overhead"

#: bcc's runqlat (tools/runqlat.py, raw tracepoint variant, default microsecond histogram),
#: with its kernel struct reads written against the BTF header tree.
RUNQLAT = r"""
#include <linux/sched.h>
BPF_HASH(start, u32);
BPF_HISTOGRAM(dist);

static int trace_enqueue(u32 tgid, u32 pid)
{
    if (pid == 0)
        return 0;
    u64 ts = bpf_ktime_get_ns();
    start.update(&pid, &ts);
    return 0;
}

RAW_TRACEPOINT_PROBE(sched_wakeup)
{
    struct task_struct *p = (struct task_struct *)ctx->args[0];
    u32 tgid = 0, pid = 0;
    bpf_probe_read_kernel(&tgid, sizeof(tgid), &p->tgid);
    bpf_probe_read_kernel(&pid, sizeof(pid), &p->pid);
    return trace_enqueue(tgid, pid);
}

RAW_TRACEPOINT_PROBE(sched_wakeup_new)
{
    struct task_struct *p = (struct task_struct *)ctx->args[0];
    u32 tgid = 0, pid = 0;
    bpf_probe_read_kernel(&tgid, sizeof(tgid), &p->tgid);
    bpf_probe_read_kernel(&pid, sizeof(pid), &p->pid);
    return trace_enqueue(tgid, pid);
}

RAW_TRACEPOINT_PROBE(sched_switch)
{
    struct task_struct *prev = (struct task_struct *)ctx->args[1];
    struct task_struct *next = (struct task_struct *)ctx->args[2];
    u32 tgid = 0, pid = 0;
    unsigned int state = 0;
    bpf_probe_read_kernel(&state, sizeof(state), &prev->__state);
    bpf_probe_read_kernel(&pid, sizeof(pid), &prev->pid);
    if (state == TASK_RUNNING) {
        bpf_probe_read_kernel(&tgid, sizeof(tgid), &prev->tgid);
        trace_enqueue(tgid, pid);
    }
    bpf_probe_read_kernel(&pid, sizeof(pid), &next->pid);
    u64 *tsp = start.lookup(&pid);
    if (tsp == 0)
        return 0;
    u64 delta = bpf_ktime_get_ns() - *tsp;
    delta /= 1000;
    dist.atomic_increment(bpf_log2l(delta));
    start.delete(&pid);
    return 0;
}
"""

TRAIN = """
import statistics, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
for _ in range(30):
    step()
times = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(statistics.median(times) * 1e3)
"""


def pipe_run(loops: int) -> tuple[float, float]:
    """One pipe run: (ops per second of wall time, CPU ns per op of the benchmark's tasks).

    The second is the user + system time the ping-pong processes used per op, so it does
    not count the time other processes on a shared machine held CPU 0; the probes' work on
    each switch runs in the switching task and is in it.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [*PIPE, "-l", str(loops)], capture_output=True, text=True, check=True
    ).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    m = re.search(r"(\d+) ops/sec", out)
    if m is None:
        raise RuntimeError(f"unexpected perf output: {out!r}")
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(m.group(1)), cpu_s * 1e9 / loops


def train_step_ms(steps: int) -> float:
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", TRAIN, str(steps)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip())


@contextmanager
def runqlat() -> Iterator[int]:
    """The anchor's programs attached in this process (yields this pid, which holds them)."""
    bpf = compile_bpf("runqlat", RUNQLAT, [], ensure_headers("btf"))
    held = set(program_counters(os.getpid()))
    try:
        yield os.getpid()
    finally:
        bpf.cleanup()
        while held & {int(str(p["id"])) for p in bpf_programs()}:
            time.sleep(0.05)


class Kinds:
    """What a round of each kind runs under: nothing, the agent (+ variants), the anchor."""

    def __init__(self, variants: dict[str, list[str]], baseline: Path | None = None) -> None:
        self.variants = variants
        self.baseline = baseline
        extra = ("baseline",) if baseline is not None else ()
        self.names = ("off", "agent", "runqlat", *extra, *variants)
        self.foreign: set[str] = set()
        self.agent_collectors: dict[str, str] = {}

    @contextmanager
    def under(self, kind: str) -> Iterator[int]:
        """Run the body with ``kind`` loaded; yields the pid holding its programs (0: none)."""
        if kind == "off":
            self._note_foreign(())
            yield 0
        elif kind == "runqlat":
            with runqlat() as pid:
                self._note_foreign((pid,))
                yield pid
        else:
            tree = self.baseline if kind == "baseline" else None
            with Daemon(self.variants.get(kind, []), tree=tree) as daemon:
                if kind == "agent":
                    self.agent_collectors = daemon.collectors
                self._note_foreign((daemon.pid,))
                yield daemon.pid

    def _note_foreign(self, own: tuple[int, ...]) -> None:
        self.foreign.update(foreign_scheduler_programs(own))


def interleaved(
    rounds: int, kinds: Kinds, names: tuple[str, ...], measure_one: Callable[[], T]
) -> dict[str, list[T]]:
    """Measure every kind once per round, rotating the order so drift hits all alike."""
    results: dict[str, list[T]] = {k: [] for k in names}
    for i in range(rounds):
        order = names[i % len(names) :] + names[: i % len(names)]
        for kind in order:
            with kinds.under(kind):
                results[kind].append(measure_one())
        line = " ".join(f"{k}={v[-1]}" for k, v in results.items())
        print(f"  round {i + 1}/{rounds}: {line}", flush=True)
    return results


def ns_per_event(kinds: Kinds, kind: str, loops: int) -> dict[str, tuple[float, float]]:
    """Program name -> (ns per run, runs per second) over one pipe run under ``kind``."""
    with kinds.under(kind) as pid:
        fd = enable_bpf_stats()
        try:
            before = _run_counters(pid)
            t0 = time.monotonic()
            bench = threading.Thread(target=pipe_run, args=(loops,))
            bench.start()
            bench.join()
            after, t1 = _run_counters(pid), time.monotonic()
        finally:
            os.close(fd)
    out = {}
    for name, (cnt1, ns1) in after.items():
        cnt0, ns0 = before.get(name, (0, 0))
        runs = cnt1 - cnt0
        out[name] = ((ns1 - ns0) / runs if runs else float("nan"), runs / (t1 - t0))
    return out


def _run_counters(pid: int) -> dict[str, tuple[int, int]]:
    """Program name -> cumulative (runs, run time ns) of the programs ``pid`` holds."""
    names = {int(str(p["id"])): str(p.get("name", "?")) for p in bpf_programs()}
    counters: dict[str, tuple[int, int]] = {}
    for prog_id, (cnt, ns) in program_counters(pid).items():
        name = names.get(prog_id, str(prog_id))
        c0, n0 = counters.get(name, (0, 0))
        counters[name] = (c0 + cnt, n0 + ns)
    return counters


def _slowdown(base: float, other: float) -> str:
    return f"{(base / other - 1) * 100:+.1f} %"


def torch_available() -> bool:
    return (
        subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    )


def report(args: argparse.Namespace, variants: dict[str, list[str]], baseline: Path | None) -> str:
    kinds = Kinds(variants, baseline)
    load = os.getloadavg()[0]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{args.rounds} interleaved rounds per comparison, load average {load:.2f} at the start."
    ]
    print("perf bench sched pipe:", flush=True)
    runs = interleaved(args.rounds, kinds, kinds.names, lambda: pipe_run(args.loops))
    ops = {k: [r[0] for r in v] for k, v in runs.items()}
    cpu = {k: [r[1] for r in v] for k, v in runs.items()}
    ops_med = {k: statistics.median(v) for k, v in ops.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    lines += [
        "",
        f"`perf bench sched pipe -l {args.loops}` on CPU 0: median ops/s (min-max of the rounds) "
        "and median CPU time of the benchmark's tasks per op:",
        "",
        "| kind | ops/s | slowdown | CPU ns/op | slowdown | target |",
        "|---|---|---|---|---|---|",
    ]
    targets = {"agent": "<= 5 % (moonshot <= 3 %)", "runqlat": "anchor"}
    for kind in kinds.names:
        lo, hi = min(ops[kind]), max(ops[kind])
        slow = "" if kind == "off" else _slowdown(ops_med["off"], ops_med[kind])
        cpu_slow = "" if kind == "off" else _slowdown(cpu_med[kind], cpu_med["off"])
        label = (
            kind
            if kind in ("off", "agent", "runqlat")
            else f"agent of `{args.baseline}`"
            if kind == "baseline"
            else f"agent, {' '.join(variants[kind])}"
        )
        lines.append(
            f"| {label} | {ops_med[kind]:,.0f} ({lo:,.0f}-{hi:,.0f}) | {slow} | "
            f"{cpu_med[kind]:,.0f} | {cpu_slow} | {targets.get(kind, '')} |"
        )
    if kinds.agent_collectors:
        states = ", ".join(f"{n} {s.lower()}" for n, s in sorted(kinds.agent_collectors.items()))
        lines += ["", f"Agent collectors in those rounds: {states}."]
    if not args.skip_train and torch_available():
        print("PyTorch training loop:", flush=True)
        train_runs = interleaved(
            args.rounds, kinds, ("off", "agent"), lambda: train_step_ms(args.steps)
        )
        train = {k: statistics.median(v) for k, v in train_runs.items()}
        lines += [
            "",
            f"PyTorch CPU training step (MLP, 1 thread on CPU 0), median of {args.steps} steps: "
            f"off {train['off']:.3f} ms, agent {train['agent']:.3f} ms, "
            f"**{(train['agent'] / train['off'] - 1) * 100:+.1f} %** (target <= 1 %).",
        ]
    print("BPF run statistics:", flush=True)
    lines += ["", "| program | ns/event | runs/s during the pipe run |", "|---|---|---|"]
    for kind in ("agent", "runqlat", *(["baseline"] if baseline is not None else [])):
        for name, (ns, rate) in sorted(ns_per_event(kinds, kind, args.loops).items()):
            shown = "-" if ns != ns else f"{ns:.0f}"
            lines.append(f"| {kind}: `{name}` | {shown} | {rate:,.0f} |")
    foreign = sorted(kinds.foreign)
    lines += [
        "",
        "Other BPF tracing programs loaded during the rounds (other test suites): "
        + (", ".join(foreign) if foreign else "none")
        + ".",
    ]
    return "\n".join(lines)


def parse_variants(items: list[str]) -> dict[str, list[str]]:
    """``NAME=k=v k=v`` -> {NAME: ["k=v", ...]}."""
    out: dict[str, list[str]] = {}
    for item in items:
        name, sep, rest = item.partition("=")
        if not sep or not name or name in ("off", "agent", "runqlat", "baseline"):
            sys.exit(f"--variant {item!r}: expected NAME='section.key=value ...'")
        out[name] = shlex.split(rest)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each kind")
    parser.add_argument("--loops", type=int, default=200_000, help="perf bench pipe loops")
    parser.add_argument("--steps", type=int, default=300, help="training steps per round")
    parser.add_argument("--skip-train", action="store_true", help="leave out the training loop")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME='section.key=value ...'",
        help="also measure the agent with these config overrides (repeatable)",
    )
    parser.add_argument(
        "--baseline",
        metavar="GIT_REF",
        help="also measure the agent of this git ref (e.g. main) in the same rounds",
    )
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs")
    with tempfile.TemporaryDirectory(prefix="bd-baseline-") as tmp:
        tree = baseline_tree(args.baseline, Path(tmp)) if args.baseline else None
        results = report(args, parse_variants(args.variant), tree)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_sched_overhead", results)


if __name__ == "__main__":
    main()
