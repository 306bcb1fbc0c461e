"""`AgentClient`: one agent's whole API, in the API's own records.

The CLI's commands, the job-wide fan-out (`bpfdyno.client.cluster`) and the TUI's data
source all talk to agents through it, and so can tool builders::

    async with AgentClient("/run/bpfdyno/bpfdyno.sock") as agent:
        status = await agent.status()
        table = await agent.processes(sort_by="cpu", limit=10)
        started = await agent.start_trace(TraceSpec(log_file="/tmp/t.json", iterations=3))
        async for state in agent.follow_trace(started.trace_id, wait_s=60):
            print(state.summary())

Every method returns records of `bpfdyno.rpc` (status, metrics, processes, trainers, traces,
events, audit) or raises an `AgentError` (`bpfdyno.client.errors`) that says why and what to
do. One ``grpc.aio`` channel per client, made at the first call and kept: it is never
replaced, since closing a channel cancels every call on it, streams included; its reconnect
back-off is short (`CHANNEL_OPTIONS`), so an agent that restarts is reached again within
seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal, TypeVar

import grpc
from google.protobuf.message import Message

from bpfdyno.client.connection import (
    CHANNEL_OPTIONS,
    ChannelOptions,
    ClientSecurity,
    aio_channel,
)
from bpfdyno.client.errors import AgentError, ErrorKind, agent_error
from bpfdyno.rpc.agent import AgentStatus, Clock, MetricSpec, MetricsSnapshot, MetricsWindow, Series
from bpfdyno.rpc.audit import AuditRecord
from bpfdyno.rpc.detection import (
    DetectionEvent,
    GetRankSignalsResponse,
    ListEventsResponse,
    RankSignal,
)
from bpfdyno.rpc.kernel import EventsPage, KernelEvent, TcpConnection
from bpfdyno.rpc.processes import ProcessList
from bpfdyno.rpc.traces import (
    DcgmResult,
    TraceSpec,
    TraceStart,
    TraceStatus,
    TraceSummary,
    Trainer,
    spec_to_pb,
)
from bpfdyno.rpc.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    audit_pb2,
    audit_pb2_grpc,
    detection_pb2,
    detection_pb2_grpc,
    kernel_pb2,
    kernel_pb2_grpc,
    kineto_pb2,
    kineto_pb2_grpc,
    tracing_pb2,
    tracing_pb2_grpc,
)
from bpfdyno.rpc.wire import from_pb

R = TypeVar("R")

#: Deadline of a call when none is given.
DEFAULT_TIMEOUT_S = 5.0
#: Extra time after following a trace for the agent's verdict (it marks late processes
#: timed out at its deadline).
VERDICT_S = 5.0
#: Summarising a trace reads its files on the agent: it may take minutes for big ones.
SUMMARY_TIMEOUT_S = 300.0

_STUBS: dict[str, Any] = {
    "Agent": agent_pb2_grpc.AgentStub,
    "Kernel": kernel_pb2_grpc.KernelStub,
    "Tracing": tracing_pb2_grpc.TracingStub,
    "Audit": audit_pb2_grpc.AuditStub,
    "Kineto": kineto_pb2_grpc.KinetoStub,
    "Detection": detection_pb2_grpc.DetectionStub,
}


class AgentClient:
    """The API of the agent at ``target`` (a Unix socket path or ``host:port``).

    Args:
        target: where the agent listens.
        timeout_s: deadline of each unary call (streams have none unless given).
        security: TLS and token for a TCP target (None: plain text); by default read from
            the environment (`bpfdyno.client.connection`) at the first call.
        channel_options: gRPC channel options.
        timeout_advice: what to do about a call that timed out, in the caller's words.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        security: ClientSecurity | Literal["env"] | None = "env",
        channel_options: ChannelOptions = CHANNEL_OPTIONS,
        timeout_advice: str = "",
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._security = security
        self._options = channel_options
        self._advice = timeout_advice
        self._channel: grpc.aio.Channel | None = None
        self._stubs: dict[str, Any] = {}

    # -- plumbing ----------------------------------------------------------------------------

    def _stub(self, service: str) -> Any:
        stub = self._stubs.get(service)
        if stub is None:
            if self._channel is None:
                # Raises ClientSetupError for unusable TLS/token settings, at this call.
                self._channel = aio_channel(self.target, self._options, self._security)
            stub = self._stubs[service] = _STUBS[service](self._channel)
        return stub

    def _connected(self) -> bool:
        channel = self._channel
        return channel is not None and (
            channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY
        )

    def _error(self, e: grpc.RpcError, service: str, timeout_s: float | None) -> AgentError:
        return agent_error(
            e,
            self.target,
            service,
            timeout_s=timeout_s or self.timeout_s,
            connected=self._connected(),
            timeout_advice=self._advice,
        )

    async def _call(
        self, service: str, method: str, request: Message, timeout_s: float | None = None
    ) -> Any:
        timeout = timeout_s or self.timeout_s
        try:
            return await getattr(self._stub(service), method)(request, timeout=timeout)
        except grpc.RpcError as e:
            raise self._error(e, service, timeout) from None

    def _stream(
        self,
        record: type[R],
        service: str,
        method: str,
        request: Message,
        timeout_s: float | None = None,
    ) -> AsyncIterator[R]:
        """The records of a server stream until it ends. The call starts now, not at the
        first read (a subscription made before a query sees what happens in between); an
        error, or a call cancelled under the caller (the channel closed), raises
        `AgentError`."""
        call = getattr(self._stub(service), method)(request, timeout=timeout_s)
        return self._read(call, record, service, timeout_s)

    async def _read(
        self, call: Any, record: type[R], service: str, timeout_s: float | None
    ) -> AsyncIterator[R]:
        try:
            async for msg in call:
                yield from_pb(record, msg)
        except grpc.RpcError as e:
            raise self._error(e, service, timeout_s) from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise AgentError(
                ErrorKind.UNREACHABLE,
                f"a stream from the agent at {self.target} was cancelled (the connection closed)",
            ) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        """Close the channel (cancelling its calls); the client is not used afterwards."""
        channel, self._channel = self._channel, None
        self._stubs.clear()
        if channel is not None:
            await channel.close()

    async def __aenter__(self) -> AgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- Agent -----------------------------------------------------------------------------

    async def status(self) -> AgentStatus:
        """Version, host, uptime and each collector's state."""
        return from_pb(
            AgentStatus, await self._call("Agent", "GetStatus", agent_pb2.GetStatusRequest())
        )

    async def metric_specs(self) -> list[MetricSpec]:
        """Every metric the agent declares."""
        resp = await self._call("Agent", "ListMetricSpecs", agent_pb2.ListMetricSpecsRequest())
        return [from_pb(MetricSpec, s) for s in resp.specs]

    async def metrics(self, names: Sequence[str] = ()) -> MetricsSnapshot:
        """The latest value of every matching series (names, or prefixes ending in ``*``)."""
        req = agent_pb2.GetMetricsRequest(names=list(names))
        return from_pb(MetricsSnapshot, await self._call("Agent", "GetMetrics", req))

    async def metrics_window(
        self, names: Sequence[str] = (), start_s: float = 0.0, end_s: float = 0.0
    ) -> list[Series]:
        """Every matching series' points between ``start_s`` and ``end_s`` (epoch seconds on
        the agent's clock; 0: the agent's defaults, the last 5 minutes)."""
        req = agent_pb2.GetMetricsWindowRequest(
            names=list(names), start_unix_seconds=start_s, end_unix_seconds=end_s
        )
        return list(
            from_pb(MetricsWindow, await self._call("Agent", "GetMetricsWindow", req)).series
        )

    def stream_metrics(
        self, names: Sequence[str] = (), collectors: Sequence[str] = ()
    ) -> AsyncIterator[MetricsSnapshot]:
        """Every collection round of the matching collectors, as it happens, until the agent
        ends the stream."""
        req = agent_pb2.StreamMetricsRequest(names=list(names), collectors=list(collectors))
        return self._stream(MetricsSnapshot, "Agent", "StreamMetrics", req)

    async def clock(self, timeout_s: float | None = None) -> Clock:
        """The agent's wall clock when it received the request and when it answered."""
        req = agent_pb2.GetClockRequest()
        return from_pb(Clock, await self._call("Agent", "GetClock", req, timeout_s))

    # -- Kernel ----------------------------------------------------------------------------

    async def processes(self, sort_by: str = "", limit: int = 0, filter: str = "") -> ProcessList:
        """The agent's process table, filtered, sorted (`bpfdyno.rpc.processes` words) and cut
        to ``limit`` rows (0: all)."""
        req = kernel_pb2.ListProcessesRequest(sort_by=sort_by, limit=limit, filter=filter)
        return from_pb(ProcessList, await self._call("Kernel", "ListProcesses", req))

    async def connections(self, pid: int = 0, state: str = "") -> list[TcpConnection]:
        """The TCP connections the agent tracks (of one process, in one state)."""
        req = kernel_pb2.ListConnectionsRequest(pid=pid, state=state)
        resp = await self._call("Kernel", "ListConnections", req)
        return [from_pb(TcpConnection, c) for c in resp.connections]

    async def events(
        self, since_ns: int = 0, kinds: Sequence[str] = (), limit: int = 0
    ) -> EventsPage:
        """Events the agent's flight recorder still holds, oldest first (the newest ``limit``)."""
        req = kernel_pb2.GetEventsRequest(since_unix_ns=since_ns, kinds=list(kinds), limit=limit)
        return from_pb(EventsPage, await self._call("Kernel", "GetEvents", req))

    def stream_events(self, kinds: Sequence[str] = ()) -> AsyncIterator[KernelEvent]:
        """Events as they arrive (a reader that falls behind gets one ``events_lost``); the
        subscription starts at this call."""
        req = kernel_pb2.StreamEventsRequest(kinds=list(kinds))
        return self._stream(KernelEvent, "Kernel", "StreamEvents", req)

    # -- Detection -------------------------------------------------------------------------

    async def detection_events(self, job_id: str = "") -> list[DetectionEvent]:
        """The straggler and hang events the agent holds, oldest first (of one job)."""
        req = detection_pb2.ListEventsRequest(job_id=job_id)
        resp = await self._call("Detection", "ListEvents", req)
        return list(from_pb(ListEventsResponse, resp).events)

    async def rank_signals(self, job_id: str = "") -> list[RankSignal]:
        """The latest interval's signals of the agent's ranks (of one job): what a job's
        agents pull from each other to compare all its ranks."""
        req = detection_pb2.GetRankSignalsRequest(job_id=job_id)
        resp = await self._call("Detection", "GetRankSignals", req)
        return list(from_pb(GetRankSignalsResponse, resp).signals)

    def watch_detection_events(self, job_id: str = "") -> AsyncIterator[DetectionEvent]:
        """The events the agent holds, then each new one as it happens (of one job)."""
        req = detection_pb2.WatchEventsRequest(job_id=job_id)
        return self._stream(DetectionEvent, "Detection", "WatchEvents", req)

    # -- Tracing ---------------------------------------------------------------------------

    async def trainers(self, job_id: int | None = None) -> list[Trainer]:
        """The registered trainers (of one job)."""
        req = tracing_pb2.ListTrainersRequest()
        if job_id is not None:
            req.job_id = job_id
        resp = await self._call("Tracing", "ListTrainers", req)
        return [from_pb(Trainer, t) for t in resp.trainers]

    async def kineto_socket_dir(self, uid: int | None = None) -> str:
        """The per-user Kineto socket directory of ``uid`` (default: the caller's), made by
        the agent if needed: the trainers' KINETO_IPC_SOCKET_DIR."""
        req = kineto_pb2.OpenSocketDirRequest()
        if uid is not None:
            req.uid = uid
        resp = await self._call("Kineto", "OpenSocketDir", req)
        return str(resp.path)

    async def start_trace(self, spec: TraceSpec, timeout_s: float | None = None) -> TraceStart:
        """Ask for a trace: who was triggered (with each file's name), who not, and why."""
        resp = await self._call("Tracing", "StartTrace", spec_to_pb(spec), timeout_s)
        return from_pb(TraceStart, resp)

    async def trace(self, trace_id: str, timeout_s: float | None = None) -> TraceStatus:
        """A trace's state now."""
        req = tracing_pb2.GetTraceRequest(trace_id=trace_id)
        return from_pb(TraceStatus, await self._call("Tracing", "GetTrace", req, timeout_s))

    def watch_trace(
        self, trace_id: str, timeout_s: float | None = None
    ) -> AsyncIterator[TraceStatus]:
        """The trace now and after every change, until every process has ended."""
        req = tracing_pb2.GetTraceRequest(trace_id=trace_id)
        return self._stream(TraceStatus, "Tracing", "WatchTrace", req, timeout_s)

    async def follow_trace(self, trace_id: str, wait_s: float) -> AsyncIterator[TraceStatus]:
        """Each state of the trace until every process has ended, or for ``wait_s`` at most
        — then the agent's verdict at that time (late processes are marked timed out)."""
        try:
            async for st in self.watch_trace(trace_id, wait_s + VERDICT_S):
                yield st
                if st.done:
                    return
        except AgentError as e:
            if e.kind is not ErrorKind.TIMEOUT:
                raise
        yield await self.trace(trace_id, VERDICT_S)

    async def trace_summary(self, trace_id: str) -> TraceSummary:
        """Each file of a trace in numbers, read by the agent."""
        req = tracing_pb2.GetTraceRequest(trace_id=trace_id)
        resp = await self._call("Tracing", "GetTraceSummary", req, SUMMARY_TIMEOUT_S)
        return from_pb(TraceSummary, resp)

    async def dcgm_pause(self, duration_s: int) -> DcgmResult:
        """Pause the GPU profiling metrics for ``duration_s`` (dyno's dcgm-pause)."""
        req = tracing_pb2.DcgmPauseRequest(duration_s=duration_s)
        return from_pb(DcgmResult, await self._call("Tracing", "DcgmPause", req))

    async def dcgm_resume(self) -> DcgmResult:
        """Resume the GPU profiling metrics."""
        resp = await self._call("Tracing", "DcgmResume", tracing_pb2.DcgmResumeRequest())
        return from_pb(DcgmResult, resp)

    # -- Audit -----------------------------------------------------------------------------

    async def audit(self, since_seq: int = 0, limit: int = 0) -> list[AuditRecord]:
        """The audit trail's records after ``since_seq`` (the caller's own; root's: all)."""
        req = audit_pb2.ListAuditRecordsRequest(since_seq=since_seq, limit=limit)
        resp = await self._call("Audit", "ListAuditRecords", req)
        return [from_pb(AuditRecord, r) for r in resp.records]


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just a gRPC call under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
