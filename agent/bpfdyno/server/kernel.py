"""gRPC servicer for `bpfdyno.rpc.v1.Kernel`: translation only, the logic is in KernelService."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable

import grpc

from bpfdyno.core.events import KernelEvent
from bpfdyno.rpc.processes import row_to_pb
from bpfdyno.rpc.v1 import kernel_pb2 as pb
from bpfdyno.rpc.v1 import kernel_pb2_grpc as pb_grpc
from bpfdyno.server.errors import grpc_errors
from bpfdyno.services.kernel import KernelService
from bpfdyno.sources.net.decode import TcpConnection


def _opt_float(value: float) -> float | None:
    """NaN (unknown) becomes an unset optional field."""
    return None if math.isnan(value) else value


def connection_to_pb(c: TcpConnection) -> pb.TcpConnection:
    return pb.TcpConnection(
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
        srtt_seconds=_opt_float(c.srtt_s),
        snd_cwnd=c.snd_cwnd,
        established_unix_ns=c.established_ts_ns,
        passive=c.passive,
    )


def event_to_pb(e: KernelEvent) -> pb.KernelEvent:
    msg = pb.KernelEvent(unix_ns=e.ts_ns, kind=e.kind, pid=e.pid, tid=e.tid, comm=e.comm)
    for key, value in e.attrs.items():
        attr = msg.attrs[key]
        if isinstance(value, bool | int):
            attr.int_value = int(value)
        elif isinstance(value, float):
            attr.double_value = value
        else:
            attr.string_value = str(value)
    return msg


class KernelServicer(pb_grpc.KernelServicer):
    """Translation only; domain errors become status codes through `grpc_errors`."""

    def __init__(self, service: KernelService) -> None:
        self._svc = service

    @grpc_errors
    async def ListProcesses(
        self, request: pb.ListProcessesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListProcessesResponse:
        snap = self._svc.list_processes(request.sort_by, request.limit, request.filter)
        return pb.ListProcessesResponse(
            processes=[row_to_pb(r) for r in snap.rows],
            unix_seconds=snap.ts,
            total_processes=snap.total_processes,
            unavailable=dict(snap.unavailable),
        )

    @grpc_errors
    async def ListConnections(
        self, request: pb.ListConnectionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListConnectionsResponse:
        conns = self._svc.list_connections(request.pid, request.state)
        return pb.ListConnectionsResponse(connections=[connection_to_pb(c) for c in conns])

    @grpc_errors
    async def GetEvents(
        self, request: pb.GetEventsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetEventsResponse:
        page = self._svc.get_events(request.since_unix_ns, list(request.kinds), request.limit)
        return pb.GetEventsResponse(
            events=[event_to_pb(e) for e in page.events],
            evicted_age=page.evicted_age,
            evicted_memory=page.evicted_memory,
            oldest_unix_ns=page.oldest_ts_ns,
        )

    @grpc_errors
    async def StreamEvents(
        self, request: pb.StreamEventsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.KernelEvent]:
        sub = self._svc.stream_events(list(request.kinds))
        # The subscription is closed however the stream ends (client gone: CancelledError).
        async with sub:
            async for event in sub:
                yield event_to_pb(event)


def kernel_servicer_factory(service: KernelService) -> Callable[[grpc.aio.Server], None]:
    """A `bpfdyno.server.grpc_server.ServicerFactory` that adds the Kernel service to a server."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_KernelServicer_to_server(KernelServicer(service), server)

    return add
