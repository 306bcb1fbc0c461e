"""Job-wide trace fan-out: how long ``bpfdyno gputrace --job-id`` takes for 256 nodes, against
running the one-agent CLI once per host (dynolog's ``unitrace.py`` way), in the same run.

Usage (as root, for the loopback addresses and a few thousand file descriptors):
``python tests/bench/bench_fanout.py [--agents 256] [--processes 4] [--rounds 3]
[--sequential-hosts N] [--write-doc docs/performance.md]``.

**The agents** are lightweight but real: ``--processes`` server processes, each holding
``agents / processes`` grpc.aio servers, one per loopback address 127.1.x.y, all on the same
port, each with the agent's own Agent and Tracing servicers over its own `TracingService`,
TLS and the bearer-token check (`bpfdyno.server.auth`), as a production TCP listener. Each
agent has one registered trainer per round (job id = the round), so every request triggers
exactly one process per host, as a one-rank-per-node job would.

**Each round** (the order of the three rotates every round) measures:

- **library**: `bpfdyno.client.cluster.trace_job` in this process over all agents (a clock
  round, a common start time, one StartTrace per host), from the call to the last host's
  reply: the fan-out itself, channels and TLS handshakes included;
- **CLI**: the whole ``bpfdyno gputrace --hosts-file F --job-id R`` command, process start
  and imports included — what a user waits for;
- **sequential**: ``bpfdyno gputrace --host H`` run once per host, one after the other, over
  ``--sequential-hosts`` of them (default 32; 0 = all) and scaled up to all the agents: each
  run is a process of its own doing the same work, so the total grows linearly (on a busy
  shared machine all 256 runs take minutes per round).

Reported: the median and range of each over the rounds, their ratio, and whether every host
answered ``triggered 1``. The target: trigger plus every host's reply within 2 s for 256
agents (moonshot 0.5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doc_blocks import write_results
from loopback_agents import agent_processes, free_port, make_pki, serve_agents

SECTION = "## Job-wide trace fan-out"
TOKEN = "bench-fanout-token"
TARGET_S = 2.0
MOONSHOT_S = 0.5


def address(i: int) -> str:
    """The loopback address of agent ``i`` (127.1.0.1, 127.1.0.2, ...)."""
    return f"127.1.{i // 250}.{i % 250 + 1}"


# -- the agents (child processes) ---------------------------------------------------------------


def serve(first: int, count: int, port: int, pki: Path, trace_dir: Path, rounds: int) -> None:
    """Serve agents ``first .. first + count - 1`` until SIGTERM; print "ready" once bound."""
    from bpfdyno.app.daemon import Daemon
    from bpfdyno.core.config import load
    from bpfdyno.services.agent import AgentService
    from bpfdyno.services.tracing import TracingService
    from bpfdyno.tracing.ipc.wire import KinetoRequest
    from bpfdyno.tracing.trainers import TrainerRegistry

    async def main() -> None:
        cfg = load(None, [])
        agents = []
        for i in range(first, first + count):
            tracing = TracingService([str(trace_dir)], 60.0, TrainerRegistry(64, 3600.0))
            for r in range(1, rounds + 1):  # one "rank" per round's job id
                pid = 10_000 + r
                tracing.on_request(f"\0bench-{i}-{r}\0".encode(), KinetoRequest(3, r, (pid,)))
            agents.append((address(i), AgentService(Daemon(cfg, [])), tracing))
        await serve_agents(agents, port, pki, TOKEN)

    asyncio.run(main())


# -- the client side --------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bpfdyno", *args], env=env, capture_output=True, text=True
    )


async def library_round(targets: list[str], job: int, log_file: str) -> tuple[float, bool]:
    """trace_job over every agent: seconds from the call to the last reply; all triggered."""
    from bpfdyno.client.cluster import FanOut, Node, trace_job
    from bpfdyno.rpc.traces import TraceSpec

    nodes = [Node(t, t) for t in targets]
    t0 = time.monotonic()
    async with FanOut(nodes, timeout_s=10.0, concurrency=256) as fanout:
        result = await trace_job(fanout, TraceSpec(log_file=log_file, job_id=job))
        took = time.monotonic() - t0
    return took, all(h.triggered == 1 for h in result.hosts)


def cli_round(hosts_file: Path, job: int, log_file: str, env: dict[str, str]) -> tuple[float, bool]:
    """The whole ``gputrace --hosts-file`` command."""
    t0 = time.monotonic()
    r = cli(
        "gputrace",
        "--hosts-file",
        str(hosts_file),
        "--job-id",
        str(job),
        "--log-file",
        log_file,
        "--json",
        "--concurrency",
        "256",
        "--host-timeout",
        "10",
        env=env,
    )
    took = time.monotonic() - t0
    ok = r.returncode == 0 and all(h["files"] for h in json.loads(r.stdout)["hosts"])
    if not ok:
        print(r.stdout[-2000:], r.stderr[-2000:], file=sys.stderr)
    return took, ok


def sequential_round(
    targets: list[str], job: int, log_file: str, env: dict[str, str]
) -> tuple[float, bool]:
    """One ``gputrace --host H`` per host, one after the other."""
    ok = True
    t0 = time.monotonic()
    for t in targets:
        r = cli("gputrace", "--host", t, "--job-id", str(job), "--log-file", log_file, env=env)
        ok = ok and r.returncode == 0 and "triggered 1" in r.stdout
    return time.monotonic() - t0, ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--agents", type=int, default=256)
    p.add_argument("--processes", type=int, default=4, help="server processes for the agents")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--sequential-hosts",
        type=int,
        default=32,
        help="hosts the sequential way is measured on, scaled to all (0: all)",
    )
    p.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    p.add_argument("--serve", nargs=6, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        first, count, port, pki, trace_dir, rounds = args.serve
        serve(int(first), int(count), int(port), Path(pki), Path(trace_dir), int(rounds))
        return 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 65536)), hard))
    agents, rounds = args.agents, args.rounds
    seq_hosts = min(args.sequential_hosts or agents, agents)
    # Every round's three parts use their own job id (a fresh "rank" on every agent).
    jobs_needed = 3 * rounds
    tmp = Path(tempfile.mkdtemp(prefix="bench-fanout-"))
    servers = contextlib.ExitStack()
    try:
        make_pki(tmp, [address(i) for i in range(agents)], TOKEN)
        trace_dir = tmp / "traces"
        trace_dir.mkdir()
        port = free_port([address(i) for i in range(agents)])
        per = -(-agents // args.processes)
        argvs = [
            [
                sys.executable,
                __file__,
                "--serve",
                str(first),
                str(min(per, agents - first)),
                str(port),
                str(tmp),
                str(trace_dir),
                str(jobs_needed),
            ]
            for first in range(0, agents, per)
        ]
        servers.enter_context(agent_processes(argvs))
        targets = [f"{address(i)}:{port}" for i in range(agents)]
        hosts_file = tmp / "hosts"
        hosts_file.write_text("\n".join(targets) + "\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith("BPFDYNO_")}
        env.update(BPFDYNO_TLS_CA=str(tmp / "ca.pem"), BPFDYNO_TOKEN_FILE=str(tmp / "token"))
        os.environ.update(
            BPFDYNO_TLS_CA=env["BPFDYNO_TLS_CA"], BPFDYNO_TOKEN_FILE=env["BPFDYNO_TOKEN_FILE"]
        )
        load = os.getloadavg()[0]
        print(f"{agents} agents in {len(argvs)} processes, {rounds} rounds; load {load:.2f}")
        times: dict[str, list[float]] = {"library": [], "cli": [], "sequential": []}
        all_ok = True
        job = 0
        kinds = ["library", "cli", "sequential"]
        for r in range(rounds):
            for kind in kinds[r % 3 :] + kinds[: r % 3]:
                job += 1
                log_file = str(trace_dir / f"r{job}.json")
                if kind == "library":
                    took, ok = asyncio.run(library_round(targets, job, log_file))
                elif kind == "cli":
                    took, ok = cli_round(hosts_file, job, log_file, env)
                else:
                    took, ok = sequential_round(targets[:seq_hosts], job, log_file, env)
                    took *= agents / seq_hosts
                times[kind].append(took)
                all_ok = all_ok and ok
                print(
                    f"round {r + 1} {kind:<10} {took:8.3f} s  {'ok' if ok else 'NOT ALL TRIGGERED'}"
                )
        results = report(times, agents, seq_hosts, rounds, load, all_ok)
        print("\n" + results)
        if args.write_doc:
            write_results(args.write_doc, SECTION, "bench_fanout", results)
        return 0 if all_ok else 1
    finally:
        servers.close()
        shutil.rmtree(tmp, ignore_errors=True)


def report(
    times: dict[str, list[float]], agents: int, seq_hosts: int, rounds: int, load: float, ok: bool
) -> str:
    med = {k: statistics.median(v) for k, v in times.items()}
    scaled = (
        "" if seq_hosts == agents else f" (measured over {seq_hosts} hosts, scaled to {agents})"
    )
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{agents} agents (TLS + token) on loopback addresses, {rounds} interleaved rounds, "
        f"1-minute load average {load:.2f} at the start; every host triggered: "
        f"{'yes' if ok else 'NO'}.",
        "",
        "| way | median | min | max | vs. sequential |",
        "|---|---|---|---|---|",
    ]
    names = {
        "library": "fan-out library (`trace_job`, in process)",
        "cli": "`bpfdyno gputrace --hosts-file` (whole command)",
        "sequential": f"`bpfdyno gputrace --host H` per host, one after the other{scaled}",
    }
    for kind in ("library", "cli", "sequential"):
        v = times[kind]
        ratio = med["sequential"] / med[kind]
        lines.append(
            f"| {names[kind]} | {med[kind]:.3f} s | {min(v):.3f} s | {max(v):.3f} s "
            f"| {'1' if kind == 'sequential' else f'{ratio:.0f}x faster'} |"
        )
    verdict = "met" if med["cli"] <= TARGET_S else "MISSED"
    moon = "met" if med["library"] <= MOONSHOT_S else "not met"
    lines += [
        "",
        f"Target <= {TARGET_S:g} s for the whole command: {verdict}; moonshot <= "
        f"{MOONSHOT_S:g} s for the fan-out itself: {moon}.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
