"""gRPC servicer for `bpfdyno.rpc.v1.Agent`: translation only, the logic is in AgentService."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import partial
from typing import cast

import grpc

from bpfdyno.core.budget import REQUESTED, reader
from bpfdyno.core.store import SeriesView, SharedResults
from bpfdyno.rpc.agent import (
    Clock,
    Label,
    MetricSpec,
    MetricsSnapshot,
    MetricsWindow,
    Point,
    Series,
)
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.rpc.wire import to_pb
from bpfdyno.server.errors import grpc_errors
from bpfdyno.server.peers import requester_from_context
from bpfdyno.services.agent import AgentService, Snapshot


def _uid_peer(context: grpc.aio.ServicerContext) -> tuple[int | None, str]:
    who = requester_from_context(context)
    return who.uid, who.peer


def series_record(v: SeriesView) -> Series:
    """A stored series as the API's record."""
    return Series(
        v.spec.name,
        tuple(Label(k, val) for k, val in v.labels),
        tuple(Point(p.ts, p.value) for p in v.points),
    )


def snapshot_to_pb(s: Snapshot) -> pb.MetricsSnapshot:
    """A snapshot (or a streamed round) as its message."""
    series = tuple(series_record(v) for v in s.series)
    return cast(pb.MetricsSnapshot, to_pb(MetricsSnapshot(s.ts, s.collector, series)))


class AgentServicer(pb_grpc.AgentServicer):
    def __init__(self, service: AgentService) -> None:
        self._svc = service
        self._messages: SharedResults[None, pb.MetricsSnapshot] = SharedResults()

    async def GetStatus(
        self, request: pb.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.Status:
        return cast(pb.Status, to_pb(self._svc.status()))

    async def ListMetricSpecs(
        self, request: pb.ListMetricSpecsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListMetricSpecsResponse:
        # The catalog's specs have the API's field names: sent as they are.
        specs = [cast(pb.MetricSpec, to_pb(s, MetricSpec)) for s in self._svc.metric_specs()]
        return pb.ListMetricSpecsResponse(specs=specs)

    @grpc_errors
    async def GetMetrics(
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetricsSnapshot:
        who = requester_from_context(context)
        snap = await self._svc.fresh_snapshot(list(request.names), reader(who.uid, who.peer))
        with REQUESTED.work((reader(who.uid, who.peer),)):
            return snapshot_to_pb(snap)

    @grpc_errors
    async def GetMetricsWindow(
        self, request: pb.GetMetricsWindowRequest, context: grpc.aio.ServicerContext
    ) -> pb.MetricsWindow:
        who = reader(*_uid_peer(context))
        await self._svc.freshen(who)  # the window reaches now: its last round is fresh
        views = self._svc.window(
            list(request.names), request.start_unix_seconds, request.end_unix_seconds, who
        )
        with REQUESTED.work((who,)):
            return cast(pb.MetricsWindow, to_pb(MetricsWindow(tuple(map(series_record, views)))))

    @grpc_errors
    async def StreamMetrics(
        self, request: pb.StreamMetricsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.MetricsSnapshot]:
        who = requester_from_context(context)
        async for snap in self._svc.stream(list(request.names), list(request.collectors), who):
            # Subscribers with the same filter share the snapshot: convert it once.
            yield self._messages.get(snap, None, partial(snapshot_to_pb, snap))

    async def GetClock(
        self, request: pb.GetClockRequest, context: grpc.aio.ServicerContext
    ) -> pb.Clock:
        # Read here, at the edge: the two times bracket this agent's handling of the call,
        # which is exactly what a client needs to tell the network delay from the offset.
        received = time.time()
        return cast(pb.Clock, to_pb(Clock(received, time.time())))
