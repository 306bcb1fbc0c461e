"""What other users control cannot harm the exporters' readers or the agent.

Real unprivileged users (``nobody`` and ``daemon``, through ``setpriv``, with the system's
Python) attack a real `bpfdyno serve`:

* a process named with terminal escapes and a bidirectional override: the agent shows the
  name escaped everywhere (the process table, Prometheus labels; OTLP takes the same
  samples);
* slow clients on the Prometheus port (connections that send a byte now and then and never
  finish a request): each user gets a few connections, closed on a deadline, the rest are
  refused at once; other users' scrapes keep working, and the agent stops on time.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from export_harness import AgentProcess, free_port, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

NOBODY = 65534
DAEMON = 1  # another unprivileged user, the legitimate scraper
TIMEOUT_S = 3.0  # [export.prometheus] timeout_s here
#: A process name of 15 bytes (the kernel's limit): set the terminal title, clear the
#: screen, then reverse the text direction.
EVIL_COMM = b"\x1b]0;\x1b[2J\xe2\x80\xaeevil"
SHOWN_COMM = "\\x1b]0;\\x1b[2J\\u202eevil"
#: An argument with a colour escape and a carriage return (rewrites the start of a line).
EVIL_ARG = "\x1b[31mroot-daemon\r"
SHOWN_ARG = "\\x1b[31mroot-daemon\\x0d"


class Site:
    def __init__(self, agent: AgentProcess, port: int) -> None:
        self.agent = agent
        self.port = port

    def scrape(self, timeout: float = 10.0) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout) as r:
            body: bytes = r.read()
        return body


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    tmp = tmp_path
    port = free_port()
    agent = AgentProcess(
        tmp,
        "export.prometheus.enabled=true",
        f'export.prometheus.listen="127.0.0.1:{port}"',
        "events.process_table_size=100000",  # every process is a row
        "collectors.gpu.enabled=false",
        "collectors.dcgm.enabled=false",
        f"export.prometheus.timeout_s={TIMEOUT_S}",
    )
    try:
        yield Site(agent, port)
    finally:
        agent.stop()


def test_a_process_name_cannot_send_escapes_to_readers(site: Site) -> None:
    octal = "".join(f"\\{b:03o}" for b in EVIL_COMM)  # printf's escapes, plain ASCII
    script = f"printf '{octal}' > /proc/self/comm; echo ready; read _"
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    evil = subprocess.Popen(
        [*as_nobody, "sh", "-c", script, EVIL_ARG],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert evil.stdout is not None and evil.stdout.readline() == b"ready\n"
        assert Path(f"/proc/{evil.pid}/comm").read_bytes() == EVIL_COMM + b"\n"

        def row() -> object | None:
            try:
                rows = site.agent.processes()
            except grpc.RpcError:  # the table's first build is still to come
                return None
            return next((r for r in rows if r.pid == evil.pid), None)

        found = wait_for("the process in the table", row)
        assert found.comm == SHOWN_COMM  # type: ignore[attr-defined]
        assert found.cmdline.endswith(SHOWN_ARG)  # type: ignore[attr-defined]
        assert found.user == "nobody"  # type: ignore[attr-defined]
        body = wait_for(
            "the process in a scrape",
            lambda: b if f'pid="{evil.pid}"'.encode() in (b := site.scrape()) else None,
        )
        assert b"\x1b" not in body and b"\r" not in body
        assert "\u202e".encode() not in body
        # The exposition format escapes the backslash itself: the reader sees SHOWN_COMM.
        label = SHOWN_COMM.replace("\\", "\\\\")
        lines = [x for x in body.splitlines() if f'pid="{evil.pid}"'.encode() in x]
        assert lines and all(f'comm="{label}"'.encode() in x for x in lines), lines[:3]
    finally:
        evil.kill()
        evil.wait()


SLOW = textwrap.dedent(
    """
    import json, socket, sys, time
    port, n = int(sys.argv[1]), int(sys.argv[2])
    conns, t0 = [], []
    for _ in range(n):
        t0.append(time.monotonic())
        conns.append(socket.create_connection(("127.0.0.1", port)))
        conns[-1].setblocking(False)
    print("connected", flush=True)
    ended, answers = {}, {}
    while len(ended) < n and time.monotonic() - t0[0] < 60:
        for i, c in enumerate(conns):
            if i in ended:
                continue
            try:
                data = c.recv(4096)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data:
                answers[i] = answers.get(i, b"") + data
                continue
            if data == b"":
                ended[i] = time.monotonic() - t0[i]
                continue
            try:
                c.send(b"G")  # a request that never ends
            except OSError:
                ended[i] = time.monotonic() - t0[i]
        time.sleep(0.25)
    print(json.dumps({"ended": [ended.get(i) for i in range(n)],
                      "answers": [answers.get(i, b"")[:12].decode() for i in range(n)]}))
    """
)
SCRAPE = textwrap.dedent(
    """
    import sys, time, urllib.request
    t0 = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=30) as r:
        body = r.read()
    print(r.status, len(body), round(time.monotonic() - t0, 2))
    """
)


def as_user(uid: int, code: str, *args: object) -> list[str]:
    """The system's Python (every user can run it) running ``code`` as ``uid``."""
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    return [*drop, "/usr/bin/python3", "-c", code, *map(str, args)]


def test_slow_clients_cannot_take_the_prometheus_port(site: Site) -> None:
    wait_for("a first round of metrics", lambda: len(site.scrape()) > 1000 or None)
    slow = subprocess.Popen(as_user(NOBODY, SLOW, site.port, 40), stdout=subprocess.PIPE, text=True)
    try:
        assert slow.stdout is not None and slow.stdout.readline() == "connected\n"
        # While they are held: another user's scrape, and root's, are served at once.
        for uid in (DAEMON, 0):
            r = subprocess.run(
                as_user(uid, SCRAPE, site.port), capture_output=True, text=True, timeout=60
            )
            status, size, seconds = r.stdout.split()
            assert (status, int(size) > 1000) == ("200", True), r.stderr
            assert float(seconds) < TIMEOUT_S, "a scrape waited for the slow clients"
        out = json.loads(slow.stdout.readline())
    finally:
        slow.kill()
        slow.wait()
    ended, answers = out["ended"], out["answers"]
    admitted = [e for e, a in zip(ended, answers, strict=True) if not a.startswith("HTTP/1.1 503")]
    refused = [e for e, a in zip(ended, answers, strict=True) if a.startswith("HTTP/1.1 503")]
    # 4 per user (export.prometheus.max_connections_per_peer); the rest at once, saying why.
    assert (len(admitted), len(refused)) == (4, 36), out
    assert all(e is not None and TIMEOUT_S - 0.5 < e < TIMEOUT_S + 5 for e in admitted), out
    assert all(e is not None and e < TIMEOUT_S for e in refused), out
    _, reason = site.agent.status()["export_prometheus"]
    assert "36 connections refused over the limits, 4 closed after 3 s" in reason, reason
    # The agent stops on time.
    t0 = time.monotonic()
    site.agent.stop()
    assert site.agent.proc.returncode == 0 and time.monotonic() - t0 < 5.0
