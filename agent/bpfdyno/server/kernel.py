"""gRPC servicer for `bpfdyno.rpc.v1.Kernel`: translation only, the logic is in KernelService."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import cast

import grpc

from bpfdyno.core.budget import reader
from bpfdyno.core.events import KernelEvent
from bpfdyno.rpc import kernel as api
from bpfdyno.rpc.processes import ProcessList
from bpfdyno.rpc.v1 import kernel_pb2 as pb
from bpfdyno.rpc.v1 import kernel_pb2_grpc as pb_grpc
from bpfdyno.rpc.wire import to_pb
from bpfdyno.server.errors import grpc_errors
from bpfdyno.server.peers import requester_from_context
from bpfdyno.services.kernel import KernelService
from bpfdyno.sources.net.decode import TcpConnection


def connection_record(c: TcpConnection) -> api.TcpConnection:
    """A tracked connection in the API's words (unknown RTT: None)."""
    return api.TcpConnection(
        pid=c.pid,
        comm=c.comm,
        family=c.family,
        saddr=c.saddr,
        sport=c.sport,
        daddr=c.daddr,
        dport=c.dport,
        state=c.state,
        tx_bytes=c.tx_bytes,
        rx_bytes=c.rx_bytes,
        retransmits=c.retransmits,
        srtt_seconds=None if math.isnan(c.srtt_s) else c.srtt_s,
        snd_cwnd=c.snd_cwnd,
        established_unix_ns=c.established_ts_ns,
        passive=c.passive,
    )


def event_record(e: KernelEvent) -> api.KernelEvent:
    """A flight-recorder event in the API's words."""
    return api.KernelEvent(e.ts_ns, e.kind, e.pid, e.tid, e.comm, dict(e.attrs))


class KernelServicer(pb_grpc.KernelServicer):
    """Translation only; domain errors become status codes through `grpc_errors`."""

    def __init__(self, service: KernelService) -> None:
        self._svc = service

    @grpc_errors
    async def ListProcesses(
        self, request: pb.ListProcessesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListProcessesResponse:
        who = requester_from_context(context)
        snap = await self._svc.list_processes(
            request.sort_by, request.limit, request.filter, reader(who.uid, who.peer), who
        )
        table = ProcessList(snap.rows, snap.ts, snap.total_processes, dict(snap.unavailable))
        return cast(pb.ListProcessesResponse, to_pb(table))

    @grpc_errors
    async def ListConnections(
        self, request: pb.ListConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConnectionsResponse:
        conns = self._svc.list_connections(request.pid, request.state)
        records = [cast(pb.TcpConnection, to_pb(connection_record(c))) for c in conns]
        return pb.ListConnectionsResponse(connections=records)

    @grpc_errors
    async def GetEvents(
        self, request: pb.GetEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEventsResponse:
        who = requester_from_context(context)
        await self._svc.freshen(reader(who.uid, who.peer))  # events come with the rounds
        page = self._svc.get_events(request.since_unix_ns, list(request.kinds), request.limit)
        events = tuple(map(event_record, page.events))
        api_page = api.EventsPage(events, page.evicted_age, page.evicted_memory, page.oldest_ts_ns)
        return cast(pb.GetEventsResponse, to_pb(api_page))

    @grpc_errors
    async def StreamEvents(
        self, request: pb.StreamEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.KernelEvent]:
        sub = self._svc.stream_events(list(request.kinds))
        who = requester_from_context(context)
        # The subscription is closed however the stream ends (client gone: CancelledError).
        with self._svc.streaming(reader(who.uid, who.peer)):
            async with sub:
                async for event in sub:
                    yield cast(pb.KernelEvent, to_pb(event_record(event)))


def kernel_servicer_factory(service: KernelService) -> Callable[[grpc.aio.Server], None]:
    """A `bpfdyno.server.grpc_server.ServicerFactory` that adds the Kernel service to a server."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_KernelServicer_to_server(KernelServicer(service), server)

    return add
