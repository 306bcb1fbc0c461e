"""What other users control cannot harm the exporters' readers or the agent.

A real unprivileged user (``nobody``, through ``setpriv``) names its process with terminal
escapes and a bidirectional override: the agent shows the name escaped everywhere (the
process table, Prometheus labels; OTLP takes the same samples).
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from export_harness import AgentProcess, free_port, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

NOBODY = 65534
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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("safety")
    port = free_port()
    agent = AgentProcess(
        tmp,
        "export.prometheus.enabled=true",
        f'export.prometheus.listen="127.0.0.1:{port}"',
        "events.process_table_size=100000",  # every process is a row
        "collectors.gpu.enabled=false",
        "collectors.dcgm.enabled=false",
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
