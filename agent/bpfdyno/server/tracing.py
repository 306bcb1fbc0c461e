"""gRPC servicer for `bpfdyno.rpc.v1.Tracing`: translation only, the logic is in TracingService.

Domain errors become status codes in one place (`bpfdyno.server.errors`); the requester of
each call comes from `bpfdyno.server.peers`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import cast

import grpc

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.rpc.kernel_tracks import parse_kernel_tracks
from bpfdyno.rpc.traces import (
    DcgmResult,
    TraceStart,
    TraceStatus,
    Trainer,
    spec_from_pb,
)
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.rpc.wire import to_pb
from bpfdyno.server.errors import grpc_errors
from bpfdyno.server.peers import requester_from_context
from bpfdyno.services.tracing import TraceRequest, TracingService
from bpfdyno.tracing.traces import TraceView

_NO_GPU_MONITOR = "no GPU monitor in this agent (no GPU, or the gpu collector is disabled)"


def trace_to_pb(view: TraceView) -> pb.TraceStatus:
    """A trace's state as its message (the tracker keeps it in the API's own words)."""
    return cast(pb.TraceStatus, to_pb(view, TraceStatus))


def request_from_pb(r: pb.StartTraceRequest) -> TraceRequest:
    """The domain request for a StartTrace message (proto3 zero values mean "default"): the
    client's `TraceSpec` is its profiler options as they are."""
    spec = spec_from_pb(r)
    try:
        tracks = parse_kernel_tracks(spec.kernel_tracks)
    except ValueError as e:
        raise InvalidArgument(str(e), rule="bad_kernel_tracks") from e
    return TraceRequest(
        job_id=spec.job_id,
        pids=spec.pids,
        process_limit=spec.process_limit,
        options=spec,
        timeout_s=spec.timeout_seconds,
        kernel_tracks=tracks,
        pre_window_s=spec.pre_window_seconds,
    )


class TracingServicer(pb_grpc.TracingServicer):
    def __init__(self, service: TracingService) -> None:
        self._svc = service

    async def ListTrainers(
        self, request: pb.ListTrainersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListTrainersResponse:
        job = request.job_id if request.HasField("job_id") else None
        trainers = self._svc.list_trainers(job, requester_from_context(context))
        return pb.ListTrainersResponse(
            trainers=[cast(pb.Trainer, to_pb(t, Trainer)) for t in trainers]
        )

    @grpc_errors
    async def StartTrace(
        self, request: pb.StartTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartTraceResponse:
        res = self._svc.start_trace(request_from_pb(request), requester_from_context(context))
        return cast(pb.StartTraceResponse, to_pb(res, TraceStart))

    @grpc_errors
    async def GetTrace(
        self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceStatus:
        return trace_to_pb(self._svc.get_trace(request.trace_id, requester_from_context(context)))

    @grpc_errors
    async def WatchTrace(
        self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TraceStatus]:
        async for view in self._svc.watch_trace(request.trace_id, requester_from_context(context)):
            yield trace_to_pb(view)

    @grpc_errors
    async def DcgmPause(
        self, request: pb.DcgmPauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.DcgmResponse:
        ok = self._svc.dcgm_pause(request.duration_s, requester_from_context(context))
        return self._dcgm(ok)

    @grpc_errors
    async def DcgmResume(
        self, request: pb.DcgmResumeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DcgmResponse:
        return self._dcgm(self._svc.dcgm_resume(requester_from_context(context)))

    @grpc_errors
    async def GetTraceSummary(
        self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceSummary:
        summary = await self._svc.trace_summary(request.trace_id, requester_from_context(context))
        return cast(pb.TraceSummary, to_pb(summary))

    def _dcgm(self, ok: bool) -> pb.DcgmResponse:
        if ok:
            reason = ""
        elif not self._svc.has_gpu_monitor:
            reason = _NO_GPU_MONITOR
        else:
            reason = "the GPU monitor refused (see the agent's log)"
        return cast(pb.DcgmResponse, to_pb(DcgmResult(ok, reason)))


def servicer_factory(service: TracingService) -> Callable[[grpc.aio.Server], None]:
    """A `ServicerFactory` for `bpfdyno.server.grpc_server.GrpcServer` (its ``extra_servicers``)."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_TracingServicer_to_server(TracingServicer(service), server)

    return add
