"""What ``bpfdyno top --job-id`` costs: share of one core of the UI polling 64 nodes at 1 Hz.

Usage (as root, for the loopback addresses): ``python tests/bench/bench_top_cluster.py
[--nodes 64] [--rounds 5] [--window 10] [--size 200x50] [--mode pty|headless]
[--write-doc docs/performance.md]``.

**The nodes** are lightweight but real agents: two server processes hold one grpc.aio
server per loopback address 127.2.x.y (TLS and the bearer token, as a production TCP
listener), each with the agent's own Agent and Tracing servicers over a real `Daemon` whose
one collector produces, every second, what a big GPU node reports for the cluster row's
metrics: 64 cores plus the total, memory, 8 GPUs (utilization, memory, power), 4 NICs plus
loopback, TCP retransmits and run-queue quantiles — about 110 series per poll — and one
registered trainer of the job.

**The UI** is the real command: ``bpfdyno top --hosts-file F --job-id J`` on a
pseudo-terminal of ``--size``, drained by a thread here like a terminal would (``pty``), or
`ClusterApp` in this process under Textual's headless driver (``headless``; it also checks
that every node's row is up). CPU is the UI process's own (``/proc/<pid>/stat``, or
``getrusage``), over ``--window`` seconds per round after a settling period.

Printed: the median, min and max share of one core; the budget is 10 % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from doc_blocks import write_results
from loopback_agents import agent_processes, free_port, make_pki, serve_agents
from pty_app import PtyApp

SECTION = "## Cluster view cost"
TOKEN = "bench-top-token"
JOB = 4242
BUDGET = 0.10
SETTLE_S = 8.0


def address(i: int) -> str:
    return f"127.2.{i // 250}.{i % 250 + 1}"


# -- the nodes (child processes) ------------------------------------------------------------


def serve(first: int, count: int, port: int, pki: Path) -> None:
    """Serve nodes ``first .. first + count - 1`` until SIGTERM; print "ready" once bound."""
    from bpfdyno.app.catalog import CATALOG
    from bpfdyno.app.daemon import Daemon
    from bpfdyno.core.config import load
    from bpfdyno.core.metrics import MetricSpec, Sample, sample
    from bpfdyno.services.agent import AgentService
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.sources.base import Collector
    from bpfdyno.tracing.ipc.wire import KinetoRequest
    from bpfdyno.tracing.trainers import TrainerRegistry

    def spec(name: str) -> MetricSpec:
        found = CATALOG.get(name)
        assert found is not None, name
        return found

    class BigNode(Collector):
        """A 64-core, 8-GPU node's numbers for the cluster row, changing every round."""

        name = "host"

        def __init__(self, seed: int) -> None:
            self.n = seed

        def collect(self) -> Sequence[Sample]:
            self.n += 1
            w = (self.n % 10) / 10
            out = [sample(spec("cpu_utilization_ratio"), w, {"cpu": "total"})]
            out += [sample(spec("cpu_utilization_ratio"), w, {"cpu": str(c)}) for c in range(64)]
            out += [
                sample(spec("memory_total_bytes"), 2.0e12),
                sample(spec("memory_used_bytes"), 1.0e12 * (1 + w)),
            ]
            for g in range(8):
                labels = {"gpu": str(g), "uuid": f"GPU-{g:08d}-bench"}
                out += [
                    sample(spec("gpu_utilization_ratio"), w, labels),
                    sample(spec("gpu_memory_used_bytes"), 6.0e10 * w, labels),
                    sample(spec("gpu_memory_total_bytes"), 8.0e10, labels),
                    sample(spec("gpu_power_watts"), 300 + 400 * w, labels),
                ]
            for nic in ("lo", "eth0", "ib0", "ib1", "ib2"):
                out += [
                    sample(spec("net_rx_bytes_per_second"), 1e9 * w, {"interface": nic}),
                    sample(spec("net_tx_bytes_per_second"), 1e9 * w, {"interface": nic}),
                ]
            out.append(sample(spec("net_tcp_retransmits_per_second"), 10 * w))
            for q in ("0.5", "0.9", "0.99", "0.999"):
                out.append(sample(spec("sched_runqueue_latency_seconds"), 1e-5, {"quantile": q}))
            return out

    async def main() -> None:
        cfg = load(None, [("daemon.interval_s", "1.0")])
        agents, daemons = [], []
        for i in range(first, first + count):
            daemon = Daemon(cfg, [BigNode(i)])
            await daemon.start()
            daemons.append(daemon)
            tracing = TracingService(["/tmp"], 60.0, TrainerRegistry(64, 3600.0))
            tracing.on_request(f"\0bench-{i}\0".encode(), KinetoRequest(3, JOB, (20_000 + i,)))
            agents.append((address(i), AgentService(daemon), tracing))
        await serve_agents(agents, port, pki, TOKEN)
        for d in daemons:
            await d.stop()

    asyncio.run(main())


# -- measuring the UI ------------------------------------------------------------------------


def run_pty(
    hosts_file: Path, env: dict[str, str], rounds: int, window: float, cols: int, rows: int
) -> tuple[list[float], list[float]]:
    """The real command on a pseudo-terminal; per round its share of one core and the
    bytes per second it wrote to the terminal."""
    argv = ["-m", "bpfdyno", "top", "--hosts-file", str(hosts_file), "--job-id", str(JOB)]
    shares, rates = [], []
    with PtyApp(argv, cols, rows, env) as app:
        time.sleep(SETTLE_S)
        for r in range(rounds):
            w = app.measure(window)
            shares.append(w.core_share)
            rates.append(w.bytes_per_s)
            kib_s = w.bytes_per_s / 1024
            print(f"round {r + 1}: {w.core_share * 100:5.1f} % of a core, {kib_s:.1f} KiB/s")
    return shares, rates


def run_headless(
    targets: list[str], rounds: int, window: float, cols: int, rows: int
) -> list[float]:
    """`ClusterApp` in this process; also checks that every node answers."""
    from bpfdyno.client.cluster import Node
    from bpfdyno.tui.cluster_app import ClusterApp
    from bpfdyno.tui.cluster_source import ClusterDataSource

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    shares = []

    async def main() -> None:
        nodes = [Node(t, t) for t in targets]
        app = ClusterApp(ClusterDataSource(nodes, job=str(JOB), job_id=JOB, origin="--hosts"))
        async with app.run_test(size=(cols, rows)):
            await asyncio.sleep(SETTLE_S)
            for r in range(rounds):
                t0, c0 = time.monotonic(), cpu()
                await asyncio.sleep(window)
                t1, c1 = time.monotonic(), cpu()
                shares.append((c1 - c0) / (t1 - t0))
                st = app.cluster_state
                print(
                    f"round {r + 1}: {shares[-1] * 100:5.1f} % of a core; "
                    f"{st.answering}/{len(nodes)} nodes answering, "
                    f"{sum(n.trainers == 1 for n in st.nodes)} with their trainer"
                )
                if st.answering != len(nodes):
                    raise SystemExit("not every node answered: the numbers would be too low")

    asyncio.run(main())
    return shares


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--processes", type=int, default=2, help="server processes for the nodes")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--window", type=float, default=10.0, help="seconds measured per round")
    p.add_argument("--size", default="200x50", help="terminal COLSxROWS")
    p.add_argument("--mode", choices=["pty", "headless"], default="pty")
    p.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    p.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        first, count, port, pki = args.serve
        serve(int(first), int(count), int(port), Path(pki))
        return 0
    cols, rows = (int(x) for x in args.size.split("x"))
    tmp = Path(tempfile.mkdtemp(prefix="bench-top-"))
    servers = contextlib.ExitStack()
    try:
        make_pki(tmp, [address(i) for i in range(args.nodes)], TOKEN)
        port = free_port([address(i) for i in range(args.nodes)])
        per = -(-args.nodes // args.processes)
        argvs = [
            [
                sys.executable,
                __file__,
                "--serve",
                str(first),
                str(min(per, args.nodes - first)),
                str(port),
                str(tmp),
            ]
            for first in range(0, args.nodes, per)
        ]
        servers.enter_context(agent_processes(argvs))
        targets = [f"{address(i)}:{port}" for i in range(args.nodes)]
        hosts_file = tmp / "hosts"
        hosts_file.write_text("\n".join(targets) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BPFDYNO_")}
        env.update(BPFDYNO_TLS_CA=str(tmp / "ca.pem"), BPFDYNO_TOKEN_FILE=str(tmp / "token"))
        load = os.getloadavg()[0]
        print(
            f"{args.mode}: {args.nodes} nodes at 1 Hz, {cols}x{rows}, {args.rounds} rounds of "
            f"{args.window:g} s; load {load:.2f}"
        )
        rates: list[float] = []
        if args.mode == "pty":
            shares, rates = run_pty(hosts_file, env, args.rounds, args.window, cols, rows)
        else:
            os.environ.update(env)
            shares = run_headless(targets, args.rounds, args.window, cols, rows)
        med = statistics.median(shares)
        results = (
            f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} "
            f"({os.cpu_count()} CPUs), {args.mode} mode, {args.nodes} nodes (TLS + token), "
            f"{cols}x{rows}, {args.rounds} windows of {args.window:g} s, 1-minute load "
            f"{load:.2f} at the start: **{med * 100:.1f} % of one core** (median; min "
            f"{min(shares) * 100:.1f} %, max {max(shares) * 100:.1f} %)"
            + (f", {statistics.median(rates) / 1024:.1f} KiB/s to the terminal" if rates else "")
            + f"; budget {BUDGET:.0%}: {'met' if med <= BUDGET else 'MISSED'}."
        )
        print("\n" + results)
        if args.write_doc:
            write_results(args.write_doc, SECTION, f"bench_top_cluster:{args.mode}", results)
        return 0
    finally:
        servers.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
