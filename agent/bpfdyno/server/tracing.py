"""gRPC servicer for `bpfdyno.rpc.v1.Tracing`: translation only, the logic is in TracingService.

Domain errors become status codes in one place (`bpfdyno.server.errors`); the requester of
each call comes from `bpfdyno.server.peers`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import grpc

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.rpc.diagnosis import to_pb
from bpfdyno.rpc.kernel_tracks import parse_kernel_tracks
from bpfdyno.rpc.traces import spec_from_pb
from bpfdyno.rpc.v1 import diagnosis_pb2
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.server.errors import grpc_errors
from bpfdyno.server.peers import requester_from_context
from bpfdyno.services.tracing import (
    SkippedProcess,
    TraceRequest,
    TracingService,
    TrainerView,
)
from bpfdyno.tracing.config_text import TraceOptions
from bpfdyno.tracing.roles import Role
from bpfdyno.tracing.traces import ProcState, TraceView, TrainerState

_TRAINER_STATE = {
    TrainerState.IDLE: pb.TRAINER_STATE_IDLE,
    TrainerState.CONFIG_PENDING: pb.TRAINER_STATE_CONFIG_PENDING,
    TrainerState.TRACING: pb.TRAINER_STATE_TRACING,
}
_ROLE = {
    Role.WORKER: pb.TRAINER_ROLE_WORKER,
    Role.LAUNCHER: pb.TRAINER_ROLE_LAUNCHER,
    Role.DATA_WORKER: pb.TRAINER_ROLE_DATA_WORKER,
}
_PROC_STATE = {
    ProcState.PENDING: pb.PROCESS_TRACE_STATE_PENDING,
    ProcState.DELIVERED: pb.PROCESS_TRACE_STATE_DELIVERED,
    ProcState.TRACING: pb.PROCESS_TRACE_STATE_TRACING,
    ProcState.WRITTEN: pb.PROCESS_TRACE_STATE_WRITTEN,
    ProcState.FAILED: pb.PROCESS_TRACE_STATE_FAILED,
    ProcState.TIMED_OUT: pb.PROCESS_TRACE_STATE_TIMED_OUT,
    ProcState.MERGING: pb.PROCESS_TRACE_STATE_MERGING,
}
_NO_GPU_MONITOR = "no GPU monitor in this agent (no GPU, or the gpu collector is disabled)"


def trainer_to_pb(t: TrainerView) -> pb.Trainer:
    return pb.Trainer(
        pid=t.pid,
        ancestors=list(t.ancestors),
        job_id=t.job_id,
        first_poll_unix_seconds=t.first_poll,
        last_poll_unix_seconds=t.last_poll,
        polls=t.polls,
        state=_TRAINER_STATE[t.state],
        role=_ROLE[t.role],
        endpoint=t.endpoint,
        trace_id=t.trace_id,
        uid=t.uid,
        host_pid=t.host_pid,
    )


def trace_to_pb(v: TraceView) -> pb.TraceStatus:
    return pb.TraceStatus(
        trace_id=v.trace_id,
        created_unix_seconds=v.created,
        deadline_unix_seconds=v.deadline,
        iteration_mode=v.iteration_mode,
        done=v.done,
        processes=[
            pb.ProcessTrace(
                pid=p.pid,
                job_id=p.job_id,
                output_path=p.output_path,
                state=_PROC_STATE[p.state],
                reason=p.reason,
                size_bytes=p.size_bytes,
                updated_unix_seconds=p.updated,
                kernel_tracks=pb.KernelTracks(
                    requested=list(p.kernel_tracks.requested),
                    state=p.kernel_tracks.state.value,
                    merged=list(p.kernel_tracks.merged),
                    events=p.kernel_tracks.events,
                    lost=p.kernel_tracks.lost,
                    reason=p.kernel_tracks.reason,
                ),
            )
            for p in v.processes
        ],
    )


def _skipped(items: tuple[SkippedProcess, ...]) -> list[pb.SkippedProcess]:
    return [pb.SkippedProcess(pid=s.pid, job_id=s.job_id, reason=s.reason) for s in items]


def request_from_pb(r: pb.StartTraceRequest) -> TraceRequest:
    """The domain request for a StartTrace message (proto3 zero values mean "default").

    The one place where the client's `TraceSpec` becomes the Kineto `TraceOptions`.
    """
    spec = spec_from_pb(r)
    options = TraceOptions(
        log_file=spec.log_file,
        duration_ms=spec.duration_ms,
        iterations=spec.iterations,
        start_time_ms=spec.profile_start_time_ms,
        start_iteration_roundup=spec.profile_start_iteration_roundup,
        record_shapes=spec.record_shapes,
        profile_memory=spec.profile_memory,
        with_stacks=spec.with_stacks,
        with_flops=spec.with_flops,
        with_modules=spec.with_modules,
    )
    try:
        tracks = parse_kernel_tracks(spec.kernel_tracks)
    except ValueError as e:
        raise InvalidArgument(str(e), rule="bad_kernel_tracks") from e
    return TraceRequest(
        job_id=spec.job_id,
        pids=spec.pids,
        process_limit=spec.process_limit,
        options=options,
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
        return pb.ListTrainersResponse(
            trainers=[trainer_to_pb(t) for t in self._svc.list_trainers(job)]
        )

    @grpc_errors
    async def StartTrace(
        self, request: pb.StartTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.StartTraceResponse:
        res = self._svc.start_trace(request_from_pb(request), requester_from_context(context))
        return pb.StartTraceResponse(
            trace_id=res.trace_id,
            processes_matched=list(res.matched),
            triggered=[
                pb.TriggeredProcess(pid=p.pid, job_id=p.job_id, output_path=p.output_path)
                for p in res.triggered
            ],
            busy=_skipped(res.busy),
            over_limit=_skipped(res.over_limit),
            not_matched=_skipped(res.not_matched),
            config_text=res.config_text,
        )

    @grpc_errors
    async def GetTrace(
        self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceStatus:
        return trace_to_pb(self._svc.get_trace(request.trace_id))

    @grpc_errors
    async def WatchTrace(
        self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TraceStatus]:
        async for view in self._svc.watch_trace(request.trace_id):
            yield trace_to_pb(view)

    @grpc_errors
    async def DcgmPause(
        self, request: pb.DcgmPauseRequest, context: grpc.aio.ServicerContext
    ) -> pb.DcgmResponse:
        ok = self._svc.dcgm_pause(request.duration_s, requester_from_context(context))
        return pb.DcgmResponse(status=ok, reason="" if ok else self._dcgm_reason())

    @grpc_errors
    async def DcgmResume(
        self, request: pb.DcgmResumeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DcgmResponse:
        ok = self._svc.dcgm_resume(requester_from_context(context))
        return pb.DcgmResponse(status=ok, reason="" if ok else self._dcgm_reason())

    @grpc_errors
    async def GetTraceSummary(
        self, request: pb.GetTraceRequest, context: grpc.aio.ServicerContext
    ) -> pb.TraceSummary:
        summaries, verdict = await self._svc.trace_summary(request.trace_id)
        return pb.TraceSummary(
            trace_id=request.trace_id,
            processes=[to_pb(s, pb.ProcessSummary()) for s in summaries],
            verdict=to_pb(verdict, diagnosis_pb2.Verdict()),
        )

    def _dcgm_reason(self) -> str:
        if not self._svc.has_gpu_monitor:
            return _NO_GPU_MONITOR
        return "the GPU monitor refused (see the agent's log)"


def servicer_factory(service: TracingService) -> Callable[[grpc.aio.Server], None]:
    """A `ServicerFactory` for `bpfdyno.server.grpc_server.GrpcServer` (its ``extra_servicers``)."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_TracingServicer_to_server(TracingServicer(service), server)

    return add
