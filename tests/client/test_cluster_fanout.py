"""`FanOut` against real gRPC servers on loopback addresses: one result per host in the
nodes' order, the concurrency bound, per-host deadlines, and the words of each failure.

The servers run the agent's own servicer; only ``GetClock`` is wrapped to count calls in
flight and, on one host, to hang — what an overloaded agent does.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.client.cluster import FanOut, Node, measure_clock
from bpfdyno.client.errors import ErrorKind
from bpfdyno.core.config import load
from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc
from bpfdyno.server.agent import AgentServicer
from bpfdyno.services.agent import AgentService


@dataclass
class InFlight:
    now: int = 0
    most: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)


class CountingAgent(AgentServicer):
    """The agent's servicer; GetClock waits for ``gate`` (if any) and counts calls in flight."""

    def __init__(self, counter: InFlight, hang: bool = False) -> None:
        cfg = load(None, [])
        super().__init__(AgentService(Daemon(cfg, [])))
        self._counter = counter
        self._hang = hang

    async def GetClock(
        self, request: agent_pb2.GetClockRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.Clock:
        c = self._counter
        c.now += 1
        c.most = max(c.most, c.now)
        try:
            if self._hang:
                await asyncio.sleep(3600)
            await c.release.wait()
            return await super().GetClock(request, context)
        finally:
            c.now -= 1


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """These servers speak plain text: no TLS or token settings from the environment."""
    for k in ("BPFDYNO_TLS_CA", "BPFDYNO_TOKEN_FILE", "BPFDYNO_TLS_CERT", "BPFDYNO_TLS_KEY"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture
async def agents() -> AsyncIterator[tuple[list[Node], InFlight, list[grpc.aio.Server]]]:
    counter = InFlight()
    nodes, servers = [], []
    for i in range(6):
        host = f"127.0.3.{i + 1}"
        server = grpc.aio.server()
        agent_pb2_grpc.add_AgentServicer_to_server(CountingAgent(counter, hang=i == 4), server)
        port = server.add_insecure_port(f"{host}:0")
        await server.start()
        servers.append(server)
        nodes.append(Node(f"h{i}", f"{host}:{port}"))
    try:
        yield nodes, counter, servers
    finally:
        await asyncio.gather(*(s.stop(0) for s in servers))


async def test_one_result_per_host_in_order_whatever_each_host_does(
    agents: tuple[list[Node], InFlight, list[grpc.aio.Server]],
) -> None:
    nodes, counter, _ = agents
    closed = Node("closed", f"127.0.3.9:{_free_port('127.0.3.9')}")  # nothing listens
    counter.release.set()
    async with FanOut([*nodes, closed], timeout_s=1.0) as fanout:
        t0 = time.monotonic()
        results = await fanout.map(lambda node, ch: measure_clock(ch, timeout_s=5))
        took = time.monotonic() - t0
    assert [r.node for r in results] == [*nodes, closed]
    assert [r.ok for r in results] == [True, True, True, True, False, True, False]
    hung, refused = results[4], results[6]
    assert hung.error is not None and hung.error.kind is ErrorKind.TIMEOUT
    assert hung.error.message == (
        f"no answer from the agent at {nodes[4].target} within 1 s (overloaded, or a firewall "
        "drops the packets?); raise the per-host timeout if it is just slow"
    )
    assert refused.error is not None and refused.error.kind is ErrorKind.UNREACHABLE
    assert "Connection refused" in refused.error.message
    for r in results:
        if r.ok:
            assert r.value is not None and abs(r.value.offset_s) < 0.5
    # Hosts are asked at once: the slow one costs its deadline once, not per host.
    assert took < 5.0


async def test_concurrency_is_bounded_unless_asked_otherwise(
    agents: tuple[list[Node], InFlight, list[grpc.aio.Server]],
) -> None:
    nodes, counter, _ = agents
    healthy = [n for i, n in enumerate(nodes) if i != 4]

    async def release_when(count: int) -> None:
        # Let the calls go once ``count`` are in flight (or the bound stops them short).
        while counter.now < count:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # room for any call beyond the bound to arrive, wrongly
        counter.release.set()

    async with FanOut(healthy, timeout_s=30, concurrency=2) as fanout:
        waiter = asyncio.create_task(release_when(2))
        results = await fanout.map(lambda node, ch: measure_clock(ch, samples=1))
        await waiter
        assert all(r.ok for r in results)
        assert counter.most == 2
        counter.release.clear()
        counter.most = 0
        waiter = asyncio.create_task(release_when(len(healthy)))
        results = await fanout.map(lambda node, ch: measure_clock(ch, samples=1), bounded=False)
        await waiter
        assert all(r.ok for r in results)
        assert counter.most == len(healthy)
