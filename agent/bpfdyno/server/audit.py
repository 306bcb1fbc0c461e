"""gRPC servicer for `bpfdyno.rpc.v1.Audit`: the audit trail, each user seeing their own.

Root (and an authenticated TCP operator acting as root) sees every record; any other user
sees the records of its own uid; an unattributed caller sees none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import grpc

from bpfdyno.rpc import audit as api
from bpfdyno.rpc.v1 import audit_pb2 as pb
from bpfdyno.rpc.v1 import audit_pb2_grpc as pb_grpc
from bpfdyno.rpc.wire import to_pb
from bpfdyno.server.peers import requester_from_context
from bpfdyno.tracing.audit import AuditLog, AuditRecord

#: Records returned when a request names no limit.
DEFAULT_LIMIT = 100


def record_to_pb(r: AuditRecord) -> pb.AuditRecord:
    """An audit record as its message: it speaks the API's words (`bpfdyno.rpc.audit`)."""
    return cast(pb.AuditRecord, to_pb(r, api.AuditRecord))


class AuditServicer(pb_grpc.AuditServicer):
    def __init__(self, audit: AuditLog) -> None:
        self._audit = audit

    async def ListAuditRecords(
        self, request: pb.ListAuditRecordsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListAuditRecordsResponse:
        who = requester_from_context(context)
        if not who.attributed:
            return pb.ListAuditRecordsResponse()
        records = self._audit.records(
            None if who.privileged else who.uid,
            since_seq=request.since_seq,
            limit=request.limit or DEFAULT_LIMIT,
        )
        return pb.ListAuditRecordsResponse(records=[record_to_pb(r) for r in records])


def audit_servicer_factory(audit: AuditLog) -> Callable[[grpc.aio.Server], None]:
    """A `ServicerFactory` for `bpfdyno.server.grpc_server.GrpcServer`."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_AuditServicer_to_server(AuditServicer(audit), server)

    return add
