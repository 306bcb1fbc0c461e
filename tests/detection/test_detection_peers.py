"""Comparison across nodes: two real agents (daemon, gRPC server, detection collector) on
Unix sockets, each with ranks of one job on "its node". Alone, an agent with two ranks has no
median to compare them with; pulling the other agent's ranks, it names its own straggler."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon
from bpfdyno.app.detection_peers import PeerSignals
from bpfdyno.client.agent import AgentClient
from bpfdyno.core.config import load
from bpfdyno.core.status import PartState
from bpfdyno.detection.collector import DetectionCollector, DetectionSettings
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess
from bpfdyno.rpc.detection import DetectionKind
from bpfdyno.server.detection import detection_servicer_factory
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.services.detection import DetectionService

SLEEPER = "import time\ntime.sleep(3600)\n"
SPINNER = "while True:\n    pass\n"
INTERVAL = "0.25"


@contextlib.contextmanager
def processes(*programs: tuple[str, int | None, int | None]) -> Iterator[list[int]]:
    """(source, RANK or None, CPU to pin to or None) each; their pids."""
    procs = []
    try:
        for source, rank, cpu in programs:
            env = dict(os.environ)
            if rank is not None:
                env["RANK"] = str(rank)
            p = subprocess.Popen([sys.executable, "-c", source], env=env)
            if cpu is not None:
                os.sched_setaffinity(p.pid, {cpu})
            procs.append(p)
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@dataclass
class Node:
    sock: str
    events: EventLog
    daemon: Daemon
    server: GrpcServer
    peers: PeerSignals | None


@contextlib.asynccontextmanager
async def node(tmp: Path, name: str, pids: list[int], peer_socks: list[str]) -> AsyncIterator[Node]:
    sock = str(tmp / f"{name}.sock")
    cfg = load(None, [("collectors.detection.interval_s", INTERVAL), ("grpc.socket", f'"{sock}"')])
    events = EventLog()
    peers = PeerSignals(peer_socks, float(INTERVAL)) if peer_socks else None
    collector = DetectionCollector(
        lambda: [RankProcess(pid, "7") for pid in pids],
        events,
        name,
        DetectionSettings.of(3.0, 6, 2, 3, 1, hang_after_s=600.0),
        peers=peers.signals if peers else None,
    )
    daemon = Daemon(cfg, [collector], [peers] if peers else [], catalog=CATALOG)
    service = DetectionService(events, collector.rank_signals)
    server = GrpcServer(
        cfg.grpc, AgentService(daemon, CATALOG), [detection_servicer_factory(service)]
    )
    await server.start()
    await daemon.start()
    try:
        yield Node(sock, events, daemon, server, peers)
    finally:
        await server.stop()
        await daemon.stop()


async def test_an_agent_names_its_straggler_against_the_job_s_ranks_on_another_node(
    tmp_path: Path,
) -> None:
    with processes(
        (SLEEPER, 0, None),
        (SLEEPER, 1, None),
        (SLEEPER, 2, None),
        (SPINNER, 3, 1),
        (SPINNER, None, 1),  # a hog on rank 3's CPU
    ) as (r0, r1, r2, r3, _hog):
        async with (
            node(tmp_path, "node-a", [r0, r1], []) as a,
            node(tmp_path, "node-b", [r2, r3], [a.sock]) as b,
            node(tmp_path, "node-c", [r2, r3], []) as alone,
        ):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not b.events.held():
                await asyncio.sleep(0.1)
            async with AgentClient(a.sock) as client:
                served = await client.rank_signals("7")
                assert await client.rank_signals("8") == []
            statuses = b.daemon.statuses()
    # A serves its two ranks, named as its.
    assert sorted((s.rank, s.pid, s.host) for s in served) == [
        (0, r0, "node-a"),
        (1, r1, "node-a"),
    ]
    # B compared its ranks with A's: rank 3 stands out against the job's median.
    first = b.events.held()[0]
    assert (first.kind, first.rank, first.pid, first.host) == (
        DetectionKind.SUSPECTED,
        3,
        r3,
        "node-b",
    )
    assert first.evidence[0].value > 0.2 > first.evidence[0].job_median
    # A has no straggler of its own; the same two ranks alone have no median to stand out of.
    assert a.events.held() == []
    assert alone.events.held() == []
    (peer_status,) = [s for s in statuses if s.name == "detection_peers"]
    assert peer_status.state is PartState.OK


async def test_a_peer_that_does_not_answer_is_named_and_the_rest_goes_on(
    tmp_path: Path,
) -> None:
    missing = str(tmp_path / "nobody.sock")
    with processes((SLEEPER, 0, None)) as (r0,):
        async with node(tmp_path, "node-b", [r0], [missing]) as b:
            await asyncio.sleep(1.0)
            assert b.peers is not None and b.peers.signals() == []
            (st,) = [s for s in b.daemon.statuses() if s.name == "detection_peers"]
            by_name = {s.name: s for s in b.daemon.statuses()}
    assert st.state is PartState.DEGRADED
    assert st.reason.startswith(f"1 of 1 peers not answering ({missing}: ")
    assert by_name["detection"].state is PartState.OK
