"""What the gRPC Unix front costs: calls through it against calls straight to gRPC.

Usage (as root): ``python tests/bench/bench_grpc_front.py [--rounds 10]``.

The agent serves its gRPC API on the public Unix socket through its own front
(`bpfdyno.server.unix_front`): it accepts the connection, reads ``SO_PEERCRED``, and relays
the bytes to a private gRPC listener from a socket named after the client's credentials, so
every call is attributed to its uid. This benchmark runs one gRPC server (the Tracing
service over a registry of ``--trainers`` simulated trainers) with both listeners — the
front and, for comparison, a plain socket straight to gRPC — and a client in another
process that calls each in interleaved rounds (order rotated every round):

* **small call**: ``GetTrace`` of an unknown id (a NOT_FOUND status, no payload: the
  cheapest call there is), 500 calls per round on one channel: latency per call, and the
  agent's CPU time per call (``/proc/<agent>/stat``, so the relay's work on the agent's
  event loop is included);
* **large call**: ``ListTrainers`` of every trainer (hundreds of KB), 20 per round;
* **new connection**: a new channel and its first small call, 50 per round (what one
  ``bpfdyno`` CLI invocation pays).

Reported: medians and 99th percentiles over all rounds, and the front/direct ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.server.tracing import servicer_factory
from bpfdyno.server.unix_front import UnixFront
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.trainers import TrainerRegistry

SMALL, LARGE, CONNECT = 500, 20, 50
_TICK = os.sysconf("SC_CLK_TCK")


def agent_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def small_call(stub: pb_grpc.TracingStub) -> None:
    try:
        stub.GetTrace(pb.GetTraceRequest(trace_id="0"), timeout=30)
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            raise


def client(targets: dict[str, str], rounds: int, agent: int) -> None:
    """Runs in the child: the calls, measured; prints one JSON document."""
    out: dict[str, dict[str, list[float]]] = {
        t: {"small": [], "large": [], "connect": [], "cpu_per_small": [], "large_bytes": []}
        for t in targets
    }
    names = list(targets)
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            address = targets[name]
            res = out[name]
            with grpc.insecure_channel(address) as ch:
                stub = pb_grpc.TracingStub(ch)
                small_call(stub)  # connect
                cpu0 = agent_cpu_s(agent)
                for _ in range(SMALL):
                    t0 = time.perf_counter()
                    small_call(stub)
                    res["small"].append(time.perf_counter() - t0)
                res["cpu_per_small"].append((agent_cpu_s(agent) - cpu0) / SMALL)
                for _ in range(LARGE):
                    t0 = time.perf_counter()
                    reply = stub.ListTrainers(pb.ListTrainersRequest())
                    res["large"].append(time.perf_counter() - t0)
                res["large_bytes"].append(float(reply.ByteSize()))
            for _ in range(CONNECT):
                t0 = time.perf_counter()
                with grpc.insecure_channel(address) as ch:
                    small_call(pb_grpc.TracingStub(ch))
                res["connect"].append(time.perf_counter() - t0)
    print(json.dumps(out))


async def serve(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    base = tempfile.mkdtemp(prefix="bdf-", dir="/tmp")
    service = TracingService([base], 60.0, TrainerRegistry(max_entries=args.trainers))
    for i in range(args.trainers):
        pid = 100_000 + i
        service.on_request(f"\0c{i}\0".encode(), KinetoRequest(3, i % 50, (pid, 99_999)))
    server = grpc.aio.server()
    servicer_factory(service)(server)
    direct = os.path.join(base, "direct.sock")
    front = UnixFront(os.path.join(base, "front.sock"))
    server.add_insecure_port(f"unix:{direct}")
    server.add_insecure_port(front.internal_target)
    front.bind()
    await server.start()
    await front.start()
    try:
        targets = {"direct": f"unix:{direct}", "front": f"unix:{front.public_path}"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            json.dumps(targets),
            "--rounds",
            str(args.rounds),
            "--agent",
            str(os.getpid()),
            stdout=subprocess.PIPE,
        )
        stdout, _ = await proc.communicate()
        assert proc.returncode == 0
        result: dict[str, dict[str, list[float]]] = json.loads(stdout)
        return result
    finally:
        await front.stop()
        await server.stop(0)
        os.unlink(front.public_path)


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def report(res: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> str:
    load1 = os.getloadavg()[0]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs, "
        f"load average {load1:.1f}), {args.rounds} interleaved rounds, {args.trainers} "
        f"trainers (large reply {statistics.median(res['front']['large_bytes']) / 1024:.0f} "
        "KiB).",
        "",
        "| path | small call p50 | small call p99 | agent CPU per small call | large call p50 "
        "| large call p99 | new connection + first call p50 | p99 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in ("direct", "front"):
        r = res[name]
        lines.append(
            f"| {name} | {pct(r['small'], 50) * 1e6:.0f} µs | {pct(r['small'], 99) * 1e6:.0f} µs "
            f"| {statistics.median(r['cpu_per_small']) * 1e6:.0f} µs "
            f"| {pct(r['large'], 50) * 1e3:.2f} ms | {pct(r['large'], 99) * 1e3:.2f} ms "
            f"| {pct(r['connect'], 50) * 1e3:.2f} ms | {pct(r['connect'], 99) * 1e3:.2f} ms |"
        )
    d, f = res["direct"], res["front"]
    lines += [
        "",
        f"Front / direct (medians): small call {pct(f['small'], 50) / pct(d['small'], 50):.2f}x, "
        f"large call {pct(f['large'], 50) / pct(d['large'], 50):.2f}x, new connection "
        f"{pct(f['connect'], 50) / pct(d['connect'], 50):.2f}x.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--trainers", type=int, default=4096)
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--agent", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(json.loads(args.client), args.rounds, args.agent)
        return
    print(report(asyncio.run(serve(args)), args))


if __name__ == "__main__":
    main()
