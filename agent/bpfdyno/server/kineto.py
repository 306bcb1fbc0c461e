"""gRPC servicer for `bpfdyno.rpc.v1.Kineto`: the per-user Kineto socket directories.

A user gets her own directory; root (the SLURM prolog, an operator) any user's. An
unattributed caller (TCP without a uid) gets none: a directory is a user's, by the kernel's
word about who asks.
"""

from __future__ import annotations

from collections.abc import Callable

import grpc

from bpfdyno.core.errors import PermissionDenied, Unavailable
from bpfdyno.rpc.v1 import kineto_pb2 as pb
from bpfdyno.rpc.v1 import kineto_pb2_grpc as pb_grpc
from bpfdyno.server.errors import grpc_errors
from bpfdyno.server.peers import requester_from_context
from bpfdyno.tracing.ipc.endpoint import EndpointUnavailable
from bpfdyno.tracing.ipc.user_dirs import NO_LAYOUT, UserSocketDirs


class KinetoServicer(pb_grpc.KinetoServicer):
    def __init__(self, dirs: UserSocketDirs | None) -> None:
        self._dirs = dirs

    @grpc_errors
    async def OpenSocketDir(
        self, request: pb.OpenSocketDirRequest, context: grpc.aio.ServicerContext
    ) -> pb.SocketDir:
        who = requester_from_context(context)
        if who.uid is None:
            raise PermissionDenied(
                "the agent cannot tell who asks (TCP); ask on its Unix socket",
                rule="unattributed",
            )
        uid = request.uid if request.HasField("uid") else who.uid
        if uid != who.uid and not who.privileged:
            raise PermissionDenied(
                f"uid {who.uid} may open only its own socket directory, not uid {uid}'s",
                rule="not_owner",
            )
        if self._dirs is None:
            raise Unavailable(NO_LAYOUT)
        try:
            path = self._dirs.open_for(uid)
        except EndpointUnavailable as e:
            raise Unavailable(str(e)) from e
        return pb.SocketDir(path=path, uid=uid)


def kineto_servicer_factory(dirs: UserSocketDirs | None) -> Callable[[grpc.aio.Server], None]:
    """A `ServicerFactory` for `bpfdyno.server.grpc_server.GrpcServer`."""

    def add(server: grpc.aio.Server) -> None:
        pb_grpc.add_KinetoServicer_to_server(KinetoServicer(dirs), server)

    return add
