"""Kineto IPC reply latency: many simulated trainers polling the daemon at the same instant.

Usage (as root): ``python tests/bench/bench_kineto_ipc.py [--trainers 64] [--rounds 60]
[--write-doc docs/performance.md]``; add ``--netns`` to run in a fresh network namespace on
the abstract name @dynolog@, like real trainers.

Four daemon processes serve side by side: bpfdyno's `TracingComponent` as shipped
(add_reader, drain everything per wake-up, a 512-datagram socket queue, socket calls that
keep the GIL, 1 ms thread switch interval, each poll's sender credentials checked); the
same without the sender credentials (SO_PASSCRED off: what attributing polls costs); the
same without those three tunings (the
kernel's 10-datagram queue, Python's socket methods, CPython's 5 ms switch interval); and,
for reference, an emulation of dynolog's loop (one datagram, then a 10 ms sleep). The
client process binds one datagram socket per simulated trainer and, each round, sends
every trainer's ``req`` back to back, retrying a full daemon queue the way libkineto does
(10 ms, doubling). Per reply it records:

* **reply latency**: successful send → reply received; libkineto reads the reply within
  ~80 ms of its send, a later one is "missed" (the trainer then stays one reply behind);
* **end to end**: first send attempt → reply (includes waiting for room in the queue).

Rounds rotate over the targets and the daemon's load: idle; a CPU-bound Python thread in
the daemon (a collector doing pure-Python work, holding the GIL); the daemon's loop kept
busy by a coroutine that serialises metrics in 1 ms slices between yields (a metrics
stream). Reported: median and p99 over all replies of each kind, and the missed count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from doc_blocks import write_results

from bpfdyno.tracing.ipc import wire

SECTION = "## Kineto IPC reply latency"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux value; Python lacks the name
WINDOW_S = 0.080
LOADS = ("idle", "cpu_thread", "busy_loop")
#: The daemons compared: bpfdyno as shipped, bpfdyno without the kernel's sender
#: credentials (what attributing each poll costs), bpfdyno without its queue-length, GIL and
#: switch-interval tunings, and an emulation of dynolog's loop.
TARGETS = ("bpfdyno", "bpfdyno_no_creds", "bpfdyno_untuned", "dynolog_style")
#: Length of one uninterrupted stretch of other work on the daemon's event loop.
BUSY_SLICE_S = 0.001


# -- daemon side (child processes) -----------------------------------------------------------


def _cpu_thread(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(10_000):
            x = (x * 31 + i) % 1_000_003


async def _busy_loop(stop: asyncio.Event) -> None:
    """Keep the loop busy in BUSY_SLICE_S slices, like serialising a metrics stream."""
    import orjson

    chunk = {f"metric_{i}": {"labels": {"cpu": str(i % 64)}, "value": i * 0.5} for i in range(200)}
    while not stop.is_set():
        t_end = time.perf_counter() + BUSY_SLICE_S
        while time.perf_counter() < t_end:
            orjson.dumps(chunk)  # ~20 us a call, so the slice ends on time
        await asyncio.sleep(0)


async def serve_bpfdyno(socket_dir: str, tuned: bool, credentials: bool = True) -> None:
    from bpfdyno.app.tracing import TracingComponent
    from bpfdyno.core.config import load

    cfg = load(
        None,
        [("kineto.socket_dir", json.dumps(socket_dir)), ("legacy_rpc.enabled", "false")],
    )
    comp = TracingComponent(cfg, tune_switch_interval=tuned, queue_len=512 if tuned else 0)
    comp.endpoint.keep_gil = tuned
    comp.endpoint.pass_credentials = credentials
    await comp.start()
    await _control_loop()
    await comp.stop()


async def _control_loop() -> None:
    """Read "load <kind>" / "quit" lines from stdin; answer "ok" once the load runs."""
    loop = asyncio.get_running_loop()
    thread_stop, loop_stop = threading.Event(), asyncio.Event()
    thread: threading.Thread | None = None
    busy: asyncio.Task[None] | None = None
    print("ready", flush=True)
    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).strip()
        if line in ("", "quit"):
            break
        kind = line.split()[1]
        thread_stop.set()
        loop_stop.set()
        if thread is not None:
            thread.join()
        if busy is not None:
            await busy
        thread_stop, loop_stop = threading.Event(), asyncio.Event()
        thread, busy = None, None
        if kind == "cpu_thread":
            thread = threading.Thread(target=_cpu_thread, args=(thread_stop,), daemon=True)
            thread.start()
        elif kind == "busy_loop":
            busy = asyncio.create_task(_busy_loop(loop_stop))
        print("ok", flush=True)
    thread_stop.set()
    loop_stop.set()


async def serve_dynolog_style(socket_dir: str) -> None:
    """dynolog's IPC loop: receive at most one datagram, answer it, sleep 10 ms, repeat."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setblocking(False)
    if socket_dir:
        path = os.path.join(socket_dir, "dynolog")
        sock.bind(path)
    else:
        sock.bind(b"\0dynolog\0")
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                data, addr = sock.recvfrom(65536)
                if wire.parse_datagram(data):
                    sock.sendto(wire.encode_config_reply(""), addr)
            except (BlockingIOError, wire.MalformedDatagram):
                pass
            time.sleep(0.010)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    await _control_loop()
    stop.set()
    t.join()


# -- client side ---------------------------------------------------------------------------


class Trainers:
    """N datagram sockets, each bound to its own client name, polling one daemon."""

    def __init__(self, n: int, socket_dir: str, daemon_dir: str) -> None:
        self.daemon: str | bytes = (
            os.path.join(daemon_dir, "dynolog") if daemon_dir else b"\0dynolog\0"
        )
        self.socks = []
        for _ in range(n):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            name = f"dynoconfigclient{uuid.uuid4()}"
            s.bind(os.path.join(socket_dir, name) if socket_dir else f"\0{name}\0".encode())
            s.setblocking(False)
            # The kernel stamps each reply when it is queued to us, so the measurement does
            # not include this (single-threaded Python) client's own delay in reading it.
            s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            self.socks.append(s)
        # Every simulated trainer claims this process's real pid (and its parent), as a
        # real one does: the agent checks the claim against the kernel's credentials.
        self.requests = [wire.encode_request(3, 0, [os.getpid(), os.getppid()])] * n
        self.sel = selectors.DefaultSelector()
        for i, s in enumerate(self.socks):
            self.sel.register(s, selectors.EVENT_READ, i)

    def round(self) -> tuple[list[float], list[float], int, int]:
        """All trainers poll at once; returns (reply latencies, end-to-end, missed, retries)."""
        n = len(self.socks)
        self._drain_stale()
        first = [0] * n  # CLOCK_REALTIME ns, like the kernel's receive stamps
        sent = [0] * n
        replied = [0] * n
        next_try = [0.0] * n
        backoff = [0.010] * n
        pending_send = set(range(n))
        retries = 0
        deadline = time.perf_counter() + 12.0
        while time.perf_counter() < deadline and (pending_send or 0 in replied):
            now = time.perf_counter()
            for i in sorted(pending_send):
                if next_try[i] > now:
                    continue
                if not first[i]:
                    first[i] = time.time_ns()
                try:
                    self.socks[i].sendto(self.requests[i], self.daemon)
                    sent[i] = time.time_ns()
                    pending_send.discard(i)
                except BlockingIOError:  # daemon queue full: libkineto sleeps and retries
                    retries += 1
                    next_try[i] = now + backoff[i]
                    backoff[i] *= 2
            for key, _ in self.sel.select(timeout=0.001):
                i = key.data
                try:
                    _, ancillary, _, _ = self.socks[i].recvmsg(65536, 64)
                except BlockingIOError:
                    continue
                if sent[i] and not replied[i]:
                    replied[i] = _kernel_stamp(ancillary)
        lat = [(replied[i] - sent[i]) / 1e9 for i in range(n) if replied[i]]
        e2e = [(replied[i] - first[i]) / 1e9 for i in range(n) if replied[i]]
        missed = sum(1 for i in range(n) if not replied[i] or replied[i] - sent[i] > WINDOW_S * 1e9)
        return lat, e2e, missed, retries

    def _drain_stale(self) -> None:
        """Drop replies that arrived after an earlier round gave up waiting for them."""
        for s in self.socks:
            while True:
                try:
                    s.recv(65536)
                except BlockingIOError:
                    break

    def close(self) -> None:
        for s in self.socks:
            s.close()


def _kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("=qq", data[:16])
            return int(sec * 1_000_000_000 + nsec)
    return time.time_ns()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[k]


def _set_load(daemon: subprocess.Popen[str], load: str) -> None:
    assert daemon.stdin is not None and daemon.stdout is not None
    daemon.stdin.write(f"load {load}\n")
    daemon.stdin.flush()
    assert daemon.stdout.readline().strip() == "ok"


def run(args: argparse.Namespace) -> str:
    qlen = Path("/proc/sys/net/unix/max_dgram_qlen").read_text().strip()
    base = Path(tempfile.mkdtemp(prefix="bdb-", dir="/tmp"))
    targets = {}
    try:
        for target in TARGETS:
            sock_dir = "" if args.netns and target == "bpfdyno" else str(base / target)
            if sock_dir:
                os.mkdir(sock_dir)
            daemon = subprocess.Popen(
                [sys.executable, __file__, "--serve", target, "--socket-dir", sock_dir],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert daemon.stdout is not None and daemon.stdout.readline().strip() == "ready"
            targets[target] = (daemon, Trainers(args.trainers, sock_dir, sock_dir))
        results: dict[tuple[str, str], list[tuple[list[float], list[float], int, int]]] = {}
        for r in range(args.rounds + 2):
            load = args.loads[r % len(args.loads)]
            for target, (_, trainers) in targets.items():
                if target == "dynolog_style" and (load != "idle" or r % 2):
                    # The emulation is a reference for dynolog's serial loop only: under load
                    # it would measure Python (dynolog is C++). Slow, so every other idle round.
                    continue
                # Only the daemon being measured carries the load; the others stay idle.
                for other, (proc, _) in targets.items():
                    _set_load(proc, load if other == target else "idle")
                time.sleep(0.05)
                res = trainers.round()
                if r >= 2:  # the first rounds register the trainers and warm up
                    results.setdefault((target, load), []).append(res)
                time.sleep(0.02)
    finally:
        for daemon, trainers in targets.values():
            trainers.close()
            assert daemon.stdin is not None
            daemon.stdin.write("quit\n")
            daemon.stdin.flush()
            try:
                daemon.wait(timeout=10)
            except subprocess.TimeoutExpired:  # a daemon stuck under its load: the results stand
                daemon.kill()
                daemon.wait()
        shutil.rmtree(base, ignore_errors=True)
    return report(results, args, qlen)


def report(
    results: dict[tuple[str, str], list[tuple[list[float], list[float], int, int]]],
    args: argparse.Namespace,
    qlen: str,
) -> str:
    mode = "abstract @dynolog@ in a fresh network namespace" if args.netns else "socket directory"
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{args.trainers} simulated trainers polling at once, {mode}, "
        f"kernel net.unix.max_dgram_qlen = {qlen}.",
        "",
        "| daemon | daemon load | rounds | reply p50 | reply p99 | reply max | end-to-end p50 "
        "| end-to-end p99 | missed 80 ms | send retries / round |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    names = {
        "bpfdyno": "bpfdyno",
        "bpfdyno_no_creds": "bpfdyno without sender credentials",
        "bpfdyno_untuned": "bpfdyno untuned (queue 10, socket module, 5 ms switch)",
        "dynolog_style": "dynolog-style loop (emulated)",
    }
    for (target, load), rounds in sorted(results.items()):
        lat = [x for r in rounds for x in r[0]]
        e2e = [x for r in rounds for x in r[1]]
        missed = sum(r[2] for r in rounds)
        retries = statistics.mean(r[3] for r in rounds)
        total = len(rounds) * args.trainers
        lines.append(
            f"| {names[target]} | {load} | {len(rounds)} | {percentile(lat, 50) * 1e3:.2f} ms "
            f"| {percentile(lat, 99) * 1e3:.2f} ms | {max(lat) * 1e3:.2f} ms "
            f"| {percentile(e2e, 50) * 1e3:.2f} ms | {percentile(e2e, 99) * 1e3:.2f} ms "
            f"| {missed} of {total} | {retries:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--trainers", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=60, help="rounds (rotating loads)")
    parser.add_argument("--netns", action="store_true", help="fresh network namespace, abstract")
    parser.add_argument(
        "--loads", type=lambda v: v.split(","), default=list(LOADS), help="comma-separated"
    )
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    parser.add_argument("--doc-label", default="main", help="which results block to replace")
    parser.add_argument("--serve", choices=TARGETS, help=argparse.SUPPRESS)
    parser.add_argument("--socket-dir", default="", help=argparse.SUPPRESS)
    parser.add_argument("--in-netns", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve in ("bpfdyno", "bpfdyno_no_creds", "bpfdyno_untuned"):
        tuned = args.serve != "bpfdyno_untuned"
        credentials = args.serve != "bpfdyno_no_creds"
        asyncio.run(serve_bpfdyno(args.socket_dir, tuned, credentials))
        return
    if args.serve == "dynolog_style":
        asyncio.run(serve_dynolog_style(args.socket_dir))
        return
    if args.netns and not args.in_netns:
        argv = [
            a
            for i, a in enumerate(sys.argv[1:])
            if not a.startswith("--write-doc") and sys.argv[i] != "--write-doc"
        ]
        r = subprocess.run(
            ["unshare", "--net", sys.executable, __file__, *argv, "--in-netns"],
            capture_output=True,
            text=True,
        )
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            sys.exit(r.returncode)
        results = r.stdout.strip()
    else:
        results = run(args)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, f"bench_kineto_ipc:{args.doc_label}", results)


if __name__ == "__main__":
    main()
