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
``--baseline REF`` adds rounds of the agent of a git ref (e.g. ``main``); ``--dynolog PATH``
adds rounds of a Dynolog binary (the anchor the targets are set against: build it from source
with the project's build script), measured the same way in the same interleaved rounds
(``--dynolog-args``: its flags, e.g. ``--enable_ipc_monitor``). The load average at the start
of each run is recorded with its figure: the machine may be shared. ``--threads`` runs the
agent at its defaults (``--rounds`` times, interleaved with ``--baseline``'s agent when
given) with its Python threads named in /proc (``named_threads.py``) and reports each
thread's CPU share and how often it ran (the third field of its schedstat: times it was
switched in, i.e. its wakeups), with each collector's rounds over the same window (from
``GetStatus``, which is not a read: it moves no cadence) and the machine's process starts a
second.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from daemon_runner import Daemon, baseline_tree, process_cpu_seconds
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


def per_thread(settle_s: float, window_s: float, tree: Path | None = None) -> str:
    """The ``--threads`` run: each thread's CPU share and runs a second, each collector's
    rounds, over one window of the agent at its defaults (of ``tree``: another version)."""
    import grpc

    from bpfdyno.rpc.v1 import agent_pb2 as pb
    from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc

    budget_said: list[str] = []

    def rounds(sock: str) -> dict[str, int]:
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            status = pb_grpc.AgentStub(ch).GetStatus(pb.GetStatusRequest(), timeout=10)
        # What the budget said (how often it measures, and why): the last call's is kept.
        budget_said[:] = [c.reason for c in status.collectors if c.name == "budget"]
        return {c.name: c.collections for c in status.collectors}

    def tasks(pid: int) -> dict[int, tuple[str, int, int]]:
        out: dict[int, tuple[str, int, int]] = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):  # ended meanwhile
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                run_ns, _, runs = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
                out[int(tid)] = (comm, int(run_ns), int(runs))
        return out

    load0 = os.getloadavg()[0]
    with Daemon([], settle_s=settle_s, tree=tree, named_threads=True) as daemon:
        r0, a, f0, t0 = rounds(daemon.sock), tasks(daemon.pid), process_starts(), time.monotonic()
        time.sleep(window_s)
        b, f1, t1 = tasks(daemon.pid), process_starts(), time.monotonic()
        r1 = rounds(daemon.sock)
    dt = t1 - t0
    rows = sorted(
        (
            (ns - a.get(tid, ("", 0, 0))[1], runs - a.get(tid, ("", 0, 0))[2], comm, tid)
            for tid, (comm, ns, runs) in b.items()
        ),
        reverse=True,
    )
    total = sum(r[0] for r in rows)
    lines = [
        f"Per thread over {dt:.0f} s after {settle_s:.0f} s settling, load average {load0:.1f} "
        f"at the start, {(f1 - f0) / dt:.0f} process starts a second on the machine; the whole "
        f"agent {total / dt / 1e7:.3f} % of a core.",
        "",
        "| thread | CPU, % of a core | runs a second (schedstat's 3rd field: its wakeups) |",
        "|---|---|---|",
    ]
    lines += [
        f"| {comm} ({tid}) | {ns / dt / 1e7:.3f} | {runs / dt:.2f} |"
        for ns, runs, comm, tid in rows
        if ns or runs
    ]
    lines += [
        "",
        "Rounds in the window: "
        + ", ".join(f"{name} {r1[name] - r0.get(name, 0)}" for name in sorted(r1)),
        "",
        f"The budget at the end: {budget_said[0] if budget_said else '(none)'}",
    ]
    return "\n".join(lines)


def process_starts() -> int:
    """Processes and threads started on the machine since boot (``processes`` of /proc/stat)."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("processes "):
                return int(line.split()[1])
    return 0


def measure_dynolog(
    binary: str, flags: list[str], settle_s: float, window_s: float
) -> tuple[float, int, int]:
    """(CPU share of one core, RSS bytes, private bytes) of one run of a Dynolog binary."""
    proc = subprocess.Popen([binary, *flags], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(settle_s)
        if proc.poll() is not None:
            sys.exit(f"{binary} exited with {proc.returncode} while settling")
        cpu0, t0 = process_cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = process_cpu_seconds(proc.pid), time.monotonic()
        with open(f"/proc/{proc.pid}/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return (cpu1 - cpu0) / (t1 - t0), rss, private_bytes(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


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
    dynolog = f"Dynolog {args.dynolog_args}".strip()
    if args.dynolog:
        kinds[dynolog] = []
    names = list(kinds)
    loads: dict[str, list[float]] = {k: [] for k in names}
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
            loads[kind].append(os.getloadavg()[0])
            if kind == dynolog:
                share, rss_bytes, own_bytes = measure_dynolog(
                    args.dynolog, shlex.split(args.dynolog_args), args.settle, args.window
                )
                ready_s = (0.0, 0.0)
            else:
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
                f"RSS {rss_bytes / 1e6:.0f} MB, load average {loads[kind][-1]:.2f}",
                flush=True,
            )
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{procs} processes / {threads} threads on the machine, load average {load0:.2f} at the "
        f"start; {args.rounds} rounds, each {args.settle:.0f} s settling then "
        f"{args.window:.0f} s measured.",
        "",
        "| agent | CPU, median (range) | RSS, median (range) | private memory | load average "
        "at each run's start | target |",
        "|---|---|---|---|---|---|",
    ]
    base = statistics.median(cpu["defaults"])
    for kind in names:
        c, r = cpu[kind], rss[kind]
        target = "<= 0.3 % of a core, <= 100 MB" if kind == "defaults" else ""
        saving = (
            f" (saves {(base - statistics.median(c)) * 100:.2f})"
            if kind.startswith("without")
            else ""
        )
        lines.append(
            f"| {kind} | {statistics.median(c) * 100:.2f} % ({min(c) * 100:.2f}-"
            f"{max(c) * 100:.2f}){saving} | {statistics.median(r) / 1e6:.0f} MB "
            f"({min(r) / 1e6:.0f}-{max(r) / 1e6:.0f}) | "
            f"{statistics.median(private[kind]) / 1e6:.0f} MB | "
            f"{', '.join(f'{x:.1f}' for x in loads[kind])} | {target} |"
        )
    if not args.dynolog:
        lines += [
            "",
            "Dynolog (the anchor) was not measured in this run (no `--dynolog` binary given).",
        ]
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


def gpu_node(settle_s: float = 30.0, window_s: float = 45.0) -> dict[str, object]:
    """The ``--gpu-node`` run: the whole agent, then each part on its own."""
    import grpc
    from node_costs import collector_round_us, nvml_call_us

    from bpfdyno.rpc.v1 import agent_pb2 as pb
    from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc

    out: dict[str, object] = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
    }
    with Daemon([], settle_s=settle_s) as daemon:
        cpu0, t0 = daemon.cpu_seconds(), time.monotonic()
        time.sleep(window_s)
        cpu1, t1 = daemon.cpu_seconds(), time.monotonic()
        status_text = Path(f"/proc/{daemon.pid}/status").read_text()
        mem = {
            line.split(":")[0]: int(line.split()[1]) * 1024
            for line in status_text.splitlines()
            if line.startswith(("VmRSS", "RssAnon", "RssFile", "Threads"))
        }
        with grpc.insecure_channel(f"unix:{daemon.sock}") as ch:
            stub = pb_grpc.AgentStub(ch)
            status = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
            snap = stub.GetMetrics(
                pb.GetMetricsRequest(names=["agent_cost_ratio", "bpf_function_cost_ratio"]),
                timeout=10,
            )
        out |= {
            "agent_cpu_percent": round((cpu1 - cpu0) / (t1 - t0) * 100, 3),
            "rss_mb": round(mem["VmRSS"] / 1e6, 1),
            "rss_anon_mb": round(mem["RssAnon"] / 1e6, 1),
            "rss_file_mb": round(mem["RssFile"] / 1e6, 1),
            "private_mb": round(private_bytes(daemon.pid) / 1e6, 1),
            "threads": mem["Threads"] // 1024,
            "ready_s": round(daemon.serving_after_s, 2),
            "parts": {c.name: pb.CollectorState.Name(c.state)[16:] for c in status.collectors},
            "budget": next(c.reason for c in status.collectors if c.name == "budget"),
            "gpu": next((c.reason for c in status.collectors if c.name == "gpu"), ""),
            "agent_cost_percent": {
                (
                    {lab.name: lab.value for lab in s.labels}.get("part")
                    or {lab.name: lab.value for lab in s.labels}["program"]
                ): round(s.points[-1].value * 100, 4)
                for s in snap.series
                if s.points
            },
        }
    out["collector_round_us"] = collector_round_us()
    out["nvml_call_us"] = nvml_call_us()
    return out


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
    parser.add_argument("--dynolog", metavar="PATH", help="also measure this Dynolog binary")
    parser.add_argument("--dynolog-args", default="", help="its flags, e.g. '--enable_ipc_monitor'")
    parser.add_argument(
        "--gpu-node", action="store_true", help="one short run with each part's cost (see above)"
    )
    parser.add_argument(
        "--threads", action="store_true", help="runs with each thread's cost (see above)"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the agent loads BPF programs")
    if args.gpu_node:
        result = gpu_node()
        for key, value in result.items():
            if isinstance(value, dict):
                print(f"{key}:")
                for k, v in value.items():
                    print(f"    {k}: {v}")
            else:
                print(f"{key}: {value}")
        print(json.dumps(result))
        return
    if args.threads:
        # --rounds runs of each, interleaved: the machine's load moves between them.
        with tempfile.TemporaryDirectory(prefix="bd-baseline-") as tmp:
            tree = baseline_tree(args.baseline, Path(tmp)) if args.baseline else None
            for n in range(1, args.rounds + 1):
                print(f"This tree, run {n}:\n{per_thread(args.settle, args.window)}\n", flush=True)
                if tree is not None:
                    table = per_thread(args.settle, args.window, tree)
                    print(f"{args.baseline}, run {n}:\n{table}\n", flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="bd-baseline-") as tmp:
        tree = baseline_tree(args.baseline, Path(tmp)) if args.baseline else None
        results = report(args, tree)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_agent_idle", results)


if __name__ == "__main__":
    main()
