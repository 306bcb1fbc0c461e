"""A real `bpfdyno serve` under a budget its own collection exceeds (0.05 % of a core, the
lowest it takes): the budget detaches the interrupt programs (``irq.softirq_detached``) by
itself; a real user's real PyTorch trainer, sending UDP datagrams to itself over loopback in
a thread, is traced with the ``fabric`` track. The file must hold its interrupt time, and
the step must still be in force after it (before the fix: *no interrupt time: the irq
collector's BPF program is not loaded*, no interrupt time at all)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest
from served_site import ServedSite, served_site, trainer

from bpfdyno.rpc.v1 import agent_pb2 as apb
from bpfdyno.rpc.v1 import agent_pb2_grpc as apb_grpc

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]

STEP = "irq.softirq_detached"
#: Run inside the trainer as Python starts (a ``sitecustomize.py`` on its ``PYTHONPATH``): a
#: thread that sends about 2000 datagrams a second to the process itself, NET_RX softirqs on
#: the CPUs it runs on, about 1 % of a core.
SENDER = r"""
import socket, threading, time
def send():
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    def drain():
        while True:
            rx.recv(2048)
    threading.Thread(target=drain, daemon=True).start()
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    msg = bytes(64)
    while True:
        for _ in range(20):
            tx.send(msg)
        time.sleep(0.01)
threading.Thread(target=send, daemon=True).start()
"""


async def reasons(site: ServedSite) -> dict[str, str]:
    async with grpc.aio.insecure_channel(f"unix:{site.sock}") as ch:
        status = await apb_grpc.AgentStub(ch).GetStatus(apb.GetStatusRequest(), timeout=10)
    return {c.name: c.reason for c in status.collectors}


async def test_a_served_trace_has_interrupt_time_while_the_budget_holds_the_step(
    short_tmp: Path,
) -> None:
    async with served_site(short_tmp, users=("alice",), sets=["budget.cpu_ratio=0.0005"]) as site:
        deadline = time.monotonic() + 180
        while STEP not in (await reasons(site)).get("budget", ""):
            assert time.monotonic() < deadline, f"{await reasons(site)}{site.diagnostics()}"
            await asyncio.sleep(1)
        sender = site.dirs["alice"] / "sitecustomize.py"
        sender.write_text(SENDER)
        sender.chmod(0o644)
        pid = await trainer(site, "alice", "--seconds", "300", PYTHONPATH=str(sender.parent))
        log_file = site.dirs["alice"] / "t.json"
        r = await site.cli("alice", "gputrace", "--pids", str(pid), "--duration-ms", "3000",
                           "--kernel-tracks", "fabric", "--log-file", str(log_file),
                           "--wait", "--timeout", "120")  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr + site.diagnostics()
        # The status says what the latest collection round saw (every round is 4x apart
        # under the budget's daemon step): wait for one after the trace.
        deadline = time.monotonic() + 240
        while "attached meanwhile" in (after := await reasons(site))["irq"]:
            assert time.monotonic() < deadline, f"still held after the trace: {after['irq']}"
            await asyncio.sleep(2)
        events = json.loads((log_file.parent / f"t_{pid}.json").read_text())["traceEvents"]

    notes = [v for e in events for k, v in e.get("args", {}).items() if k == "fabric_note"]
    assert not any("interrupt" in n for n in notes), notes
    interrupts = [e for e in events if e.get("name") == "fabric cpu interrupt time (ns)"]
    assert len(interrupts) >= 5, (len(interrupts), notes)
    assert sum(e["args"].get("NET_RX", 0) for e in interrupts) > 0
    # The step held throughout for the agent's own metrics; the programs held for the trace
    # no more once it ended (waited for above).
    assert STEP in after["budget"], after["budget"]
    assert "detached" in after["irq"], after["irq"]
