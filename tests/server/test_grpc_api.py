"""The gRPC API on a real server over a Unix socket, through the generated stubs."""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import orjson
import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.cli.main import main
from bpfdyno.core.catalog import Catalog
from bpfdyno.core.config import GrpcSection, load
from bpfdyno.core.metrics import MetricKind, MetricTable, Sample, sample
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.server.grpc_server import AddressInUse, GrpcServer, check_tcp_free, prepare_unix_socket
from bpfdyno.services.agent import AgentService
from bpfdyno.sources.base import Collector, CollectorUnavailable

REG = MetricTable("t")
SPEC = REG.declare("test_grpc_level_bytes", MetricKind.GAUGE, "bytes", "A test level.", ("dev",))


class Fixed(Collector):
    name = "fixed"

    def __init__(self) -> None:
        self.n = 0

    def collect(self) -> Sequence[Sample]:
        self.n += 1
        return [sample(SPEC, 1000 * self.n, {"dev": "a"}), sample(SPEC, 7, {"dev": "b"})]


class Missing(Collector):
    name = "pmu"

    def start(self) -> None:
        raise CollectorUnavailable("no hardware PMU (VM?) — PMU metrics disabled")

    def collect(self) -> Sequence[Sample]:
        return []


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[str, Daemon]]:
    sock = str(tmp_path / "agent.sock")
    cfg = load(None, [("daemon.interval_s", "0.1"), ("grpc.socket", f'"{sock}"')])
    daemon = Daemon(cfg, [Fixed(), Missing()])
    server = GrpcServer(cfg.grpc, AgentService(daemon, Catalog([REG])))
    await server.start()
    await daemon.start()
    yield sock, daemon
    await server.stop()
    await daemon.stop()
    assert not os.path.exists(sock)


async def test_round_trip(agent: tuple[str, Daemon]) -> None:
    sock, daemon = agent
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o666  # every user, each as itself
    await asyncio.sleep(0.35)
    async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
        stub = pb_grpc.AgentStub(ch)
        st = await stub.GetStatus(pb.GetStatusRequest())
        assert st.version == "0.1.0"
        assert st.pid == os.getpid()
        assert st.kernel_release == os.uname().release
        assert st.hostname == socket.gethostname()
        by_name = {c.name: c for c in st.collectors}
        assert by_name["fixed"].state == pb.COLLECTOR_STATE_OK
        assert by_name["fixed"].collections >= 3
        assert by_name["pmu"].state == pb.COLLECTOR_STATE_UNAVAILABLE
        assert by_name["pmu"].reason == "no hardware PMU (VM?) — PMU metrics disabled"

        specs = await stub.ListMetricSpecs(pb.ListMetricSpecsRequest())
        (spec,) = [s for s in specs.specs if s.name == "test_grpc_level_bytes"]
        assert (spec.unit, spec.kind, list(spec.labels)) == ("bytes", pb.METRIC_KIND_GAUGE, ["dev"])

        snap = await stub.GetMetrics(pb.GetMetricsRequest(names=["test_grpc_*"]))
        values = {s.labels[0].value: s.points[0].value for s in snap.series}
        n = daemon.runners[0].collector.n  # type: ignore[attr-defined]
        assert values == {"a": 1000.0 * n, "b": 7.0}

        win = await stub.GetMetricsWindow(
            pb.GetMetricsWindowRequest(names=["test_grpc_level_bytes"])
        )
        a_series = next(s for s in win.series if s.labels[0].value == "a")
        assert [p.value for p in a_series.points] == [1000.0 * i for i in range(1, n + 1)]

        got = []
        async for snap in stub.StreamMetrics(pb.StreamMetricsRequest(names=["test_grpc_*"])):
            assert snap.collector == "fixed"
            got.append({s.labels[0].value: s.points[0].value for s in snap.series}["a"])
            if len(got) == 2:
                break
        assert got[1] - got[0] == 1000.0

        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await stub.GetMetricsWindow(
                pb.GetMetricsWindowRequest(start_unix_seconds=10, end_unix_seconds=5)
            )
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "after its end" in (ei.value.details() or "")

        with pytest.raises(grpc.aio.AioRpcError) as ei:
            async for _ in stub.StreamMetrics(pb.StreamMetricsRequest(collectors=["nope"])):
                pass
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_clock_brackets_the_agents_handling_of_the_call(
    agent: tuple[str, Daemon],
) -> None:
    sock, _ = agent
    async with grpc.aio.insecure_channel(f"unix:{sock}") as ch:
        stub = pb_grpc.AgentStub(ch)
        for _ in range(3):
            sent = time.time()
            clock = await stub.GetClock(pb.GetClockRequest())
            received = time.time()
            # One machine, one clock: the agent's two times lie inside our round trip.
            assert sent <= clock.receive_unix_seconds <= clock.transmit_unix_seconds <= received


async def test_cli_status_and_metrics_json(
    agent: tuple[str, Daemon], capsys: pytest.CaptureFixture[str]
) -> None:
    sock, _ = agent
    await asyncio.sleep(0.35)
    assert await asyncio.to_thread(main, ["status", "--socket", sock, "--json"]) == 0
    status = orjson.loads(capsys.readouterr().out)
    assert status["pid"] == os.getpid() and "agentUptimeSeconds" in status  # JSON names
    fixed = next(c for c in status["collectors"] if c["name"] == "fixed")
    assert type(fixed["collections"]) is int and fixed["collections"] >= 3  # a uint64
    assert fixed["state"] == "COLLECTOR_STATE_OK"
    argv = ["metrics", "--socket", sock, "--json", "test_grpc_level_bytes"]
    assert await asyncio.to_thread(main, argv) == 0
    snap = orjson.loads(capsys.readouterr().out)
    assert isinstance(snap["ts"], float) and snap["ts"] > 0
    values = {s["labels"]["dev"]: s["value"] for s in snap["series"]}
    assert values["b"] == 7 and values["a"] >= 1000
    assert {s["unit"] for s in snap["series"]} == {"bytes"}


async def test_second_server_on_same_socket_is_refused(agent: tuple[str, Daemon]) -> None:
    sock, _ = agent
    with pytest.raises(AddressInUse, match=f"gRPC socket {sock} is in use"):
        prepare_unix_socket(sock)


def test_stale_socket_is_replaced_and_non_socket_refused(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # the file stays, nobody listens
    prepare_unix_socket(str(stale))
    assert not stale.exists()
    regular = tmp_path / "file"
    regular.write_text("x")
    with pytest.raises(AddressInUse, match="exists and is not a socket"):
        prepare_unix_socket(str(regular))


def test_tcp_port_in_use_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(AddressInUse, match=f"cannot listen on 127.0.0.1:{port}"):
            check_tcp_free(f"127.0.0.1:{port}")


async def test_tcp_when_configured(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = GrpcSection(socket=str(tmp_path / "a.sock"), tcp=f"127.0.0.1:{port}", insecure_tcp=True)
    daemon = Daemon(load(None), [])
    server = GrpcServer(cfg, AgentService(daemon))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            st = await pb_grpc.AgentStub(ch).GetStatus(pb.GetStatusRequest())
            assert st.version == "0.1.0"
    finally:
        await server.stop()
