"""`AgentDataSource` (over `AgentClient`) against the agent's real servicers on a real gRPC
server: the records it hands the UI, and every kind of error it raises.

The server is the agent's own `GrpcServer` with the real Agent, Kernel and Tracing
servicers over real services (a flight recorder, a process table read from this machine's
/proc, a trainer registry), in this process, on a Unix socket in a temporary directory.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import bpfdyno.sources.host.collector  # noqa: F401 - declares the host metrics the specs list
from bpfdyno.app.daemon import Daemon
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.core.config import load
from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.events import FlightRecorder
from bpfdyno.core.events import KernelEvent as RecordedEvent
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.traces import TraceSpec, spec_to_pb
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.server.kernel import kernel_servicer_factory
from bpfdyno.server.tracing import request_from_pb, servicer_factory
from bpfdyno.services.agent import AgentService
from bpfdyno.services.kernel import KernelService
from bpfdyno.services.tracing import TracingService
from bpfdyno.sources.procs.table import ProcessTable
from bpfdyno.tracing.trainers import TrainerRegistry
from bpfdyno.tui.datasource import AgentDataSource
from bpfdyno.tui.model import TraceProgress


@dataclass
class Served:
    sock: str
    recorder: FlightRecorder
    tracing: TracingService


async def _serve(
    sock: str, kernel: KernelService | None, tracing: TracingService | None
) -> GrpcServer:
    cfg = load(None, [("grpc.socket", f'"{sock}"')])
    extra = []
    if kernel is not None:
        extra.append(kernel_servicer_factory(kernel))
    if tracing is not None:
        extra.append(servicer_factory(tracing))
    server = GrpcServer(cfg.grpc, AgentService(Daemon(cfg, [])), extra)
    await server.start()
    return server


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    recorder = FlightRecorder(max_age_s=60, max_bytes=1 << 20)
    table = ProcessTable(top_n=1000)
    table.refresh()
    await asyncio.sleep(0.2)
    table.refresh()  # the second refresh has rates
    tracing = TracingService(["/tmp"], 30.0, TrainerRegistry())
    sock = str(tmp_path / "a.sock")
    server = await _serve(sock, KernelService(recorder, table), tracing)
    try:
        yield Served(sock, recorder, tracing)
    finally:
        await server.stop(0)


def _comm(pid: int) -> str:
    raw = Path(f"/proc/{pid}/stat").read_bytes()
    return raw[raw.find(b"(") + 1 : raw.rfind(b")")].decode()


async def test_status_specs_and_process_table(served: Served) -> None:
    source = AgentDataSource(served.sock)
    try:
        st = await source.status()
        assert st.pid == os.getpid()
        specs = {s.name: s for s in await source.metric_specs()}
        assert specs["cpu_utilization_ratio"].unit == "ratio"
        assert specs["cpu_utilization_ratio"].labels == ("cpu",)
        assert specs["cpu_utilization_ratio"].kind == "ratio"
        table = await source.processes(1000)
        me = next(r for r in table.processes if r.pid == os.getpid())
        assert me.comm == _comm(os.getpid())
        assert me.ppid == os.getppid()
        assert me.rss_bytes is not None and me.rss_bytes > 0
        # No sched/net collectors here: their columns are unknown, never 0.
        assert me.oncpu_ns is None and me.tcp_tx_bytes is None
        assert (await source.processes(1000, job_id="424242")).processes == ()
    finally:
        await source.close()


async def test_recent_events_then_the_stream(served: Served) -> None:
    now = time.time_ns()
    served.recorder.add(
        [
            RecordedEvent(
                now,
                "tcp_retransmit",
                11,
                0,
                "python",
                {"dport": 29500, "srtt_s": 0.00125, "daddr": "10.0.0.2"},
            )
        ]
    )
    source = AgentDataSource(served.sock)
    try:
        stream = source.stream_events()
        first = await anext(stream)
        assert first == KernelEvent(
            now,
            "tcp_retransmit",
            11,
            0,
            "python",
            {"daddr": "10.0.0.2", "dport": 29500, "srtt_s": 0.00125},
        )
        assert first.detail() == "daddr=10.0.0.2 dport=29500 srtt_s=0.00125"
        await asyncio.sleep(0.2)  # the stream's subscription is in place
        served.recorder.add([RecordedEvent(now + 1, "exec", 12, 12, "sh", {"filename": "/bin/sh"})])
        second = await asyncio.wait_for(anext(stream), 5)
        assert second == KernelEvent(now + 1, "exec", 12, 12, "sh", {"filename": "/bin/sh"})
    finally:
        await source.close()


async def test_tracing_answers_and_refusals(served: Served) -> None:
    source = AgentDataSource(served.sock)
    try:
        assert await source.trainers() == []
        req = TraceSpec(log_file="/tmp/tui_test_trace.json", pids=(1234,), duration_ms=500)
        st = TraceProgress(await source.start_trace(req))
        assert (st.state, st.finished, st.lines()) == ("nothing traced", True, [])
        assert st.message == "0 triggered, no registered process matched"
        # A request the service refuses: the form shows the service's own words.
        bad = TraceSpec(log_file="/etc/passwd.json", pids=(1234,), duration_ms=500)
        with pytest.raises(InvalidArgument) as expected:
            served.tracing.start_trace(request_from_pb(spec_to_pb(bad)))
        with pytest.raises(AgentError) as refused:
            await source.start_trace(bad)
        assert (refused.value.kind, refused.value.details) == (
            ErrorKind.REFUSED,
            str(expected.value),
        )
        assert str(refused.value) == f"refused the request: {expected.value}"
        # The Kineto endpoint down: the service is there but cannot trace.
        served.tracing.unavailable_reason = "the @dynolog@ name is taken by another daemon"
        with pytest.raises(AgentError) as down:
            await source.start_trace(req)
        assert down.value.kind is ErrorKind.UNAVAILABLE
        assert str(down.value) == "Tracing: the @dynolog@ name is taken by another daemon"
        assert (await source.status()).pid == os.getpid()  # still connected
    finally:
        await source.close()


async def test_parts_not_served_bad_requests_and_no_agent(tmp_path: Path) -> None:
    sock = str(tmp_path / "agent-only.sock")
    server = await _serve(sock, None, None)
    source = AgentDataSource(sock)
    try:
        with pytest.raises(AgentError) as kernel:
            await source.processes(10)
        assert kernel.value.kind is ErrorKind.UNIMPLEMENTED
        assert str(kernel.value) == (
            f"the agent at {sock} does not serve the Kernel API (an older agent, or that part "
            "is turned off in its configuration)"
        )
        with pytest.raises(AgentError, match="does not serve the Tracing API"):
            await source.trainers()
        with pytest.raises(AgentError) as bad:
            await source.metrics_window(["bad name"], 60)
        assert str(bad.value) == (
            "refused the request: bad metric name pattern 'bad name': use a metric name or a "
            "prefix ending in '*'"
        )
    finally:
        await source.close()
        await server.stop(0)
    missing = str(tmp_path / "none.sock")
    gone = AgentDataSource(missing)
    try:
        with pytest.raises(AgentError) as e:
            await gone.status()
        assert e.value.kind is ErrorKind.UNREACHABLE
        assert str(e.value).startswith(f"cannot reach the agent at {missing} (")
        assert str(e.value).endswith(
            "is it running? start it with `sudo bpfdyno serve`; if it runs elsewhere, pass "
            "--socket PATH or --host HOST:PORT (or set BPFDYNO_TARGET)"
        )
    finally:
        await gone.close()


async def test_kernel_without_a_process_table(tmp_path: Path) -> None:
    sock = str(tmp_path / "k.sock")
    server = await _serve(sock, KernelService(FlightRecorder(60, 1 << 20), None), None)
    source = AgentDataSource(sock)
    try:
        with pytest.raises(AgentError) as e:
            await source.processes(10)
        assert e.value.kind is ErrorKind.UNAVAILABLE
        assert str(e.value) == (
            "Kernel: the process table is disabled; enable [collectors.procs] in the config"
        )
    finally:
        await source.close()
        await server.stop(0)
