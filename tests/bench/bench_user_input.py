"""What guarding against users' input costs, and what it buys (docs/performance.md).

Run as root, as one command: ``python tests/bench/bench_user_input.py [--rounds 15]
[--write-doc docs/performance.md]``. Three measurements, each in interleaved rounds (the
machine is shared: medians and ratios, not single times):

* **names**: reading ``/proc/PID/stat`` of every process (what the process table does for
  each one every second when nobody tells it who ran), with process names escaped
  (`bpfdyno.core.text.shown_bytes`, as shipped) and decoded as before; per process.
* **libkineto**: looking for Kineto's on-demand rule in this PyTorch's ``libtorch_cpu.so``
  the first time (the whole library searched) and after (cached by device, inode, size,
  time), as `bpfdyno.tracing.kineto_build` does once per trainer.
* **a full trainer registry**: what one new trainer costs the event loop when 4096 live
  ones fill the registry and it displaces one (8 users x 512, and 4096 users x 1), against
  a poll of a known trainer.
* **unread replies**: how many 40-byte replies, sent to clients that never read them, fill
  one socket's default send buffer (after which that socket can send nothing to anyone:
  why each user is answered from a socket of its own, `tracing/ipc/replies.py`).
* **Prometheus under slow clients**: a scrape from 127.0.0.2 while nothing else is
  connected, and while 40 connections from 127.0.0.1 send a byte every 0.2 s and never
  finish a request; and how many serving threads those 40 hold — for the bounded endpoint
  (`bpfdyno.exporters.bounded_http`: 4 admitted, the rest refused at once) and for
  prometheus_client's own server (a thread each, for as long as they like), in alternating
  order. Peers are told apart by address here (the agent tells local users apart by uid).
"""

from __future__ import annotations

import argparse
import http.client
import os
import socket
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from doc_blocks import write_results

from bpfdyno.core.catalog import CATALOG
from bpfdyno.core.config import PrometheusSection
from bpfdyno.core.metrics import Round, sample
from bpfdyno.core.text import shown_bytes
from bpfdyno.core.workers import UserLanes
from bpfdyno.exporters.prometheus import PrometheusExporter
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.kineto_build import KinetoBuilds
from bpfdyno.tracing.trainers import TrainerRegistry

SECTION = "## Untrusted input"
PROC = "/proc"


def read_all_stat(decode: Callable[[bytes], str]) -> tuple[float, int]:
    """Seconds of this thread's CPU to read every process's stat line and decode its name."""
    pids = [p for p in os.listdir(PROC) if p.isdigit()]
    t0 = time.thread_time()
    for pid in pids:
        try:
            fd = os.open(f"{PROC}/{pid}/stat", os.O_RDONLY)
        except OSError:
            continue
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        decode(raw[raw.find(b"(") + 1 : raw.rfind(b")")])
    return time.thread_time() - t0, len(pids)


def bench_names(rounds: int) -> dict[str, float]:
    kinds: dict[str, Callable[[bytes], str]] = {
        "escaped (shipped)": shown_bytes,
        "decoded only (before)": lambda b: b.decode("utf-8", "replace"),
    }
    per: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(rounds):
        for name, fn in sorted(kinds.items(), reverse=bool(i % 2)):  # alternate the order
            seconds, n = read_all_stat(fn)
            per[name].append(seconds / n * 1e9)
    return {k: statistics.median(v) for k, v in per.items()}


def bench_libkineto(rounds: int) -> tuple[dict[str, float], int]:
    import torch

    lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    first, cached = [], []
    for _ in range(rounds):
        builds = KinetoBuilds(UserLanes("bench"))
        t0 = time.perf_counter()
        builds._has_rule(lib)  # a fresh cache: the whole library is searched
        first.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        builds._has_rule(lib)
        cached.append(time.perf_counter() - t0)
    return {
        "first look (library searched)": statistics.median(first) * 1e3,
        "later looks (cached)": statistics.median(cached) * 1e3,
    }, lib.stat().st_size


def slow_clients(port: int, n: int, stop: threading.Event, connected: threading.Event) -> None:
    conns = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.setblocking(False)
        conns.append(s)
    connected.set()
    while not stop.wait(0.2):
        for s in conns:
            try:
                s.send(b"G")
                s.recv(4096)
            except OSError:
                pass
    for s in conns:
        s.close()


def scrape(port: int) -> float:
    """Seconds for one scrape from 127.0.0.2 (another peer than the slow clients)."""
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=30, source_address=("127.0.0.2", 0)
    )
    try:
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        r.read()
        assert r.status == 200, r.status
    finally:
        conn.close()
    return time.perf_counter() - t0


def bench_prometheus(rounds: int) -> dict[str, str]:
    """Scrape times and the serving threads, bounded (shipped) and prometheus_client's own."""
    from prometheus_client import start_http_server

    spec = CATALOG.get("cpu_utilization_ratio")
    assert spec is not None
    exporter = PrometheusExporter(PrometheusSection(listen="0.0.0.0:0", timeout_s=10.0))
    assert exporter.address is not None
    rows = [sample(spec, 0.5, {"cpu": str(i)}) for i in range(2000)]  # a busy node's size
    exporter.submit(Round("host", time.time(), rows))
    with socket.socket() as probe:
        probe.bind(("0.0.0.0", 0))
        old_port = probe.getsockname()[1]
    old_server, _ = start_http_server(old_port, "0.0.0.0", exporter.registry)
    ports = {"bounded (shipped)": exporter.address[1], "prometheus_client's": old_port}
    quiet: dict[str, list[float]] = {k: [] for k in ports}
    attacked: dict[str, list[float]] = {k: [] for k in ports}
    threads: dict[str, list[int]] = {k: [] for k in ports}
    try:
        for i in range(rounds):
            for name, port in sorted(ports.items(), reverse=bool(i % 2)):
                quiet[name].append(scrape(port))
                before = threading.active_count()
                stop, connected = threading.Event(), threading.Event()
                t = threading.Thread(
                    target=slow_clients, args=(port, 40, stop, connected), daemon=True
                )
                t.start()
                connected.wait(60)
                time.sleep(0.5)  # they are trickling
                attacked[name].append(scrape(port))
                threads[name].append(threading.active_count() - before - 1)
                stop.set()
                t.join()
                time.sleep(0.3)  # their threads end
    finally:
        exporter.close()
        old_server.shutdown()
    return {
        name: f"{statistics.median(quiet[name]) * 1e3:.1f} ms | "
        f"{statistics.median(attacked[name]) * 1e3:.1f} ms | {max(threads[name])}"
        for name in ports
    }


def bench_registry(rounds: int) -> dict[str, float]:
    """Microseconds per registration into a full registry (a displacement each)."""
    req = KinetoRequest(3, 0, (1,))
    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        for users, each in ((8, 512), (4096, 1)):
            reg = TrainerRegistry()
            for u in range(users):
                for i in range(each):
                    reg.observe(f"{u}-{i}".encode(), req, 0.0, 1000.0, uid=20000 + u, host_pid=1)
            t0 = time.perf_counter()
            for i in range(500):
                reg.observe(f"new-{i}".encode(), req, 0.0, 1000.0, uid=90000 + i % 7, host_pid=1)
            new = (time.perf_counter() - t0) / 500 * 1e6
            t0 = time.perf_counter()
            for _ in range(5000):
                reg.observe(b"0-0", req, 0.0, 1000.0, uid=20000, host_pid=1)
            known = (time.perf_counter() - t0) / 5000 * 1e6
            out.setdefault(f"new trainer, full of {users} users x {each}", []).append(new)
            out.setdefault(f"poll of a known trainer ({users} x {each})", []).append(known)
    return {k: statistics.median(v) for k, v in out.items()}


def unread_replies_to_fill() -> tuple[int, int]:
    """(replies sent before EAGAIN, the socket's send buffer in bytes)."""
    name = f"bench-user-input-{os.getpid()}"
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.bind(f"\0{name}".encode())
    sender.setblocking(False)
    clients: list[socket.socket] = []
    sent = 0
    try:
        while sent < 100_000:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            c.bind(f"\0{name}-{len(clients)}".encode())
            clients.append(c)
            try:
                for _ in range(10):  # a client's queue holds 10 (net.unix.max_dgram_qlen)
                    sender.sendto(b"r" * 40, c.getsockname())
                    sent += 1
            except BlockingIOError:
                break
        return sent, sender.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    finally:
        for c in clients:
            c.close()
        sender.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--write-doc", type=Path, default=None)
    args = p.parse_args()
    names = bench_names(args.rounds)
    kineto, size = bench_libkineto(args.rounds)
    registry = bench_registry(max(3, args.rounds // 3))
    unread, sndbuf = unread_replies_to_fill()
    prom = bench_prometheus(args.rounds)
    load = os.getloadavg()[0]
    ratio = names["escaped (shipped)"] / names["decoded only (before)"]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{sum(1 for x in os.listdir(PROC) if x.isdigit())} processes, load average "
        f"{load:.2f}; {args.rounds} interleaved rounds, medians.",
        "",
        "| measurement | median |",
        "|---|---|",
        *(f"| /proc/PID/stat + name, {k} | {v:.0f} ns per process |" for k, v in names.items()),
        f"| (escaped / before) | {ratio:.3f} |",
        *(
            f"| libkineto rule in libtorch_cpu.so ({size >> 20} MiB), {k} | {v:.2f} ms |"
            for k, v in kineto.items()
        ),
        *(f"| registry: {k} | {v:.1f} µs |" for k, v in registry.items()),
        f"| unread 40-byte replies that fill a socket's send buffer ({sndbuf >> 10} KiB) | "
        f"{unread} |",
        "",
        "| Prometheus endpoint | scrape, alone | scrape, 40 slow clients of another peer "
        "| serving threads taken by them |",
        "|---|---|---|---|",
        *(f"| {k} | {v} |" for k, v in prom.items()),
    ]
    text = "\n".join(lines)
    print(text)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_user_input", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
