"""`AgentClient` against the agent's real servicers: the calls only the CLI makes (audit, a
trace followed to the agent's verdict, summaries), in the API's records."""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.client.agent import VERDICT_S, AgentClient
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.core.config import load
from bpfdyno.rpc.traces import ProcessTraceState, TraceSpec
from bpfdyno.server.audit import audit_servicer_factory
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.server.tracing import servicer_factory
from bpfdyno.services.agent import AgentService
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.trainers import TrainerRegistry

JOB = 7
PID = 4321


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[AgentClient]:
    sock = str(tmp_path / "a.sock")
    cfg = load(None, [("grpc.socket", f'"{sock}"')])
    tracing = TracingService([str(tmp_path)], 30.0, TrainerRegistry(8, 60.0))
    tracing.on_request(b"\0trainer\0", KinetoRequest(3, JOB, (PID,)))  # an idle trainer
    extra = [servicer_factory(tracing), audit_servicer_factory(tracing.audit)]
    server = GrpcServer(cfg.grpc, AgentService(Daemon(cfg, [])), extra)
    await server.start()
    try:
        async with AgentClient(sock) as client:
            yield client
    finally:
        await server.stop(0)


async def test_a_trace_followed_to_the_agent_s_verdict_and_audited(
    agent: AgentClient, tmp_path: Path
) -> None:
    (trainer,) = await agent.trainers(JOB)
    assert (trainer.pid, trainer.job_id, trainer.uid) == (PID, JOB, None)
    spec = TraceSpec(log_file=str(tmp_path / "t.json"), iterations=2, job_id=JOB)
    started = await agent.start_trace(spec)
    assert [(p.pid, p.output_path) for p in started.triggered] == [
        (PID, str(tmp_path / f"t_{PID}.json"))
    ]
    # The trainer never polls again: the watch runs out, and the agent's state at that time
    # is the last word.
    t0 = time.monotonic()
    states = [st async for st in agent.follow_trace(started.trace_id, wait_s=0.5)]
    assert time.monotonic() - t0 >= 0.5 + VERDICT_S - 0.5
    assert [s.processes[0].state for s in states] == [ProcessTraceState.PENDING] * 2
    assert not states[-1].done and states[-1].trace_id == started.trace_id
    (record,) = await agent.audit()
    assert (record.action, record.decision, record.trace_id) == (
        "start_trace",
        "accepted",
        started.trace_id,
    )
    assert record.uid == os.geteuid() and record.transport == "grpc-unix"
    assert [(p.pid, p.output_path) for p in record.processes] == [
        (PID, str(tmp_path / f"t_{PID}.json"))
    ]


async def test_unknown_traces_and_refusals_in_the_client_s_words(
    agent: AgentClient, tmp_path: Path
) -> None:
    with pytest.raises(AgentError) as unknown:
        await agent.trace_summary("nope")
    assert unknown.value.kind is ErrorKind.FAILED
    assert str(unknown.value).startswith("the agent answered NOT_FOUND: no trace with id 'nope'")
    with pytest.raises(AgentError) as refused:
        await agent.start_trace(TraceSpec(log_file="/etc/t.json", job_id=JOB))
    assert refused.value.kind is ErrorKind.REFUSED
    assert refused.value.details.startswith("log file rejected by rule 'outside_allowed_dirs'")
    with pytest.raises(AgentError) as unserved:
        await agent.processes()
    assert unserved.value.kind is ErrorKind.UNIMPLEMENTED
    assert str(unserved.value) == (
        f"the agent at {agent.target} does not serve the Kernel API (an older agent, or that "
        "part is turned off in its configuration)"
    )
