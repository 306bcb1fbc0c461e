"""A peer's NCCL arrivals reach this agent on this agent's clock: the pull measures the peer's
clock offset (``GetClock``, as a job-wide trace does) and takes it off. A real peer agent
(gRPC server, Agent and Detection services) serves one rank whose arrivals are on its own
clock; that clock is made 2 s ahead or behind by shifting the time its ``GetClock`` reads
(two machines' clocks cannot differ on one), and a real `PeerSignals` pulls it."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon
from bpfdyno.app.detection_peers import PeerSignals
from bpfdyno.core.config import load
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import Arrivals, RankSignals, to_record
from bpfdyno.rpc.detection import RankSignal
from bpfdyno.server import agent as agent_server
from bpfdyno.server.detection import detection_servicer_factory
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.services.detection import DetectionService

#: When the peer's rank truly reached the collective (unix ns, the true clock).
TRUE_ARRIVAL_NS = 1_795_000_000_000_000_000
OFFSET_S = 2.0
#: How far the measured offset may be off: half a round trip on a Unix socket, on a loaded
#: machine a few ms; a sign error or no correction is off by 2 or 4 s.
TOLERANCE_NS = 250_000_000


@contextlib.asynccontextmanager
async def peer_agent(tmp: Path, records: list[RankSignal]) -> AsyncIterator[str]:
    sock = str(tmp / "peer.sock")
    cfg = load(None, [("grpc.socket", f'"{sock}"')])
    daemon = Daemon(cfg, [], [], catalog=CATALOG)
    service = DetectionService(EventLog(), lambda job_id: records)
    server = GrpcServer(
        cfg.grpc, AgentService(daemon, CATALOG), [detection_servicer_factory(service)]
    )
    await server.start()
    try:
        yield sock
    finally:
        await server.stop()


@pytest.mark.parametrize("offset_s", [OFFSET_S, -OFFSET_S], ids=["ahead", "behind"])
async def test_a_peer_s_arrivals_are_moved_onto_this_agent_s_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offset_s: float
) -> None:
    # The peer's clock: the true time plus the offset, in what its GetClock answers and in
    # the arrival it reports.
    shifted = SimpleNamespace(time=lambda: time.time() + offset_s)
    monkeypatch.setattr(agent_server, "time", shifted)
    on_its_clock = TRUE_ARRIVAL_NS + round(offset_s * 1e9)
    rank = RankSignals(
        "7", 3, 4242, 0.0, 1.0, 0.5, 0.0, 0.5, 0.0, 0,
        arrivals=(Arrivals(0xC0FFEE, 2, (12,), (on_its_clock,)),),
    )  # fmt: skip
    async with peer_agent(tmp_path, [to_record(rank, "node-b", time.time())]) as sock:
        peers = PeerSignals([sock], 0.2)
        await peers.start()
        try:
            deadline = time.monotonic() + 20
            while not peers.signals() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            (got,) = peers.signals()
        finally:
            await peers.stop()
    assert got.arrivals is not None
    (g,) = got.arrivals
    assert (g.comm_hash, g.seqs, g.comm_ranks) == (0xC0FFEE, (12,), 2)
    (arrival_ns,) = g.at_ns
    assert abs(arrival_ns - TRUE_ARRIVAL_NS) < TOLERANCE_NS, arrival_ns - TRUE_ARRIVAL_NS
