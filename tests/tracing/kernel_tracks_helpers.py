"""Reading the kernel tracks of merged trace files, and servers the test trainers talk to."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


def load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def events(path: str) -> list[dict[str, Any]]:
    evs = load(path)["traceEvents"]
    assert isinstance(evs, list)
    return evs


def window_us(evs: list[dict[str, Any]]) -> tuple[float, float]:
    """The profiler's own span: (start, end) in the file's µs."""
    (span,) = [e for e in evs if e.get("cat") == "Trace" and e.get("ph") == "X"]
    return span["ts"], span["ts"] + span["dur"]


def of_cat(evs: list[dict[str, Any]], cat: str, ph: str = "X") -> list[dict[str, Any]]:
    return [e for e in evs if e.get("cat") == cat and e.get("ph") == ph]


def info(evs: list[dict[str, Any]]) -> dict[str, Any]:
    (slice_,) = of_cat(evs, "bpfdyno.info")
    args: dict[str, Any] = slice_["args"]
    return args


def long_sleeps(
    evs: list[dict[str, Any]], pid: int, row: str, sleep_ms: float, steps: int
) -> list[dict[str, Any]]:
    """The "blocked: sleep" slices of the thread of ``row`` in ``pid``'s kernel tracks for its
    long sleeps (``net_sleep.py``'s ``--sleep-ms``), not its 2 ms ones, asserting one per step.

    Half the sleep counts as long: the slice runs from the switch-out to the timer's wakeup,
    and Python fixes the deadline before its call, so a thread preempted on its way into the
    sleep has a shorter blocked slice. A record the file says the kernel lost may be missing.
    """
    rows = row_names(evs, pid)
    sched = [e for e in of_cat(evs, "bpfdyno.sched") if e["pid"] == pid]
    on_row = [e for e in sched if rows.get(e["tid"]) == row]
    sleeps = [
        e
        for e in on_row
        if e["name"] == "blocked: sleep (clock_nanosleep)" and e["dur"] >= sleep_ms * 500
    ]
    lost = info(evs).get("sched_lost_ring_buffer_full", 0)
    assert steps - lost <= len(sleeps) <= steps, (
        lost,
        sorted({str(rows.get(e["tid"])) for e in sched}),
        [(e["name"], e["dur"]) for e in on_row if e["dur"] >= 1000],
    )
    return sleeps


def row_names(evs: list[dict[str, Any]], pid: int) -> dict[int, str]:
    """Synthetic tid -> the row's name, for the kernel tracks of ``pid``."""
    return {
        e["tid"]: e["args"]["name"]
        for e in evs
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == pid
    }


@dataclass
class EchoServer:
    """A TCP server on loopback: per connection, reads ``recv_bytes`` then sends
    ``send_bytes`` back, until the peer closes."""

    recv_bytes: int
    send_bytes: int
    sock: socket.socket = field(init=False)
    port: int = field(init=False)
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self.threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        reply = b"y" * self.send_bytes
        with conn, contextlib.suppress(OSError):
            while True:
                got = 0
                while got < self.recv_bytes:
                    chunk = conn.recv(self.recv_bytes - got)
                    if not chunk:
                        return
                    got += len(chunk)
                conn.sendall(reply)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def echo_server(recv_bytes: int, send_bytes: int) -> Iterator[EchoServer]:
    server = EchoServer(recv_bytes, send_bytes)
    try:
        yield server
    finally:
        server.close()
