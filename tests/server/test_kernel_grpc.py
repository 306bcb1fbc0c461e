"""The Kernel gRPC service on a real grpc.aio server over a Unix socket, and `bpfdyno ps`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest

from bpfdyno.cli.ps import cmd_ps, human_bytes, register
from bpfdyno.core.events import FlightRecorder, KernelEvent
from bpfdyno.rpc.v1 import kernel_pb2 as pb
from bpfdyno.rpc.v1 import kernel_pb2_grpc as pb_grpc
from bpfdyno.server.kernel import kernel_servicer_factory
from bpfdyno.services.kernel import KernelService
from bpfdyno.sources.procs.table import ProcessTable


class Agent:
    def __init__(self, sock: str, recorder: FlightRecorder, table: ProcessTable) -> None:
        self.sock = sock
        self.recorder = recorder
        self.table = table


@contextlib.asynccontextmanager
async def serve(sock: str, table: ProcessTable) -> AsyncIterator[Agent]:
    recorder = FlightRecorder(max_age_s=600, max_bytes=1 << 20)
    table.refresh()
    server = grpc.aio.server()
    kernel_servicer_factory(KernelService(recorder, table=table, net=None))(server)
    server.add_insecure_port(f"unix:{sock}")
    await server.start()
    try:
        yield Agent(sock, recorder, table)
    finally:
        await server.stop(grace=None)


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    async with serve(
        str(tmp_path / "k.sock"), ProcessTable(top_n=50, pinned=lambda: {os.getpid()})
    ) as a:
        yield a


async def test_list_processes(agent: Agent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.sock}") as ch:
        stub = pb_grpc.KernelStub(ch)
        resp = await stub.ListProcesses(pb.ListProcessesRequest(sort_by="pid", limit=3))
        pids = [p.pid for p in resp.processes]
        assert len(pids) == 3 and pids == sorted(pids)
        assert resp.total_processes >= len(agent.table.snapshot.rows)
        resp = await stub.ListProcesses(pb.ListProcessesRequest(filter=f"pid={os.getpid()}"))
        (me,) = resp.processes
        assert me.pinned and me.user == "root" and me.ppid == os.getppid()
        assert me.HasField("cpu_ratio")
        # No sched/net collector configured: those columns are unset, not zero.
        assert not me.HasField("tcp_tx_bytes") and not me.HasField("oncpu_ns")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListProcesses(pb.ListProcessesRequest(sort_by="size"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown sort key 'size'" in (err.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListConnections(pb.ListConnectionsRequest())
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_get_events_types_attrs(agent: Agent) -> None:
    now = time.time_ns()
    agent.recorder.add(
        [
            KernelEvent(now - 2000, "exec", 10, 10, "true", {"filename": "/bin/true"}),
            KernelEvent(now - 1000, "tcp_retransmit", 11, 0, "python", {"dport": 9000}),
            KernelEvent(now, "gpu_xid", 12, 0, "", {"xid": 79, "temp": 81.5}),
        ]
    )
    async with grpc.aio.insecure_channel(f"unix:{agent.sock}") as ch:
        stub = pb_grpc.KernelStub(ch)
        resp = await stub.GetEvents(pb.GetEventsRequest())
        assert [e.kind for e in resp.events] == ["exec", "tcp_retransmit", "gpu_xid"]
        assert resp.oldest_unix_ns == now - 2000
        assert resp.events[0].attrs["filename"].string_value == "/bin/true"
        assert resp.events[1].attrs["dport"].int_value == 9000
        assert resp.events[2].attrs["temp"].double_value == 81.5
        resp = await stub.GetEvents(pb.GetEventsRequest(since_unix_ns=now - 1000))
        assert [e.pid for e in resp.events] == [11, 12]
        resp = await stub.GetEvents(pb.GetEventsRequest(kinds=["exec", "gpu_xid"], limit=1))
        assert [e.kind for e in resp.events] == ["gpu_xid"]
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetEvents(pb.GetEventsRequest(since_unix_ns=-5))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_stream_events_from_a_producer_thread(agent: Agent) -> None:
    async with grpc.aio.insecure_channel(f"unix:{agent.sock}") as ch:
        stub = pb_grpc.KernelStub(ch)
        call = stub.StreamEvents(pb.StreamEventsRequest(kinds=["tcp_close"]))
        deadline = time.monotonic() + 5
        while agent.recorder.stats().subscribers == 0:  # wait until the server subscribed
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        now = time.time_ns()

        def produce() -> None:
            for i in range(3):
                agent.recorder.add(
                    [
                        KernelEvent(now + i, "tcp_close", 100 + i, 0, "c", {"tx_bytes": i}),
                        KernelEvent(now + i, "exec", 1, 1, "x", {}),
                    ]
                )

        threading.Thread(target=produce).start()
        got = []
        async for ev in call:
            got.append((ev.pid, ev.attrs["tx_bytes"].int_value))
            if len(got) == 3:
                break
        call.cancel()
    assert got == [(100, 0), (101, 1), (102, 2)]
    deadline = time.monotonic() + 5
    while agent.recorder.stats().subscribers:  # the server closed the subscription
        assert time.monotonic() < deadline
        await asyncio.sleep(0.01)


def ps_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["ps", *argv])


async def test_ps_command_table_and_json(agent: Agent, capsys: pytest.CaptureFixture[str]) -> None:
    args = ps_args("--socket", agent.sock, "--filter", f"pid={os.getpid()}")
    assert await asyncio.to_thread(cmd_ps, args) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["PID", "USER", "CPU%", "RSS"]
    assert out[1].split()[:2] == [str(os.getpid()), "root"]
    assert "*" in out[1]  # pinned marker
    assert out[2].startswith("1 of ")  # the legend is wrapped to the terminal's width
    assert max(len(line) for line in out) <= shutil.get_terminal_size().columns

    args = ps_args("--socket", agent.sock, "--json", "--sort", "pid", "--limit", "2")
    assert await asyncio.to_thread(cmd_ps, args) == 0
    obj = orjson.loads(capsys.readouterr().out)
    assert len(obj["processes"]) == 2
    assert obj["processes"][0]["pid"] < obj["processes"][1]["pid"]

    args = ps_args("--socket", agent.sock, "--filter", "port=1")
    assert await asyncio.to_thread(cmd_ps, args) == 2
    assert "unknown filter key 'port'" in capsys.readouterr().err


@dataclass(frozen=True)
class NetTotals:
    tcp_tx_bytes: int
    tcp_rx_bytes: int
    udp_tx_bytes: int = 0
    udp_rx_bytes: int = 0
    tcp_retransmits: int = 0


async def test_ps_json_writes_64_bit_counters_as_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    me = os.getpid()
    big = 5 << 40  # 5 TiB sent: a uint64 that protobuf's JSON mapping would quote
    table = ProcessTable(top_n=5, net=lambda: {me: NetTotals(big, 7)}, pinned=lambda: {me})
    async with serve(str(tmp_path / "k.sock"), table) as agent:
        args = ps_args("--socket", agent.sock, "--json", "--filter", f"pid={me}")
        assert await asyncio.to_thread(cmd_ps, args) == 0
    (row,) = orjson.loads(capsys.readouterr().out)["processes"]
    assert row["tcp_tx_bytes"] == big and type(row["tcp_tx_bytes"]) is int
    assert row["tcp_rx_bytes"] == 7 and type(row["tcp_rx_bytes"]) is int
    assert type(row["rss_bytes"]) is int and row["rss_bytes"] > 0
    assert "oncpu_ns" not in row  # no sched collector: unknown, left out


def test_ps_without_an_agent_says_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cmd_ps(ps_args("--socket", str(tmp_path / "none.sock"))) == 1
    err = capsys.readouterr().err
    assert "cannot reach the agent" in err and "bpfdyno serve" in err


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 999, 1536, 12 << 20, 3 << 30)] == [
        "0B",
        "999B",
        "1.5K",
        "12M",
        "3.0G",
    ]
