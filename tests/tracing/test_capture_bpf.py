"""The capture programs in the kernel (bpf/capture.bpf.c, bpf/nccl.bpf.c) through the
`CaptureManager`: only traced processes are recorded, exactly; nothing runs when nothing is
traced; losses are counted; NCCL probes find a library loaded late."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.trace_facts import TraceFacts, read_facts
from bpfdyno.core.budget import Costs, RequestedWork
from bpfdyno.core.config import BudgetSection, load
from bpfdyno.core.status import PartState
from bpfdyno.ebpf.runstats import BpfRunStats
from bpfdyno.sources.budget.controller import WARMUP_S, BudgetCollector
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import (
    KernelTrackRequest,
    NcclCall,
    NetBurst,
    NetEvent,
    OffCpu,
    ProcessCapture,
    TcpSample,
    Track,
)

pytestmark = pytest.mark.root

#: A child that connects to the test's server and sends on command: "send N K GAP_MS" (K
#: sends of N bytes), "seq K" (K sends of 1, 2, ... K bytes).
SENDER = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
print("local", c.getsockname()[1], flush=True)
for line in sys.stdin:
    words = line.split()
    if not words:
        break
    if words[0] == "seq":
        k = int(words[1])
        for i in range(1, k + 1):
            c.sendall(b"s" * i)
    else:
        n, k, gap = int(words[1]), int(words[2]), float(words[3])
        for _ in range(k):
            c.sendall(b"s" * n)
            if gap:
                time.sleep(gap / 1000)
    print("sent", k, flush=True)
c.close()
"""

NET_SCHED = KernelTrackRequest(frozenset({Track.NET, Track.SCHED}), 0.0)


class Sender:
    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", SENDER, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.local_port = int(self._line().split()[1])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"sender {self.pid} exited"
        return line

    def send(self, n: int, k: int, gap_ms: float = 0.0) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"send {n} {k} {gap_ms}\n")
        self.proc.stdin.flush()
        assert self._line() == f"sent {k}\n"

    def seq(self, k: int) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"seq {k}\n")
        self.proc.stdin.flush()
        assert self._line() == f"sent {k}\n"

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def server() -> Iterator[int]:
    """A loopback TCP server (in this untraced process) that reads and discards."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve(conn: socket.socket) -> None:
        with conn:
            while conn.recv(1 << 16):
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()


def manager_with(*overrides: tuple[str, str]) -> CaptureManager:
    m = CaptureManager(load(None, list(overrides)).capture)
    m.start()
    assert m.wait_loaded(120)
    return m


@pytest.fixture
def manager() -> Iterator[CaptureManager]:
    m = manager_with()
    yield m
    m.stop()


def record(
    m: CaptureManager, pid: int, request: KernelTrackRequest, work: object
) -> ProcessCapture:
    key = CaptureKey("t", pid)
    m.begin(key, request).result(30)  # the process is in the traced map now
    assert callable(work)
    work()
    return m.end(key).result(60)


def read_back(path: Path, base_ns: int, dur_ns: int, events: list[dict[str, Any]]) -> TraceFacts:
    """Write ``events`` (a capture's tracks) at ``path`` as a trace file of one profiler span
    ``dur_ns`` long from ``base_ns``, and read its facts as the analysis does."""
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
            "tid": "x", "ts": 0.0, "dur": dur_ns / 1000}  # fmt: skip
    path.write_text(json.dumps({"baseTimeNanoseconds": base_ns, "traceEvents": [span, *events]}))
    with path.open("rb") as f:
        return read_facts(f, str(path))


def test_only_the_traced_process_is_recorded_with_exact_bytes(
    manager: CaptureManager, server: int
) -> None:
    traced, other = Sender(server), Sender(server)
    try:

        def work() -> None:
            traced.send(1000, 50)  # back to back: coalesced into bursts
            other.send(777, 20)  # not traced: must not appear anywhere
            traced.send(1000, 5, gap_ms=20)  # 20 ms apart: a burst each

        cap = record(manager, traced.pid, NET_SCHED, work)
    finally:
        traced.close()
        other.close()
    bursts = [r for r in cap.records if isinstance(r, NetBurst)]
    sends = [b for b in bursts if not b.rx]
    assert {(b.socket.local, b.socket.peer) for b in sends} == {
        (f"127.0.0.1:{traced.local_port}", f"127.0.0.1:{server}")
    }
    assert {b.tid for b in bursts} == {traced.pid}
    assert sum(b.bytes for b in sends) == 55 * 1000
    assert sum(b.calls for b in sends) == 55  # one sendmsg per sendall of 1000 bytes
    gapped = [b for b in sends if b.calls == 1 and b.start_ns == b.end_ns]
    assert len(gapped) >= 5 and len(sends) < 55  # coalesced where calls came back to back
    assert all(b.socket.protocol == "tcp" for b in sends)
    assert all(r.tid == traced.pid for r in cap.records if isinstance(r, OffCpu))
    assert manager.kernel.foreign_records == 0
    assert cap.stats[Track.NET].calls == 55 and cap.stats[Track.NET].lost_kernel == 0
    assert (cap.dropped_over_cap, cap.pid) == (0, traced.pid)


def _links(prog_ids: set[int]) -> list[str]:
    out = subprocess.run(
        ["bpftool", "link", "show", "--json"], capture_output=True, text=True, check=True
    ).stdout
    return sorted(
        link.get("tp_name", "") for link in json.loads(out) if link.get("prog_id") in prog_ids
    )


def test_nothing_runs_in_the_kernel_while_nothing_is_traced(
    manager: CaptureManager, server: int
) -> None:
    """Attached only while a process is traced: BPF run statistics count no run of any
    capture function before or after, and the kernel holds no link of theirs."""
    sender = Sender(server)
    try:
        record(manager, sender.pid, NET_SCHED, lambda: sender.send(100, 10))  # loads them
        fds = manager.kernel.program_fds()
        ids = set(manager.kernel.program_ids().values())
        assert set(fds) == {
            "bpfdyno_csend",
            "bpfdyno_crecv",
            "bpfdyno_cstate",
            "bpfdyno_cretx",
            "bpfdyno_crstsnd",
            "bpfdyno_crstrcv",
            "bpfdyno_cdrop",
            "bpfdyno_cswitch",
            "bpfdyno_cwaking",
            "bpfdyno_cfork",
            "bpfdyno_cexit",
            "bpfdyno_creclaimin",
            "bpfdyno_creclaimout",
        }
        stats = BpfRunStats(fds)

        def window() -> dict[str, int]:
            result: dict[str, int] = {}
            done = threading.Event()

            def measure() -> None:
                result.update({n: s.runs for n, s in stats.measure(1.0).items()})
                done.set()

            t = threading.Thread(target=measure)
            t.start()
            while not done.is_set():  # sends, receives and context switches meanwhile
                sender.send(100, 20, gap_ms=1)
            t.join()
            return result

        assert _links(ids) == []
        assert set(window().values()) == {0}  # idle: not one run
        key = CaptureKey("t2", sender.pid)
        manager.begin(key, NET_SCHED).result(30)
        assert _links(ids) == sorted(
            [
                "sock_send_length",
                "sock_recv_length",
                "inet_sock_set_state",
                "tcp_retransmit_skb",
                "tcp_send_reset",
                "tcp_receive_reset",
                "kfree_skb",
                "sched_switch",
                "sched_waking",
                "sched_process_fork",
                "sched_process_exit",
                "mm_vmscan_memcg_reclaim_begin",
                "mm_vmscan_memcg_reclaim_end",
                "mm_vmscan_direct_reclaim_begin",
                "mm_vmscan_direct_reclaim_end",
            ]
        )
        traced = window()
        assert traced["bpfdyno_csend"] >= 20 and traced["bpfdyno_cswitch"] > 0
        manager.end(key).result(60)
        assert _links(ids) == []
        assert set(window().values()) == {0}
    finally:
        sender.close()


def test_ring_buffer_losses_are_counted_exactly(server: int) -> None:
    """A one-page ring buffer and 500 calls back to back, one record each (no coalescing):
    every call is kept or counted lost."""
    m = manager_with(
        ("capture.ringbuf_pages", "1"),
        ("capture.net_coalesce_gap_us", "0"),
        ("capture.net_tcp_sample_us", "0"),  # the calls' records only
    )
    sender = Sender(server)
    net = KernelTrackRequest(frozenset({Track.NET}), 0.0)
    try:
        cap = record(m, sender.pid, net, lambda: sender.send(10, 500))
    finally:
        sender.close()
        m.stop()
    sends = [r for r in cap.records if isinstance(r, NetBurst) and not r.rx]
    st = cap.stats[Track.NET]
    assert st.calls == 500 and all(b.calls == 1 for b in sends)
    assert st.lost_kernel > 0  # 4 KiB hold ~36 records; the rest waited for a drain
    assert len(sends) + st.lost_kernel == 500
    assert cap.dropped_over_cap == 0


def test_the_per_process_cap_keeps_the_newest(server: int) -> None:
    m = manager_with(
        ("capture.max_events_per_process", "100"),
        ("capture.net_coalesce_gap_us", "0"),
        ("capture.net_tcp_sample_us", "0"),
    )
    sender = Sender(server)
    net = KernelTrackRequest(frozenset({Track.NET}), 0.0)
    try:
        cap = record(m, sender.pid, net, lambda: sender.seq(500))  # sends of 1..500 bytes
    finally:
        sender.close()
        m.stop()
    assert cap.stats[Track.NET].lost_kernel == 0
    assert (len(cap.records), cap.dropped_over_cap, cap.cap) == (100, 400, 100)
    kept = sorted(r.bytes for r in cap.records if isinstance(r, NetBurst) and r.calls == 1)
    assert kept == list(range(401, 501))  # the newest 100 calls


#: In namespace A: connect to B's echo server, then on "ping K": K round trips of 100 bytes.
PINGER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
print("local", c.getsockname()[1], flush=True)
for line in sys.stdin:
    k = int(line.split()[1])
    for _ in range(k):
        c.sendall(b"p" * 100)
        got = 0
        while got < 100:
            got += len(c.recv(100 - got))
    print("done", k, flush=True)
"""

#: In namespace B: echo every connection's bytes back.
ECHO = r"""
import socket, sys, threading
s = socket.socket()
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen()
print("listening", flush=True)
def serve(c):
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := c.recv(65536):
        c.sendall(data)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""

WIRE = Path(__file__).resolve().parent / "delay_wire.py"


@pytest.fixture
def slow_link() -> Iterator[tuple[str, str]]:
    """Namespaces A (10.19.0.1) and B (10.19.0.2) joined by a wire that delays each frame
    10 ms each way: every round trip between them takes 20 ms and a little more."""
    tag = f"bdw{os.getpid()}"
    spaces = [f"{tag}-a", f"{tag}-b"]
    wire = subprocess.Popen(
        [sys.executable, str(WIRE), f"{tag}a", f"{tag}b", "10", "10", "0", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert wire.stdout is not None and wire.stdout.readline() == "ready\n"
        for ns, dev, addr in zip(
            spaces, (f"{tag}a", f"{tag}b"), ("10.19.0.1", "10.19.0.2"), strict=True
        ):
            subprocess.run(["ip", "netns", "add", ns], check=True)
            subprocess.run(["ip", "link", "set", dev, "netns", ns], check=True)
            subprocess.run(["ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
            subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        yield spaces[0], spaces[1]
    finally:
        wire.kill()
        wire.wait(10)
        for ns in spaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_each_tcp_connection_s_round_trip_time_is_sampled(
    manager: CaptureManager, slow_link: tuple[str, str]
) -> None:
    """A traced process's round trips over a link that adds 10 ms each way: its connection's
    samples say 20-25 ms; no other socket is sampled, and at most one sample per 5 ms."""
    a, b = slow_link
    echo = subprocess.Popen(
        ["ip", "netns", "exec", b, sys.executable, "-c", ECHO, "10.19.0.2", "7000"],
        stdout=subprocess.PIPE,
        text=True,
    )
    pinger = None
    try:
        assert echo.stdout is not None and echo.stdout.readline() == "listening\n"
        pinger = subprocess.Popen(
            ["ip", "netns", "exec", a, sys.executable, "-c", PINGER, "10.19.0.2", "7000"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert pinger.stdin is not None and pinger.stdout is not None
        local = int(pinger.stdout.readline().split()[1])

        def work() -> None:
            assert pinger is not None and pinger.stdin is not None and pinger.stdout
            pinger.stdin.write("ping 40\n")
            pinger.stdin.flush()
            assert pinger.stdout.readline() == "done 40\n"

        started = time.monotonic_ns()
        cap = record(manager, pinger.pid, NET_SCHED, work)
        elapsed = time.monotonic_ns() - started
    finally:
        for p in (pinger, echo):
            if p is not None:
                p.kill()
                p.wait(10)
    samples = [r for r in cap.records if isinstance(r, TcpSample)]
    assert {(s.socket.local, s.socket.peer) for s in samples} == {
        (f"10.19.0.1:{local}", "10.19.0.2:7000")
    }
    assert {s.tid for s in samples} == {pinger.pid}
    # 40 round trips of >= 20 ms: each call may sample, but at most once per 5 ms.
    assert 10 <= len(samples) <= elapsed // 5_000_000 + 1, len(samples)
    gaps = [b.ts_ns - a.ts_ns for a, b in itertools.pairwise(samples)]
    assert min(gaps) >= 5_000_000, gaps
    # After the first round trips the smoothed RTT is the link's 20 ms and a little more (the
    # echo server's turn: more on a loaded machine). Never less: the wire holds each frame.
    settled = sorted(s.srtt_us for s in samples[10:])
    assert settled[0] >= 20_000 and settled[len(settled) // 2] <= 30_000, settled
    last = samples[-1]
    assert last.rto_us >= 200_000  # the kernel's minimum RTO (200 ms) plus the RTT's share
    assert last.total_retrans == 0 and last.rto_fires == 0, last
    assert last.snd_cwnd >= 10, last
    assert not [r for r in cap.records if isinstance(r, NetEvent) and r.kind == "tcp_retransmit"]


SLEEPERS = r"""
import sys, threading, time

def sleeper():
    while True:
        time.sleep(0.002)

for _ in range(8):
    threading.Thread(target=sleeper, daemon=True).start()
print("ready", flush=True)
sys.stdin.readline()
"""


def test_a_full_map_is_said_in_the_trace_and_in_the_status() -> None:
    """Room for one traced thread and eight threads sleeping on and off: their off-CPU time
    cannot all be followed. The trace's sched note says how often, and the status counts
    the same."""
    m = manager_with(("capture.max_threads", "1"))
    child = subprocess.Popen(
        [sys.executable, "-c", SLEEPERS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        sched = KernelTrackRequest(frozenset({Track.SCHED}), 0.0)
        cap = record(m, child.pid, sched, lambda: time.sleep(0.5))
        status = m.status()
    finally:
        child.kill()
        child.wait()
        m.stop()
    found = re.fullmatch(
        r"(\d+) thread\(s\) of traced processes could not be followed \(more than \[capture\] "
        r"max_threads at once\): their off-CPU time is missing",
        cap.stats[Track.SCHED].note,
    )
    assert found, cap.stats[Track.SCHED].note
    n = int(found.group(1))
    assert n > 0
    assert status.state is PartState.OK
    assert (
        f"maps full since loading: traced threads ([capture] max_threads) {n} times"
        in status.reason
    )


NCCL_LATE = r"""
import ctypes, sys
sys.stdin.readline()  # load the library only when told
lib = ctypes.CDLL(sys.argv[1])
print("loaded", flush=True)
sys.stdin.readline()
P, N = ctypes.c_void_p, ctypes.c_size_t
r = lib.ncclAllReduce(P(0x10), P(0x20), N(123456), 9, 4, None, P(0xabc))
print("ret", r, flush=True)
sys.stdin.readline()
"""


def _libnccl() -> str:
    spec = importlib.util.find_spec("nvidia.nccl")
    assert spec is not None and spec.submodule_search_locations, "nvidia-nccl-cu12 missing"
    return os.path.join(next(iter(spec.submodule_search_locations)), "lib", "libnccl.so.2")


def test_nccl_found_when_loaded_after_the_trace_began(manager: CaptureManager) -> None:
    lib = _libnccl()
    child = subprocess.Popen(
        [sys.executable, "-c", NCCL_LATE, lib],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    key = CaptureKey("n", child.pid)
    try:
        manager.begin(key, KernelTrackRequest(frozenset({Track.NCCL}), 0.0)).result(30)
        assert manager.nccl.probed_libraries() == {}
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline() == "loaded\n"
        deadline = time.monotonic() + 30
        while not manager.nccl.probed_libraries():  # looked for again every second
            assert time.monotonic() < deadline, "libnccl never probed"
            time.sleep(0.1)
        child.stdin.write("\n")
        child.stdin.flush()
        ret = int(child.stdout.readline().split()[1])
        cap = manager.end(key).result(60)
    finally:
        child.kill()
        child.wait()
    [call] = [r for r in cap.records if isinstance(r, NcclCall)]
    assert (call.function, call.count, call.datatype, call.op, call.peer) == (
        "ncclAllReduce",
        123456,
        9,
        4,
        -1,
    )
    assert (call.sendbuff, call.recvbuff, call.comm, call.stream, call.ret) == (
        0x10,
        0x20,
        0,
        0xABC,
        ret,
    )
    assert call.tid == child.pid and call.end_ns >= call.start_ns
    assert cap.stats[Track.NCCL].note == ""  # found in the end
    assert manager.nccl.probed_libraries() == {}  # detached with its last traced process
    assert Path(lib).exists()


NCCL_ON_DEMAND = r"""
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
P, N = ctypes.c_void_p, ctypes.c_size_t
print("ready", flush=True)
for line in sys.stdin:  # "<count> <n>": n calls of ncclAllReduce with that count
    count, n = map(int, line.split())
    for _ in range(n):
        lib.ncclAllReduce(P(0x10), P(0x20), N(count), 9, 0, None, P(0x1))
    print("done", flush=True)
"""


class NcclCaller:
    """A process that maps libnccl and calls ncclAllReduce when told (`NCCL_ON_DEMAND`)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", NCCL_ON_DEMAND, _libnccl()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"

    def calls(self, count: int, n: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{count} {n}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "done\n"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def test_nccl_probes_go_off_the_capture_thread_and_never_count_twice(
    manager: CaptureManager,
) -> None:
    """The probes of a library are removed after its last traced process (slowly: an RCU
    grace period per probe) on a thread of their own. A trace of the same library right
    after finds them still going: it waits for them, and records each call once. Once the
    last trace ends — its process already gone — calls into the library run no BPF at all."""
    traced = NcclCaller()
    other = NcclCaller()  # maps the same file, never traced
    nccl = KernelTrackRequest(frozenset({Track.NCCL}), 0.0)

    def recorded(key: CaptureKey, count: int, n: int, exit_first: bool = False) -> list[int]:
        manager.begin(key, nccl).result(60)
        traced.calls(count, n)
        if exit_first:
            traced.kill()
        cap = manager.end(key).result(60)
        return [r.count for r in cap.records if isinstance(r, NcclCall)]

    try:
        assert recorded(CaptureKey("a", traced.proc.pid), 111, 3) == [111] * 3
        # Its probes are being removed now; the next trace must not see them twice.
        assert recorded(CaptureKey("b", traced.proc.pid), 222, 5) == [222] * 5
        assert recorded(CaptureKey("c", traced.proc.pid), 333, 2, exit_first=True) == [333] * 2
        stats = BpfRunStats(manager.nccl.program_fds())

        def runs_while_calling() -> dict[str, int]:
            result: dict[str, int] = {}
            t = threading.Thread(
                target=lambda: result.update({n: s.runs for n, s in stats.measure(0.5).items()})
            )
            t.start()
            while t.is_alive():
                other.calls(444, 10)
            t.join()
            return result

        deadline = time.monotonic() + 120
        while set((runs := runs_while_calling()).values()) != {0}:  # until removed
            assert time.monotonic() < deadline, f"the NCCL probes were never removed: {runs}"
    finally:
        traced.kill()
        other.kill()


def test_the_first_trace_loads_the_programs_before_the_preload_delay(server: int) -> None:
    """The daemon compiles the capture programs 5 s after its start (its collectors compile
    first); a trace that comes sooner loads them at once and is recorded from its start."""
    m = CaptureManager(load(None).capture, preload_delay_s=600)
    m.start()
    sender = Sender(server)
    try:
        assert m.status().state is PartState.STARTING
        cap = record(m, sender.pid, NET_SCHED, lambda: sender.send(1000, 3, gap_ms=5))
        status = m.status()
        assert status.state is PartState.OK
        assert status.reason.startswith("0 process(es) being recorded; 1 captured")
    finally:
        sender.close()
        m.stop()
    assert sum(r.bytes for r in cap.records if isinstance(r, NetBurst) and not r.rx) == 3000


def test_a_trace_keeps_its_full_tracks_under_a_busy_budget_and_its_cost_is_the_requesters(
    manager: CaptureManager, server: int
) -> None:
    """The capture runs only because someone asked for a trace. Under a budget that its
    recording alone exceeds many times over (0.01 % of a core), wired as the daemon wires it,
    the budget takes nothing from it: every send of the traced process is in its net track,
    its sleeps in its sched track, and their notes say nothing is missing; its programs' cost
    is left out of the agent's and charged to the requester."""
    requested = RequestedWork()
    shift = [0.0]
    budget = BudgetCollector(
        BudgetSection(cpu_ratio=0.0001),
        requested=requested,
        clock=lambda: time.monotonic() + shift[0],
    )
    budget.add_requested_programs(manager.requested_programs)
    budget.start()
    shift[0] = WARMUP_S  # past its warm-up: it acts on what it measures
    costs: list[Costs] = []
    traced = Sender(server)
    key = CaptureKey("t", traced.pid, requester="uid 1234")
    try:
        manager.begin(key, NET_SCHED).result(30)
        done = threading.Event()

        def measure() -> None:
            while not done.wait(0.2):
                budget.collect()
                costs.append(budget.state().costs)

        meter = threading.Thread(target=measure)
        meter.start()
        try:
            traced.send(100, 100, gap_ms=50)  # 5 s: at least two of the budget's windows
        finally:
            done.set()
            meter.join()
        cap = manager.end(key).result(60)
    finally:
        budget.close()
        traced.close()
    sends = [r for r in cap.records if isinstance(r, NetBurst) and not r.rx]
    assert sum(b.calls for b in sends) == 100
    offcpu = [r for r in cap.records if isinstance(r, OffCpu) and r.tid == traced.pid]
    sleeps = [r for r in offcpu if 45e6 <= r.on_ns - r.off_ns < 1e9]  # the 50 ms sleeps
    # Every sleep but a few: sampled a quarter of each second, as the budget did before, the
    # track held about 25 of them. (On a loaded machine the capture misses 1-3 of 100 sleeps
    # with no budget at all, seen on this VM: a loss of its own, not the budget's.)
    assert len(sleeps) >= 90, [(r.syscall, r.on_ns - r.off_ns) for r in offcpu]
    assert (cap.stats[Track.NET].lost_kernel, cap.stats[Track.SCHED].lost_kernel) == (0, 0)
    assert (cap.stats[Track.NET].note, cap.stats[Track.SCHED].note) == ("", "")
    measured = [c for c in costs if c.window_s > 0 and "uid 1234" in c.requested_ns_s]
    assert measured, costs
    capture_functions = {"bpfdyno_cswitch", "bpfdyno_cwaking", "bpfdyno_csend", "bpfdyno_crecv"}
    for c in measured:
        assert not capture_functions & set(c.bpf_ns_s), c.bpf_ns_s
        assert c.requested_ns_s["uid 1234"] > 0
    assert requested.by_reader()["uid 1234"] > 0
    assert requested.total_ns() == 0  # kernel time: none of the agent's threads spent it
    assert budget.state().held == ()


#: A parent with a child forked before the trace (waiting for "go") and one forked while
#: traced; each child sleeps 200 ms three times and writes a byte to its pipe after each sleep;
#: the parent reads the bytes one by one (blocked in read(2) until the child wakes it). The
#: sleeps are long enough that a parent slow to call read again still blocks in it for most
#: of the next sleep on a loaded machine.
PARENT_OF_WORKERS = r"""
import os, sys, time

def worker(wait_fd, out_fd):
    if wait_fd is not None:
        os.read(wait_fd, 1)
    for _ in range(3):
        time.sleep(0.2)
        os.write(out_fd, b"x")
    os._exit(0)

def fork(wait_fd):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        worker(wait_fd, w)
    os.close(w)
    return pid, r

go_r, go_w = os.pipe()
early, early_r = fork(go_r)
print("ready", early, flush=True)
sys.stdin.readline()
os.write(go_w, b"g")
for _ in range(3):
    os.read(early_r, 1)
late, late_r = fork(None)
for _ in range(3):
    os.read(late_r, 1)
os.waitpid(early, 0)
os.waitpid(late, 0)
print("done", late, flush=True)
sys.stdin.readline()
"""


def test_child_processes_are_recorded_with_the_parent_and_who_woke_it(
    manager: CaptureManager,
) -> None:
    """Child processes (DataLoader workers) are recorded as part of their parent's capture:
    one alive when the trace began and one forked while traced, each with its three 200 ms
    sleeps; and each of the parent's waits in read(2) names the child that woke it."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_OF_WORKERS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    other = subprocess.Popen(  # untraced, forking too: nothing of it may appear
        [sys.executable, "-c", PARENT_OF_WORKERS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    assert other.stdin is not None and other.stdout is not None
    try:
        ready = parent.stdout.readline().split()
        assert ready[0] == "ready"
        assert other.stdout.readline().startswith("ready")
        early = int(ready[1])
        late: list[int] = []

        def work() -> None:
            other.stdin.write("\n")
            other.stdin.flush()
            parent.stdin.write("\n")
            parent.stdin.flush()
            line = parent.stdout.readline().split()
            assert line[0] == "done"
            late.append(int(line[1]))
            assert other.stdout.readline().startswith("done")

        sched = KernelTrackRequest(frozenset({Track.SCHED}), 0.0)
        cap = record(manager, parent.pid, sched, work)
    finally:
        for p in (parent, other):
            p.kill()
            p.wait()
    offcpu = [r for r in cap.records if isinstance(r, OffCpu)]
    # 0: the traced process's own
    assert {r.pid for r in offcpu} == {0, early, late[0]}, (cap.stats, len(cap.records))
    for child in (early, late[0]):
        # The sleeps in clock_nanosleep (230): blocked intervals only. A child preempted
        # inside the call (entering it, or on its way out after the timer woke it) has a
        # runnable interval (state 0) with the same system call, seen once in a CI run.
        sleeps = [r for r in offcpu if r.pid == child and r.syscall == 230 and r.state != 0]
        # Three each; on a loaded machine one off-CPU record of a run was missing in ~1 of
        # 100 runs (cause not yet found), so one missing is allowed.
        assert 2 <= len(sleeps) <= 3, (child, sleeps, cap.stats)
        # time.sleep computes its deadline before the system call: a child preempted in
        # between (tens of ms on a loaded machine) sleeps that much less in the kernel.
        slept = [(r.on_ns - r.off_ns) / 1e6 for r in sleeps]
        assert all(120 <= ms < 2000 for ms in slept), slept
        # The timer's wake-up comes in an interrupt, where the kernel skips a BPF program
        # already running on that CPU (seen once in ~150 runs on a loaded machine): then the
        # wake is unknown (0), never wrong.
        for r in sleeps:
            assert r.wake_ns == 0 or r.off_ns + 120e6 <= r.wake_ns <= r.on_ns, r
    reads = [
        r
        for r in offcpu
        if r.tid == parent.pid and r.syscall == 0 and r.on_ns - r.off_ns >= 100_000_000
    ]
    woken_by = [(r.waker_pid, r.waker_tid) for r in sorted(reads, key=lambda r: r.off_ns)]
    parent_waits = [
        (r.syscall, (r.on_ns - r.off_ns) // 1_000_000, r.waker_pid)
        for r in sorted(offcpu, key=lambda r: r.off_ns)
        if r.tid == parent.pid
    ]
    # Each of the parent's waits in read(2), in order, names the child that woke it: three
    # on the early child, then three on the late one (one missing allowed, as above); a
    # wait blamed on the wrong child never is.
    expected = [(early, early)] * 3 + [(late[0], late[0])] * 3
    assert woken_by == sorted(woken_by, key=expected.index), (parent_waits, cap.stats)
    assert set(woken_by) == {(early, early), (late[0], late[0])}, (parent_waits, cap.stats)
    assert not Counter(woken_by) - Counter(expected), (parent_waits, cap.stats)
    assert len(woken_by) >= 5, (parent_waits, cap.stats)
    assert manager.kernel.foreign_records == 0
    assert manager.kernel.traced() == {}


#: Forks a child that sleeps 50 ms and exits; once it is gone, two more at once.
CHILDREN_ONE_AT_A_TIME = r"""
import os, sys, time

def child():
    time.sleep(0.05)
    os._exit(0)

sys.stdin.readline()
pids = []
for batch in (1, 2):
    forked = []
    for _ in range(batch):
        pid = os.fork()
        if pid == 0:
            child()
        forked.append(pid)
    for pid in forked:
        os.waitpid(pid, 0)
    pids += forked
print("done", *pids, flush=True)
sys.stdin.readline()
"""


def test_a_child_leaves_the_map_at_its_exit_and_a_full_map_is_said() -> None:
    """Room for two processes: the traced one and one child at a time. A child that exited
    leaves its place to the next (so workers forked every epoch keep being recorded); of two
    children at once, the second finds the map full, which the trace's sched note says."""
    m = manager_with(("capture.max_processes", "2"))
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILDREN_ONE_AT_A_TIME],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    pids: list[int] = []
    try:

        def work() -> None:
            parent.stdin.write("\n")
            parent.stdin.flush()
            words = parent.stdout.readline().split()
            assert words[0] == "done"
            pids.extend(int(w) for w in words[1:])

        sched = KernelTrackRequest(frozenset({Track.SCHED}), 0.0)
        cap = record(m, parent.pid, sched, work)
    finally:
        parent.kill()
        parent.wait()
        m.stop()
    first, second, third = pids
    sleeps = {r.pid for r in cap.records if isinstance(r, OffCpu) and r.syscall == 230}
    assert sleeps == {first, second}
    assert cap.stats[Track.SCHED].note == (
        "1 child process(es) of traced processes (DataLoader workers) could not be followed "
        "(more than [capture] max_processes at once): what they waited for is missing"
    )
    assert third not in sleeps
