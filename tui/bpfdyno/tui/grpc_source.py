"""`GrpcDataSource`: the UI's data from a running agent over gRPC.

One ``grpc.aio`` channel for the whole session. It is never replaced: closing a channel
cancels every call on it, streams included. Instead its reconnect back-off is kept short
(at most 2 s rather than gRPC's default of two minutes), so a restarted agent is reached
again within seconds and the UI's own retry loop decides what to show meanwhile.

Status codes become the UI's three errors: UNAVAILABLE and DEADLINE_EXCEEDED mean the agent
cannot be reached (`Disconnected`), UNIMPLEMENTED means this agent does not serve that part
of the API (`ServiceUnavailable`), anything else is a refused request (`RequestFailed`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc

from bpfdyno.client.connection import (
    CHANNEL_OPTIONS,
    ClientSetupError,
    aio_channel,
    unreachable_message,
)
from bpfdyno.rpc.traces import TraceSpec, spec_to_pb
from bpfdyno.rpc.v1 import (
    agent_pb2,
    agent_pb2_grpc,
    kernel_pb2,
    kernel_pb2_grpc,
    tracing_pb2,
    tracing_pb2_grpc,
)
from bpfdyno.tui import convert, convert_tracing
from bpfdyno.tui.errors import DataSourceError, Disconnected, RequestFailed, ServiceUnavailable
from bpfdyno.tui.records import (
    AgentStatus,
    KernelEventInfo,
    MetricSpecInfo,
    MetricsRound,
    ProcessTable,
    SeriesPoints,
    TraceStatus,
    TrainerInfo,
)

#: Events of the recent past shown when the UI connects.
RECENT_EVENTS = 200
_DISCONNECTED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class GrpcDataSource:
    """Data from the agent at ``target`` (a Unix socket path or ``host:port``).

    Args:
        target: where the agent listens.
        call_timeout_s: deadline of each unary call.
    """

    def __init__(self, target: str, call_timeout_s: float = 5.0) -> None:
        self._target = target
        self._timeout = call_timeout_s
        self._channel: grpc.aio.Channel | None = None

    @property
    def target(self) -> str:
        """Where the agent listens, as given."""
        return self._target

    def _chan(self) -> grpc.aio.Channel:
        if self._channel is None:
            self._channel = aio_channel(self._target, options=CHANNEL_OPTIONS)
        return self._channel

    def _error(self, e: grpc.RpcError, service: str) -> DataSourceError:
        """The UI error for a failed call of one of the agent's services."""
        if isinstance(e, ClientSetupError):  # our own TLS/token settings: say which and why
            return Disconnected(e.message)
        code = e.code() if isinstance(e, grpc.aio.AioRpcError) else None
        details = e.details() if isinstance(e, grpc.aio.AioRpcError) else ""
        if code == grpc.StatusCode.UNAVAILABLE and service != "Agent" and self._connected():
            # The agent answered, but this service says it cannot work right now (e.g. the
            # Kineto endpoint is down): a reason for its panel, not a lost agent.
            return ServiceUnavailable(f"{service}: {details}")
        if code in _DISCONNECTED or code is None:
            return Disconnected(self._unreachable(details))
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return ServiceUnavailable(
                f"the agent at {self._target} does not serve the {service} API "
                "(an older agent, or that part is turned off in its configuration)"
            )
        name = code.name if code is not None else "an error"
        return RequestFailed(details or f"the agent at {self._target} answered {name}")

    def _call_cancelled(self, what: str) -> Disconnected:
        """A stream's call was cancelled under us (the channel closed): the agent is lost."""
        return Disconnected(f"the {what} stream from the agent at {self._target} was cancelled")

    def _unreachable(self, details: str) -> str:
        """Why the agent cannot be reached, and what to do about it."""
        return unreachable_message(self._target, details)

    def _connected(self) -> bool:
        channel = self._channel
        return channel is not None and (
            channel.get_state(try_to_connect=False) == grpc.ChannelConnectivity.READY
        )

    # -- Agent service -------------------------------------------------------------------

    def _agent(self) -> agent_pb2_grpc.AgentStub:
        return agent_pb2_grpc.AgentStub(self._chan())

    async def status(self) -> AgentStatus:
        """The agent's identity and its collectors' states."""
        try:
            st = await self._agent().GetStatus(agent_pb2.GetStatusRequest(), timeout=self._timeout)
        except grpc.RpcError as e:
            raise self._error(e, "Agent") from None
        return convert.status_from_pb(st)

    async def metric_specs(self) -> list[MetricSpecInfo]:
        """Every declared metric."""
        try:
            resp = await self._agent().ListMetricSpecs(
                agent_pb2.ListMetricSpecsRequest(), timeout=self._timeout
            )
        except grpc.RpcError as e:
            raise self._error(e, "Agent") from None
        return [convert.spec_from_pb(s) for s in resp.specs]

    async def metrics_window(self, names: Sequence[str], seconds: float) -> list[SeriesPoints]:
        """History of the matching series over the last ``seconds``."""
        req = agent_pb2.GetMetricsWindowRequest(names=list(names))
        try:
            st = await self._agent().GetStatus(agent_pb2.GetStatusRequest(), timeout=self._timeout)
            # The agent's clock, not ours: a remote agent's clock may differ from this host's.
            now = st.started_unix_seconds + st.agent_uptime_seconds
            req.start_unix_seconds = now - seconds
            req.end_unix_seconds = now
            resp = await self._agent().GetMetricsWindow(req, timeout=self._timeout)
        except grpc.RpcError as e:
            raise self._error(e, "Agent") from None
        return [convert.series_from_pb(s) for s in resp.series]

    async def stream_metrics(self) -> AsyncIterator[MetricsRound]:
        """Every collection round; raises `Disconnected` when the stream ends."""
        call = self._agent().StreamMetrics(agent_pb2.StreamMetricsRequest())
        try:
            async for snap in call:
                yield convert.round_from_pb(snap)
        except grpc.RpcError as e:
            raise self._error(e, "Agent") from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise self._call_cancelled("metrics") from None
        finally:
            call.cancel()
        raise Disconnected(f"the agent at {self._target} ended the metrics stream (stopping?)")

    # -- Kernel and Tracing services -------------------------------------------------------

    def _kernel(self) -> kernel_pb2_grpc.KernelStub:
        return kernel_pb2_grpc.KernelStub(self._chan())

    async def processes(self, limit: int, job_id: str = "") -> ProcessTable:
        """The agent's process table (only ``job_id``'s processes if given)."""
        req = kernel_pb2.ListProcessesRequest(
            sort_by="activity", limit=limit, filter=f"job={job_id}" if job_id else ""
        )
        try:
            resp = await self._kernel().ListProcesses(req, timeout=self._timeout)
        except grpc.RpcError as e:
            raise self._error(e, "Kernel") from None
        return convert.processes_from_pb(resp)

    def _tracing(self) -> tracing_pb2_grpc.TracingStub:
        return tracing_pb2_grpc.TracingStub(self._chan())

    async def trainers(self) -> list[TrainerInfo]:
        """Registered PyTorch processes."""
        try:
            resp = await self._tracing().ListTrainers(
                tracing_pb2.ListTrainersRequest(), timeout=self._timeout
            )
        except grpc.RpcError as e:
            raise self._error(e, "Tracing") from None
        return [convert_tracing.trainer_from_pb(t) for t in resp.trainers]

    async def start_trace(self, request: TraceSpec) -> TraceStatus:
        """Ask for a trace; the answer lists who was triggered, with their file names."""
        try:
            resp = await self._tracing().StartTrace(spec_to_pb(request), timeout=self._timeout)
        except grpc.RpcError as e:
            raise self._error(e, "Tracing") from None
        return convert_tracing.started_from_pb(resp)

    async def watch_trace(self, trace_id: str) -> AsyncIterator[TraceStatus]:
        """The trace's state now and after every change, until every process has ended."""
        call = self._tracing().WatchTrace(tracing_pb2.GetTraceRequest(trace_id=trace_id))
        try:
            async for st in call:
                yield convert_tracing.trace_from_pb(st)
        except grpc.RpcError as e:
            raise self._error(e, "Tracing") from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise self._call_cancelled("trace watch") from None
        finally:
            call.cancel()

    async def stream_events(self) -> AsyncIterator[KernelEventInfo]:
        """Recent events the agent still holds, then new ones as they happen.

        Raises:
            Disconnected: the agent went away or ended the stream.
            ServiceUnavailable: the agent has no Kernel API.
        """
        # Subscribe first, then fetch the recent past: an event in between arrives twice
        # (dropped by key below) rather than not at all.
        call = self._kernel().StreamEvents(kernel_pb2.StreamEventsRequest())
        try:
            page = await self._kernel().GetEvents(
                kernel_pb2.GetEventsRequest(limit=RECENT_EVENTS), timeout=self._timeout
            )
            recent = [convert.event_from_pb(ev) for ev in page.events]
            seen = {_event_key(ev) for ev in recent}
            for ev in recent:
                yield ev
            async for msg in call:
                ev = convert.event_from_pb(msg)
                if seen and _event_key(ev) in seen:
                    continue
                seen.clear()  # past the overlap: stop paying for the check
                yield ev
        except grpc.RpcError as e:
            raise self._error(e, "Kernel") from None
        except asyncio.CancelledError:
            if _cancelling():
                raise
            raise self._call_cancelled("event") from None
        finally:
            call.cancel()
        raise Disconnected(f"the agent at {self._target} ended the event stream (stopping?)")

    async def close(self) -> None:
        """Close the channel (cancelling its calls); the source is not used afterwards."""
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()


def _event_key(ev: KernelEventInfo) -> tuple[int, str, int, int]:
    return (ev.ts_ns, ev.kind, ev.pid, ev.tid)


def _cancelling() -> bool:
    """Whether the running task itself is being cancelled (not just a gRPC call under it)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
