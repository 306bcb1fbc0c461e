"""gRPC servicer for `bpfdyno.rpc.v1.Detection`: translation only, the logic is in
DetectionService."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import cast

import grpc

from bpfdyno.rpc.detection import (
    GetRankSignalsRequest,
    GetRankSignalsResponse,
    ListEventsRequest,
    ListEventsResponse,
    WatchEventsRequest,
)
from bpfdyno.rpc.v1 import detection_pb2 as pb
from bpfdyno.rpc.v1 import detection_pb2_grpc as pb_grpc
from bpfdyno.rpc.wire import from_pb, to_pb
from bpfdyno.server.errors import grpc_errors
from bpfdyno.services.detection import DetectionService


class DetectionServicer(pb_grpc.DetectionServicer):
    def __init__(self, service: DetectionService) -> None:
        self._svc = service

    @grpc_errors
    async def ListEvents(
        self, request: pb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEventsResponse:
        req = from_pb(ListEventsRequest, request)
        events = tuple(self._svc.list_events(req.job_id))
        return cast(pb.ListEventsResponse, to_pb(ListEventsResponse(events)))

    @grpc_errors
    async def GetRankSignals(
        self, request: pb.GetRankSignalsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetRankSignalsResponse:
        req = from_pb(GetRankSignalsRequest, request)
        signals = tuple(self._svc.rank_signals(req.job_id))
        return cast(pb.GetRankSignalsResponse, to_pb(GetRankSignalsResponse(signals)))

    @grpc_errors
    async def WatchEvents(
        self, request: pb.WatchEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DetectionEvent]:
        req = from_pb(WatchEventsRequest, request)
        # Closed however the stream ends (client gone: CancelledError), so the watcher goes.
        async with contextlib.aclosing(self._svc.watch_events(req.job_id)) as stream:
            async for event in stream:
                yield cast(pb.DetectionEvent, to_pb(event))


def detection_servicer_factory(service: DetectionService) -> Callable[[grpc.aio.Server], None]:
    """A `bpfdyno.server.grpc_server.ServicerFactory` that adds the Detection service."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_DetectionServicer_to_server(DetectionServicer(service), server)

    return add
