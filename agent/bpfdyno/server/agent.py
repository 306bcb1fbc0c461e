"""gRPC servicer for `bpfdyno.rpc.v1.Agent`: translation only, the logic is in AgentService."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from functools import partial

import grpc

from bpfdyno.core.metrics import MetricKind, MetricSpec
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.core.store import SeriesView, SharedResults
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.server.errors import grpc_errors
from bpfdyno.services.agent import AgentService, Snapshot

_STATE = {
    PartState.STARTING: pb.COLLECTOR_STATE_STARTING,
    PartState.OK: pb.COLLECTOR_STATE_OK,
    PartState.DEGRADED: pb.COLLECTOR_STATE_DEGRADED,
    PartState.UNAVAILABLE: pb.COLLECTOR_STATE_UNAVAILABLE,
    PartState.STOPPED: pb.COLLECTOR_STATE_STOPPED,
    PartState.DISABLED: pb.COLLECTOR_STATE_DISABLED,
}
_KIND = {
    MetricKind.GAUGE: pb.METRIC_KIND_GAUGE,
    MetricKind.RATE: pb.METRIC_KIND_RATE,
    MetricKind.RATIO: pb.METRIC_KIND_RATIO,
    MetricKind.COUNTER: pb.METRIC_KIND_COUNTER,
    MetricKind.HISTOGRAM: pb.METRIC_KIND_HISTOGRAM,
}


def collector_status_to_pb(s: PartStatus) -> pb.CollectorStatus:
    return pb.CollectorStatus(
        name=s.name,
        state=_STATE[s.state],
        reason=s.reason,
        interval_seconds=s.interval_s,
        collections=s.collections,
        errors=s.errors,
        last_duration_seconds=s.last_duration_s,
        last_success_unix_seconds=s.last_success_ts,
    )


def spec_to_pb(s: MetricSpec) -> pb.MetricSpec:
    return pb.MetricSpec(
        name=s.name, kind=_KIND[s.kind], unit=s.unit, help=s.help, labels=s.labels, source=s.source
    )


def series_to_pb(views: Sequence[SeriesView]) -> list[pb.Series]:
    return [
        pb.Series(
            name=v.spec.name,
            labels=[pb.Label(name=k, value=val) for k, val in v.labels],
            points=[pb.Point(unix_seconds=p.ts, value=p.value) for p in v.points],
        )
        for v in views
    ]


def snapshot_to_pb(s: Snapshot) -> pb.MetricsSnapshot:
    return pb.MetricsSnapshot(
        unix_seconds=s.ts, collector=s.collector, series=series_to_pb(s.series)
    )


class AgentServicer(pb_grpc.AgentServicer):
    def __init__(self, service: AgentService) -> None:
        self._svc = service
        self._messages: SharedResults[None, pb.MetricsSnapshot] = SharedResults()

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.Status:
        st = self._svc.status()
        return pb.Status(
            version=st.version,
            hostname=st.hostname,
            kernel_release=st.kernel_release,
            agent_uptime_seconds=st.agent_uptime_s,
            host_uptime_seconds=st.host_uptime_s,
            pid=st.pid,
            config_source=st.config_source,
            started_unix_seconds=st.started_ts,
            collectors=[collector_status_to_pb(c) for c in st.collectors],
        )

    async def ListMetricSpecs(
        self, request: pb.ListMetricSpecsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMetricSpecsResponse:
        return pb.ListMetricSpecsResponse(specs=[spec_to_pb(s) for s in self._svc.metric_specs()])

    @grpc_errors
    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetricsSnapshot:
        return snapshot_to_pb(self._svc.snapshot(list(request.names)))

    @grpc_errors
    async def GetMetricsWindow(
        self, request: pb.GetMetricsWindowRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetricsWindow:
        views = self._svc.window(
            list(request.names), request.start_unix_seconds, request.end_unix_seconds
        )
        return pb.MetricsWindow(series=series_to_pb(views))

    @grpc_errors
    async def StreamMetrics(
        self, request: pb.StreamMetricsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.MetricsSnapshot]:
        async for snap in self._svc.stream(list(request.names), list(request.collectors)):
            # Subscribers with the same filter share the snapshot: convert it once.
            yield self._messages.get(snap, None, partial(snapshot_to_pb, snap))

    async def GetClock(
        self, request: pb.GetClockRequest, context: grpc.aio.ServicerContext
    ) -> pb.Clock:
        # Read here, at the edge: the two times bracket this agent's handling of the call,
        # which is exactly what a client needs to tell the network delay from the offset.
        received = time.time()
        return pb.Clock(receive_unix_seconds=received, transmit_unix_seconds=time.time())
