"""The whole agent under sustained load: 64 trainers polling, 50 gRPC metric streams (half of
them never reading), for 10 minutes. RSS and CPU over time, and nothing dropped silently.

Usage (as root): ``python tests/bench/bench_load.py [--minutes 10] [--trainers 64]
[--clients 50] [--sample-s 10] [--write-doc docs/performance.md]``

- The agent: ``bpfdyno serve`` at its defaults (every collector that starts here), except
  its gRPC socket, Kineto socket directory and legacy RPC port (a temp dir and an ephemeral
  port, so it runs beside another agent), plus the Prometheus exporter scraped every 5 s
  (``--no-exporter`` leaves it off).
- Trainers: one process simulating ``--trainers`` Kineto clients (one datagram socket each,
  fake pids, a job id), each polling every second as libkineto does with
  ``ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1`` (the default is 5 s: this is 5x the load).
  Every poll is answered or counted: replies, timeouts (no reply within 2 s), latency.
- gRPC clients: one process with ``--clients`` StreamMetrics subscriptions on their own
  channels; half read every round, half open the stream and never read. The agent keeps
  at most 64 rounds per subscriber and drops the oldest for a slow one, counting them.
- Every ``--sample-s``: the agent's RSS (VmRSS) and its CPU time over the interval (utime +
  stime from /proc/<pid>/stat), and its own counters from ``GetStatus``.

At the end the trainers' and the agent's counts must agree: every poll the agent did not
answer is one it counted as dropped (nothing silently lost), and every round a stream did
not deliver is one the agent counted as dropped for that slow reader.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc

from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.tracing.ipc import wire

SECTION = "## The agent under sustained load"
BEGIN, END = "<!-- bench_load:begin -->", "<!-- bench_load:end -->"
POLL_S = 1.0
REPLY_TIMEOUT_S = 2.0


# -- simulated trainers (child process) ---------------------------------------------------


async def _trainer(
    sock_dir: str, index: int, stop_at: float, stats: dict[str, Any], lat: list[float]
) -> None:
    daemon = os.path.join(sock_dir, "dynolog")
    path = os.path.join(sock_dir, f"dynoconfigclient{uuid.uuid4()}")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.setblocking(False)
    loop = asyncio.get_running_loop()
    pid = 200_000 + index
    request = wire.encode_request(3, 4242, [pid, 100_000])
    await asyncio.sleep(index * POLL_S / 64)  # spread like independent processes
    try:
        while time.monotonic() < stop_at:
            t0 = time.monotonic()
            try:
                s.sendto(request, daemon)
            except (BlockingIOError, ConnectionRefusedError, FileNotFoundError):
                stats["send_failed"] += 1
                await asyncio.sleep(POLL_S)
                continue
            stats["sent"] += 1
            fut: asyncio.Future[None] = loop.create_future()
            loop.add_reader(s.fileno(), lambda f=fut: f.done() or f.set_result(None))
            try:
                await asyncio.wait_for(fut, REPLY_TIMEOUT_S)
                while True:
                    try:
                        s.recv(300_000)
                    except BlockingIOError:
                        break
                    stats["replies"] += 1
                    lat.append(time.monotonic() - t0)
            except TimeoutError:
                stats["timeouts"] += 1
            finally:
                loop.remove_reader(s.fileno())
            await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - t0)))
    finally:
        s.close()
        os.unlink(path)


async def _trainers_main(sock_dir: str, count: int, seconds: float) -> dict[str, Any]:
    stats: dict[str, Any] = {"sent": 0, "replies": 0, "timeouts": 0, "send_failed": 0}
    lat: list[float] = []
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(_trainer(sock_dir, i, stop_at, stats, lat) for i in range(count)))
    lat.sort()
    stats["latency_ms_p50"] = 1000 * lat[len(lat) // 2] if lat else float("nan")
    stats["latency_ms_p99"] = 1000 * lat[int(len(lat) * 0.99)] if lat else float("nan")
    stats["latency_ms_max"] = 1000 * lat[-1] if lat else float("nan")
    return stats


# -- gRPC stream clients (child process) --------------------------------------------------


async def _stream_client(target: str, read: bool, stop_at: float, out: dict[str, int]) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.AgentStub(channel)
        call = stub.StreamMetrics(pb.StreamMetricsRequest())
        if not read:
            # Open the stream (the first message proves it is established), then never read.
            await call.read()
            await asyncio.sleep(max(0.0, stop_at - time.monotonic()))
            call.cancel()
            return
        while time.monotonic() < stop_at:
            try:
                msg = await asyncio.wait_for(call.read(), 5)
            except TimeoutError:
                continue
            if msg is grpc.aio.EOF:
                break
            out["rounds_read"] += 1
        call.cancel()


async def _clients_main(target: str, count: int, seconds: float) -> dict[str, int]:
    out = {"rounds_read": 0, "readers": (count + 1) // 2, "non_readers": count // 2}
    stop_at = time.monotonic() + seconds
    await asyncio.gather(*(_stream_client(target, i % 2 == 0, stop_at, out) for i in range(count)))
    return out


# -- the benchmark --------------------------------------------------------------------------


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _counters(stub: Any) -> dict[str, int]:
    st = stub.GetStatus(pb.GetStatusRequest(), timeout=10)
    parts = {c.name: c for c in st.collectors}
    ipc = parts["kineto_ipc"].reason
    m = re.search(r"(\d+) datagrams, (\d+) replies, (\d+) malformed, (\d+) dropped", ipc)
    streams = parts["metric_streams"]
    out = {"stream_rounds_dropped": streams.errors}
    if m:
        out.update(ipc_datagrams=int(m[1]), ipc_replies=int(m[2]), ipc_malformed=int(m[3]),
                   ipc_dropped=int(m[4]))  # fmt: skip
    sub = re.search(r"(\d+) subscribers", streams.reason)
    out["stream_subscribers"] = int(sub[1]) if sub else -1
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="bd-load-"))
    sock = str(tmp / "agent.sock")
    kineto_dir = tempfile.mkdtemp(prefix="bd-", dir="/tmp")
    prom_port = 0
    extra = ['--set=legacy_rpc.listen=["127.0.0.1:0"]', f'--set=kineto.socket_dir="{kineto_dir}"']
    extra += [f"--set={s}" for s in args.sets]
    if args.exporter:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            prom_port = s.getsockname()[1]
        extra += ["--set=export.prometheus.enabled=true",
                  f'--set=export.prometheus.listen="127.0.0.1:{prom_port}"']  # fmt: skip
    log = open(tmp / "agent.log", "w")  # noqa: SIM115
    agent = subprocess.Popen([sys.executable, "-m", "bpfdyno", "serve", "--socket", sock, *extra],
                             stderr=log)  # fmt: skip
    channel = grpc.insecure_channel(f"unix:{sock}")
    stub = pb_grpc.AgentStub(channel)
    deadline = time.monotonic() + 120
    while True:
        try:
            st = stub.GetStatus(pb.GetStatusRequest(), timeout=2)
            if all(c.state != pb.COLLECTOR_STATE_STARTING for c in st.collectors):
                break
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline or agent.poll() is not None:
            raise SystemExit(f"the agent did not start: {(tmp / 'agent.log').read_text()}")
        time.sleep(0.2)
    collectors = {c.name: c.state for c in st.collectors}
    load_start = os.getloadavg()
    seconds = args.minutes * 60
    me = [sys.executable, __file__]
    trainers = subprocess.Popen([*me, "--child-trainers", kineto_dir, str(args.trainers),
                                 str(seconds)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    clients = subprocess.Popen([*me, "--child-clients", f"unix:{sock}", str(args.clients),
                                str(seconds)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    cpu0, last_t = _proc_cpu_s(agent.pid), t0
    next_scrape = t0
    scrapes = scrape_failures = 0
    while time.monotonic() - t0 < seconds + 5:
        time.sleep(0.5)
        now = time.monotonic()
        if args.exporter and now >= next_scrape:
            next_scrape = now + 5
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{prom_port}/metrics", timeout=5
                ) as r:
                    r.read()
                scrapes += 1
            except OSError:
                scrape_failures += 1
        if now - last_t >= args.sample_s:
            cpu = _proc_cpu_s(agent.pid)
            samples.append({"t_s": round(now - t0), "rss_mb": round(_rss_mb(agent.pid), 1),
                            "cpu_pct": round(100 * (cpu - cpu0) / (now - last_t), 2),
                            **_counters(stub)})  # fmt: skip
            print(json.dumps(samples[-1]), file=sys.stderr, flush=True)
            cpu0, last_t = cpu, now
    trainer_stats = json.loads(trainers.communicate(timeout=120)[0])
    client_stats = json.loads(clients.communicate(timeout=120)[0])
    time.sleep(1.5)
    final = _counters(stub)
    channel.close()
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=60)
    log.close()
    rss = [s["rss_mb"] for s in samples]
    cpu_pcts = [s["cpu_pct"] for s in samples]
    unanswered = trainer_stats["sent"] - trainer_stats["replies"]
    return {
        "minutes": args.minutes,
        "trainers": args.trainers,
        "clients": args.clients,
        "exporter": args.exporter,
        "collectors": sorted(n for n, s in collectors.items() if s == pb.COLLECTOR_STATE_OK),
        "samples": samples,
        "rss_mb_first": rss[0],
        "rss_mb_last": rss[-1],
        "rss_mb_max": max(rss),
        "cpu_pct_median": statistics.median(cpu_pcts),
        "cpu_pct_max": max(cpu_pcts),
        "trainer_stats": trainer_stats,
        "client_stats": client_stats,
        "agent_final": final,
        "unanswered_polls": unanswered,
        "scrapes": scrapes,
        "scrape_failures": scrape_failures,
        "sample_s": args.sample_s,
        "load_start": load_start,
        "load_end": os.getloadavg(),
    }


def render(r: dict[str, Any]) -> str:
    ts, cs, fin = r["trainer_stats"], r["client_stats"], r["agent_final"]
    lines = [
        BEGIN,
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{r['minutes']} minutes, {r['trainers']} trainers polling every {POLL_S:.0f} s, "
        f"{r['clients']} metric streams ({cs['non_readers']} never reading), Prometheus "
        f"exporter {'on, scraped every 5 s' if r['exporter'] else 'off'}; parts ok: "
        f"{', '.join(r['collectors'])}. Host load average (1 min) "
        f"{r['load_start'][0]:.1f} at the start, {r['load_end'][0]:.1f} at the end.",
        "",
        "| minute | RSS (MB) | CPU (% of one core) | IPC replies | stream rounds dropped |",
        "|---|---|---|---|---|",
    ]
    per_min: dict[int, dict[str, Any]] = {}
    for s in r["samples"]:
        per_min[s["t_s"] // 60] = s
    for minute, s in sorted(per_min.items()):
        lines.append(f"| {minute} | {s['rss_mb']:.1f} | {s['cpu_pct']:.2f} | "
                     f"{s.get('ipc_replies', '?')} | {s['stream_rounds_dropped']} |")  # fmt: skip
    lines += [
        "",
        f"- RSS {r['rss_mb_first']:.1f} MB at the first sample, {r['rss_mb_last']:.1f} MB at "
        f"the last, {r['rss_mb_max']:.1f} MB at most; CPU median {r['cpu_pct_median']:.2f} % "
        f"of one core, {r['cpu_pct_max']:.2f} % at most (each over {r['sample_s']:.0f} s).",
        f"- Trainers: {ts['sent']} polls sent, {ts['replies']} replies, {ts['timeouts']} "
        f"timeouts, {ts['send_failed']} sends refused; reply latency p50 "
        f"{ts['latency_ms_p50']:.2f} ms, p99 {ts['latency_ms_p99']:.2f} ms, max "
        f"{ts['latency_ms_max']:.1f} ms. The agent counted {fin.get('ipc_datagrams')} "
        f"datagrams, {fin.get('ipc_replies')} replies, {fin.get('ipc_dropped')} dropped: "
        f"{r['unanswered_polls']} polls unanswered.",
        f"- Streams: the readers read {cs['rounds_read']} rounds; the agent dropped "
        f"{fin['stream_rounds_dropped']} rounds for the {cs['non_readers']} that never read "
        "(at most 64 kept for each; the count is in `bpfdyno status`, part `metric_streams`).",
    ]
    if r["exporter"]:
        lines.append(f"- Prometheus: {r['scrapes']} scrapes, {r['scrape_failures']} failed.")
    lines.append(END)
    return "\n".join(lines)


def write_doc(path: Path, block: str) -> None:
    text = path.read_text()
    if BEGIN in text:
        text = text.split(BEGIN)[0] + block + text.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    path.write_text(text)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-trainers":
        print(json.dumps(asyncio.run(_trainers_main(sys.argv[2], int(sys.argv[3]),
                                                    float(sys.argv[4])))))  # fmt: skip
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--child-clients":
        print(json.dumps(asyncio.run(_clients_main(sys.argv[2], int(sys.argv[3]),
                                                   float(sys.argv[4])))))  # fmt: skip
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--trainers", type=int, default=64)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--no-exporter", dest="exporter", action="store_false")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="extra agent config (repeatable), e.g. daemon.history_s=60")  # fmt: skip
    p.add_argument("--write-doc", type=Path)
    p.add_argument("--json", type=Path, help="also write the raw results here")
    args = p.parse_args()
    result = run(args)
    block = render(result)
    print(block)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    if args.write_doc:
        write_doc(args.write_doc, block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
