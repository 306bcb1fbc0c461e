"""A node's row from its agent's answers: which series count, sums and means, unknown as NaN,
the agent's state, the job's trainers."""

from __future__ import annotations

import asyncio
import math
import socket

import grpc
import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.client.cluster import FanOut, Node
from bpfdyno.client.cluster.summary import SUMMARY_METRICS, SummaryPoller, summarize_node
from bpfdyno.core.config import load
from bpfdyno.rpc.agent import AgentStatus, MetricsSnapshot
from bpfdyno.rpc.traces import Trainer
from bpfdyno.rpc.v1 import agent_pb2 as apb
from bpfdyno.rpc.v1 import agent_pb2_grpc, tracing_pb2_grpc
from bpfdyno.rpc.v1 import tracing_pb2 as tpb
from bpfdyno.rpc.wire import from_pb
from bpfdyno.server.agent import AgentServicer
from bpfdyno.server.tracing import TracingServicer
from bpfdyno.services.agent import AgentService
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.trainers import TrainerRegistry

NODE = Node("n1", "10.0.0.1:50051", (7,))


def series(name: str, value: float, **labels: str) -> apb.Series:
    return apb.Series(
        name=name,
        labels=[apb.Label(name=k, value=v) for k, v in labels.items()],
        points=[apb.Point(unix_seconds=100.0, value=value)],
    )


def status(*collectors: apb.CollectorStatus) -> apb.Status:
    return apb.Status(hostname="gpu-node-1", version="0.1.0", collectors=collectors)


def records(
    st: apb.Status, snap: apb.MetricsSnapshot, trainers: tpb.ListTrainersResponse | None
) -> tuple[AgentStatus, MetricsSnapshot, list[Trainer] | None]:
    """The agent's answers as `AgentClient` hands them over."""
    listed = None if trainers is None else [from_pb(Trainer, t) for t in trainers.trainers]
    return from_pb(AgentStatus, st), from_pb(MetricsSnapshot, snap), listed


def test_a_big_node_boils_down_to_its_row() -> None:
    snap = apb.MetricsSnapshot(
        unix_seconds=100.0,
        series=[
            series("cpu_utilization_ratio", 0.25, cpu="total"),
            *(series("cpu_utilization_ratio", 1.0, cpu=str(c)) for c in range(4)),
            series("memory_used_bytes", 3e9),
            series("memory_total_bytes", 8e9),
            series("gpu_utilization_ratio", 0.5, gpu="0", uuid="a"),
            series("gpu_utilization_ratio", 0.75, gpu="1", uuid="b"),
            series("gpu_memory_used_bytes", 1e9, gpu="0", uuid="a"),
            series("gpu_memory_used_bytes", 2e9, gpu="1", uuid="b"),
            series("gpu_memory_total_bytes", 8e9, gpu="0", uuid="a"),
            series("gpu_memory_total_bytes", 8e9, gpu="1", uuid="b"),
            series("gpu_power_watts", 100.0, gpu="0", uuid="a"),
            series("gpu_power_watts", 250.0, gpu="1", uuid="b"),
            series("net_rx_bytes_per_second", 1000.0, interface="lo"),
            series("net_rx_bytes_per_second", 300.0, interface="eth0"),
            series("net_rx_bytes_per_second", 200.0, interface="ib0"),
            series("net_tx_bytes_per_second", 50.0, interface="eth0"),
            series("net_tcp_retransmits_per_second", 2.0),
            series("rdma_port_bytes_per_second", 4e9, device="mlx5_0", port="1", direction="tx"),
            series("rdma_port_bytes_per_second", 1e9, device="mlx5_0", port="1", direction="rx"),
            series("rdma_port_bytes_per_second", 2e9, device="mlx5_1", port="1", direction="tx"),
            series("rdma_port_errors_per_second", 0.0, device="mlx5_0", port="1"),
            series("rdma_port_errors_per_second", 3.0, device="mlx5_1", port="1"),
            series("sched_runqueue_latency_seconds", 1e-6, quantile="0.5"),
            series("sched_runqueue_latency_seconds", 4e-5, quantile="0.99"),
        ],
    )
    st = status(
        apb.CollectorStatus(name="host", state=apb.COLLECTOR_STATE_OK),
        apb.CollectorStatus(
            name="net", state=apb.COLLECTOR_STATE_DEGRADED, reason="ring buffer full"
        ),
        apb.CollectorStatus(name="pmu", state=apb.COLLECTOR_STATE_UNAVAILABLE, reason="no PMU"),
    )
    trainers = tpb.ListTrainersResponse(
        trainers=[
            tpb.Trainer(pid=1, job_id=7, state=tpb.TRAINER_STATE_IDLE),
            tpb.Trainer(pid=2, job_id=7, state=tpb.TRAINER_STATE_TRACING),
            tpb.Trainer(pid=3, job_id=8, state=tpb.TRAINER_STATE_TRACING),  # another job
        ]
    )
    row = summarize_node(NODE, *records(st, snap, trainers), NODE.job_ids, elapsed_s=0.01)
    assert (row.hostname, row.version, row.ts, row.up) == ("gpu-node-1", "0.1.0", 100.0, True)
    assert row.agent_state == "degraded"
    assert row.problems == ("net: degraded: ring buffer full",)
    assert row.unavailable == ("pmu",)
    assert row.cpu_ratio == 0.25  # the total, not the cores
    assert (row.memory_used_bytes, row.memory_total_bytes) == (3e9, 8e9)
    assert (row.gpus, row.gpu_utilization_ratio) == (2, 0.625)
    assert (row.gpu_memory_used_bytes, row.gpu_memory_total_bytes) == (3e9, 16e9)
    assert row.gpu_power_watts == 350.0
    assert (row.net_rx_bytes_per_second, row.net_tx_bytes_per_second) == (500.0, 50.0)
    assert row.tcp_retransmits_per_second == 2.0
    assert (row.rdma_bytes_per_second, row.rdma_errors_per_second) == (7e9, 3.0)
    assert row.runqueue_p99_seconds == 4e-5
    assert (row.trainers, row.tracing) == (2, 1)


def test_what_a_node_does_not_have_is_unknown_not_zero() -> None:
    snap = apb.MetricsSnapshot(
        unix_seconds=5.0,
        series=[series("cpu_utilization_ratio", 0.5, cpu="total")],
    )
    st = status(apb.CollectorStatus(name="host", state=apb.COLLECTOR_STATE_STARTING))
    row = summarize_node(NODE, *records(st, snap, None))
    assert row.agent_state == "starting" and row.gpus == 0
    for value in (
        row.gpu_utilization_ratio,
        row.gpu_power_watts,
        row.net_rx_bytes_per_second,
        row.runqueue_p99_seconds,
        row.memory_total_bytes,
        row.rdma_bytes_per_second,  # no RDMA port on this node
        row.rdma_errors_per_second,
    ):
        assert math.isnan(value)
    assert row.trainers is None  # tracing not served there
    assert set(SUMMARY_METRICS) >= {"cpu_utilization_ratio", "sched_runqueue_latency_seconds"}


class CountingAgent(AgentServicer):
    """The agent's servicer, counting status requests."""

    def __init__(self) -> None:
        super().__init__(AgentService(Daemon(load(None, []), [])))
        self.status_calls = 0

    async def GetStatus(
        self, request: apb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> apb.Status:
        self.status_calls += 1
        return await super().GetStatus(request, context)


async def _serve(agent: CountingAgent, address: str) -> grpc.aio.Server:
    server = grpc.aio.server()
    agent_pb2_grpc.add_AgentServicer_to_server(agent, server)
    tracing = TracingService(["/tmp"], 60.0, TrainerRegistry(8, 60.0))
    tracing.on_request(b"\0trainer-1\0", KinetoRequest(3, 7, (4321,)))
    tracing_pb2_grpc.add_TracingServicer_to_server(TracingServicer(tracing), server)
    server.add_insecure_port(address)
    await server.start()
    return server


async def test_the_poller_asks_for_status_now_and_then_and_again_after_an_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k in ("BPFDYNO_TLS_CA", "BPFDYNO_TOKEN_FILE", "BPFDYNO_TLS_CERT", "BPFDYNO_TLS_KEY"):
        monkeypatch.delenv(k, raising=False)
    with socket.socket() as s:
        s.bind(("127.0.4.1", 0))
        address = f"127.0.4.1:{s.getsockname()[1]}"
    agent = CountingAgent()
    server = await _serve(agent, address)
    node = Node("n1", address, (7,))
    async with FanOut([node], timeout_s=2.0) as fanout:
        poller = SummaryPoller(fanout, status_every=5)
        rows = [(await poller.poll())[0] for _ in range(6)]
        assert agent.status_calls == 2  # polls 1 and 6
        assert all(r.up and r.trainers == 1 and r.hostname == socket.gethostname() for r in rows)
        await server.stop(0)
        (down,) = await poller.poll()
        assert not down.up and down.error is not None
        assert down.error.message.startswith(f"cannot reach the agent at {address}")
        server = await _serve(agent, address)
        try:
            # While the channel reconnects, one poll's calls may race it: its status call
            # can reach the agent while its metrics call fails, and that poll is still down.
            # What must hold is that the first poll that is up asked for the status again.
            for _ in range(20):  # the channel reconnects within its back-off
                before = agent.status_calls
                (back,) = await poller.poll()
                if back.up:
                    break
                await asyncio.sleep(0.25)
            assert back.up and back.hostname == socket.gethostname()
            assert agent.status_calls == before + 1  # asked again at once after the outage
        finally:
            await server.stop(0)
