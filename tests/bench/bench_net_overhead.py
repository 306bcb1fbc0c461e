"""What the network BPF program costs the traffic it watches, and what reading it costs.

Run as root, as a script: ``python tests/bench/bench_net_overhead.py [--rounds 7]
[--trips 20000] [--bulk-mb 200]``.

Two loopback workloads run in child processes (client pinned to CPU 0, server to CPU 1):

* ``pingpong``: 64-byte request/response round trips — the worst case per byte, every trip is
  two sends and two receives (``sock_*_length`` events) plus two segments received
  (``tcp_probe``). Reported as round trips per second.
* ``bulk``: one connection streaming ``--bulk-mb`` MB in 64 KiB writes. Reported as MB/s.

Each workload reports its wall-clock rate and the CPU time (user + system, client + server)
it used per operation; BPF programs run inside the syscalls, so their cost shows up as system
time, and CPU time per operation is far less disturbed by other load on a shared machine than
wall-clock rates are.

``--udp`` instead: a one-thread flood of 64-byte UDP datagrams (``--sends`` of them, sender
on CPU 0, receiver on CPU 1), each sender's and receiver's CPU time per datagram, in
interleaved rounds of three states: **off**, **classic** (the collector with classic
tracepoint programs, as on a kernel without BTF) and **btf** (the collector as it runs here:
the programs on hot paths BTF-typed); both collectors are loaded once and the state is
switched by detaching one's programs and attaching the other's before every flood. CPU time
per datagram shows what a classic tracepoint's dispatch costs besides its program's own run
time (which the kernel's run statistics measure; the dispatch they do not).

Rounds alternate "off" (nothing loaded) and "on" (``NetCollector`` started; one
``collect()`` after the workload), starting with a different state each round so drift and
noise from other work on the machine spread over both. Printed: the median of each, the
on/off ratio, then — in one extra round with kernel BPF run statistics enabled (they add
~20 ns per run, so they are kept out of the timed rounds) — ns per event and events per
round trip for each program, and the wall time of ``NetCollector.collect()`` and
``ProcessTable.refresh()`` on this host.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

from bpfdyno.ebpf.runstats import BpfRunStats, enable_bpf_stats
from bpfdyno.sources.net.collector import NetCollector
from bpfdyno.sources.procs.table import ProcessTable

SERVER = r"""
import socket, sys, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
print(srv.getsockname()[1], flush=True)
for _ in range(2):
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    mode = conn.recv(1)
    t0 = time.process_time()
    if mode == b"p":
        while True:
            data = conn.recv(64)
            if not data:
                break
            conn.sendall(data)
    else:
        while conn.recv(1 << 20):
            pass
        conn.sendall(b"k")
    conn.close()
    print(time.process_time() - t0, flush=True)
"""

CLIENT = r"""
import socket, sys, time
port, trips, bulk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
c = socket.create_connection(("127.0.0.1", port))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.sendall(b"p")
msg = b"x" * 64
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(trips):
    c.sendall(msg)
    got = 0
    while got < 64:
        got += len(c.recv(64 - got))
t1, c1 = time.perf_counter(), time.process_time()
c.close()
c = socket.create_connection(("127.0.0.1", port))
c.sendall(b"b")
chunk = b"y" * 65536
t2, c2 = time.perf_counter(), time.process_time()
for _ in range(bulk * 16):
    c.sendall(chunk)
c.shutdown(socket.SHUT_WR)
c.recv(1)
t3, c3 = time.perf_counter(), time.process_time()
print(trips / (t1 - t0), bulk / (t3 - t2), c1 - c0, c3 - c2)
"""


UDP_SINK = r"""
import socket, sys, time
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
rx.bind(("127.0.0.1", 0))
print(rx.getsockname()[1], flush=True)
rx.settimeout(5.0)  # the end markers can be dropped too, when its buffer is full
n, c0 = 0, time.process_time()
try:
    while rx.recv(2048) != b"end":
        n += 1
except TimeoutError:
    pass
print(n, time.process_time() - c0, flush=True)
"""

UDP_SENDER = r"""
import socket, sys, time
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.connect(("127.0.0.1", int(sys.argv[1])))
msg, send, n = b"x" * 64, tx.send, int(sys.argv[2])
t0, c0 = time.perf_counter(), time.process_time()
for _ in range(n // 100):
    for _ in range(100):
        send(msg)
t1, c1 = time.perf_counter(), time.process_time()
for _ in range(300):  # until the receiver has one (it may be behind, and drop some)
    try:
        tx.send(b"end")
    except ConnectionRefusedError:  # it got one and closed
        break
    time.sleep(0.01)
print(n / (t1 - t0), (c1 - c0) / n * 1e6)
"""


class UdpResult(NamedTuple):
    sends_per_s: float
    send_cpu_us: float  # the sender's CPU time (user + system) per datagram
    recv_cpu_us: float  # the receiver's per datagram it received


def run_udp(sends: int) -> UdpResult:
    """One pinned UDP flood: sender on CPU 0, receiver on CPU 1."""
    sink = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-c", UDP_SINK], stdout=subprocess.PIPE, text=True
    )
    assert sink.stdout is not None
    port = sink.stdout.readline().strip()
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", UDP_SENDER, port, str(sends)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    got, recv_cpu = sink.stdout.readline().split()
    sink.wait(30)
    return UdpResult(float(out[0]), float(out[1]), float(recv_cpu) / max(1, int(got)) * 1e6)


def udp_main(rounds: int, sends: int) -> int:
    """Off / classic / btf in interleaved rounds: medians and bests of each, against off.

    Both collectors are loaded once; a state is one collector's programs attached and the
    other's detached (off: both detached), switched before every flood, so the states
    alternate every few seconds and the machine's drift spreads over all three.
    """
    states = ("off", "classic", "btf")
    collectors = {"classic": NetCollector(btf_programs=False), "btf": NetCollector()}
    for c in collectors.values():
        c.start()
    programs = {name: c._require() for name, c in collectors.items()}
    fns = {name: list(p.program_ids()) for name, p in programs.items()}
    results: dict[str, list[UdpResult]] = {state: [] for state in states}
    try:
        for r in range(rounds):
            for state in states[r % 3 :] + states[: r % 3]:
                for name, program in programs.items():
                    program.suspend(fns[name], name != state)
                results[state].append(run_udp(sends))
                print(f"round {r} {state:8s}: {results[state][-1]}", file=sys.stderr)
    finally:
        for c in collectors.values():
            c.close()
    print(
        f"UDP flood, {sends} 64-byte datagrams a flood, {rounds} interleaved rounds; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    print(
        "| state | sends/s, median | sender CPU us per datagram, median | best "
        "| receiver CPU us per datagram, median | best |"
    )
    print("|---|---|---|---|---|---|")
    base = {
        i: (
            statistics.median(x[i] for x in results["off"]),
            min(x[i] for x in results["off"]),
        )
        for i in (1, 2)
    }
    for state in states:
        cells = [f"{statistics.median(x[0] for x in results[state]):,.0f}"]
        for i in (1, 2):
            for value, ref in (
                (statistics.median(x[i] for x in results[state]), base[i][0]),
                (min(x[i] for x in results[state]), base[i][1]),
            ):
                rel = "" if state == "off" else f" ({(value / ref - 1) * 100:+.1f} %)"
                cells.append(f"{value:.3f}{rel}")
        print(f"| {state} | " + " | ".join(cells) + " |")
    return 0


class Result(NamedTuple):
    trips_per_s: float
    bulk_mb_per_s: float
    cpu_us_per_trip: float  # client + server CPU time (user + system) per round trip
    cpu_ms_per_mb: float  # client + server CPU time per bulk MB


def run_workload(trips: int, bulk_mb: int) -> Result:
    """Wall-clock rates and CPU costs of one pinned client/server pair."""
    server = subprocess.Popen(
        ["taskset", "-c", "1", sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    port = server.stdout.readline().strip()
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", CLIENT, port, str(trips), str(bulk_mb)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    server_ping, server_bulk = (float(server.stdout.readline()) for _ in range(2))
    server.wait(30)
    rate, mbps, client_ping, client_bulk = map(float, out)
    return Result(
        rate,
        mbps,
        (client_ping + server_ping) / trips * 1e6,
        (client_bulk + server_bulk) / bulk_mb * 1e3,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--trips", type=int, default=20000)
    parser.add_argument("--bulk-mb", type=int, default=200)
    parser.add_argument("--udp", action="store_true", help="the UDP flood: off/classic/btf")
    parser.add_argument("--sends", type=int, default=300_000)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("run as root (loads BPF programs)", file=sys.stderr)
        return 2
    if args.udp:
        return udp_main(args.rounds, args.sends)

    results: dict[bool, list[Result]] = {False: [], True: []}
    for r in range(args.rounds):
        for on in (r % 2 == 0, r % 2 != 0):
            collector = NetCollector() if on else None
            if collector is not None:
                collector.start()
            try:
                results[on].append(run_workload(args.trips, args.bulk_mb))
                if collector is not None:
                    collector.collect()
            finally:
                if collector is not None:
                    collector.close()
            print(f"round {r} {'on ' if on else 'off'}: {results[on][-1]}", file=sys.stderr)

    for i, label in enumerate(
        ("pingpong round trips/s", "bulk MB/s", "CPU us per round trip", "CPU ms per bulk MB")
    ):
        off = statistics.median(x[i] for x in results[False])
        on = statistics.median(x[i] for x in results[True])
        print(f"{label:<24} off {off:>9.2f}  on {on:>9.2f}  on/off {on / off:.3f}")

    collector = NetCollector()
    collector.start()
    try:
        stats = BpfRunStats(collector._require().program_fds())
        fd = enable_bpf_stats()
        try:
            before = stats.read_counters()
            run_workload(args.trips, args.bulk_mb)
            after = stats.read_counters()
        finally:
            os.close(fd)
        print("program          runs   ns/run  runs/round-trip(approx)")
        for name in sorted(after):
            runs = after[name][0] - before[name][0]
            ns = after[name][1] - before[name][1]
            if runs:
                print(f"{name:<16}{runs:>8} {ns / runs:>8.0f} {runs / args.trips:>8.2f}")
        collect_s = []
        for _ in range(20):
            t0 = time.perf_counter()
            collector.collect()
            collect_s.append(time.perf_counter() - t0)
        conns = len(collector.connections())
        procs = len(collector.per_process())
        print(
            f"NetCollector.collect(): median {statistics.median(collect_s) * 1e3:.2f} ms "
            f"({conns} connections, {procs} processes in the maps)"
        )
        table = ProcessTable(net=collector.per_process)
        refresh_s = []
        for _ in range(20):
            t0 = time.perf_counter()
            snap = table.refresh()
            refresh_s.append(time.perf_counter() - t0)
        print(
            f"ProcessTable.refresh(): median {statistics.median(refresh_s) * 1e3:.2f} ms "
            f"({snap.total_processes} processes, {len(snap.rows)} rows)"
        )
    finally:
        collector.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
