"""The requester behind a connection, for every entry point (see `bpfdyno.core.identity`).

* **gRPC on the Unix socket.** grpc-python does not expose the peer's credentials, so the
  daemon accepts on the public socket itself (`bpfdyno.server.unix_front`), reads
  ``SO_PEERCRED`` and relays the connection to a private gRPC listener from a socket bound to
  ``<private dir>/c-<uid>-<gid>-<pid>-<n>``; gRPC reports that name as the call's peer. Only
  root can bind in the private directory (root-owned, mode 0700, checked on every call), so
  the name cannot be forged.
* **gRPC over TCP** (`TcpIdentityInterceptor` on the TCP listener): with TLS and a token or
  client certificate, the client acts as ``[grpc] tcp_uid`` (an operator, root, by
  default); without them (``insecure_tcp``), as the owner of its socket when it is on this
  host, else unattributed.
* **The legacy dyno RPC** (`legacy_requester`): the owner of the peer's socket on this host,
  from the kernel's socket diagnostics (`bpfdyno.server.sockdiag`); a peer elsewhere is
  unattributed.
"""

from __future__ import annotations

import contextvars
import ipaddress
import logging
import os
import re
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from bpfdyno.core.identity import Requester, unattributed
from bpfdyno.server.sockdiag import SockDiagUnavailable, tcp_owner_uid

log = logging.getLogger(__name__)

GRPC_UNIX = "grpc-unix"
GRPC_TCP = "grpc-tcp"
LEGACY_RPC = "legacy-rpc"
HTTP = "http"

#: The file name a relayed connection is bound to: c-<uid>-<gid>-<pid>-<sequence>.
FRONT_NAME_RE = re.compile(r"c-(\d+)-(\d+)-(\d+)-\d+")

_tcp_requester: contextvars.ContextVar[Requester | None] = contextvars.ContextVar(
    "bpfdyno_tcp_requester", default=None
)


def front_name(uid: int, gid: int, pid: int, seq: int) -> str:
    """The name a relayed connection of (uid, gid, pid) is bound to."""
    return f"c-{uid}-{gid}-{pid}-{seq}"


def requester_from_context(context: Any) -> Requester:
    """Who made this gRPC call (attributed by the Unix front or the TCP interceptor)."""
    on_tcp = _tcp_requester.get()
    if on_tcp is not None:
        return on_tcp
    return requester_from_peer(str(context.peer()))


def requester_from_peer(peer: str) -> Requester:
    """The requester a gRPC peer string names; unattributed unless it is a front name."""
    if not peer.startswith("unix:"):
        return unattributed(
            GRPC_TCP if peer.startswith("ipv") else GRPC_UNIX,
            peer,
            "the call did not come through a listener that establishes identities",
        )
    path = peer[len("unix:") :]
    directory, name = os.path.split(path)
    m = FRONT_NAME_RE.fullmatch(name)
    if m is None or not _private(directory):
        return unattributed(
            GRPC_UNIX,
            path or "an unbound socket",
            "connected to a gRPC socket without going through the agent's front socket",
        )
    uid, _gid, pid = (int(g) for g in m.groups())
    return Requester(uid=uid, transport=GRPC_UNIX, peer=f"pid {pid}", pid=pid, note="SO_PEERCRED")


def _private(directory: str) -> bool:
    """True for a directory only the agent and root can create entries in (not a link, 0700,
    owned by root or by the agent's own user: the systemd unit runs it as ``bpfdyno``)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid in (0, os.geteuid())
        and not st.st_mode & (stat.S_IRWXG | stat.S_IRWXO)
    )


def legacy_requester(peer: tuple[Any, ...] | None, local: tuple[Any, ...] | None) -> Requester:
    """The requester of a legacy RPC connection (``getpeername`` / ``getsockname`` tuples;
    None when the connection was already gone)."""
    if not peer or not local:
        return unattributed(LEGACY_RPC, "", "the connection closed before it could be checked")
    return _tcp_socket_owner(LEGACY_RPC, peer, local)


def http_requester(peer: tuple[Any, ...], local: tuple[Any, ...]) -> Requester:
    """The requester of a connection to the Prometheus endpoint: the owner of the peer's
    socket on this host (for its per-user connection limit), else unattributed."""
    return _tcp_socket_owner(HTTP, peer, local)


def _tcp_socket_owner(transport: str, peer: tuple[Any, ...], local: tuple[Any, ...]) -> Requester:
    shown = _show(peer)
    try:
        uid = tcp_owner_uid((str(peer[0]), int(peer[1])), (str(local[0]), int(local[1])))
    except SockDiagUnavailable as e:
        return unattributed(transport, shown, f"the kernel cannot say who owns it: {e}")
    except ValueError as e:  # not an IP address (never from a TCP socket)
        return unattributed(transport, shown, f"unknown peer address ({e})")
    if uid is None:
        return unattributed(
            transport, shown, "the peer is not on this host (or in another network namespace)"
        )
    return Requester(uid=uid, transport=transport, peer=shown, note="owner of the peer's socket")


def _show(addr: tuple[Any, ...]) -> str:
    host = str(addr[0])
    return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"


def _parse_grpc_peer(peer: str) -> tuple[str, int] | None:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` → (ip, port); None for anything else."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return host, int(port)
    except ValueError:
        return None


class TcpIdentityInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped grpc
    """Establishes the requester of every call on the TCP listener (see the module doc).

    Args:
        tcp_uid: the uid authenticated clients act as (``[grpc] tcp_uid``; < 0: read-only).
        listen_host: the listener's host ("" or a wildcard: any local address).
        authenticated_by: how the listener authenticates clients (`TcpSecurity.authenticated_by`,
            the same object that installs the checks); None: it does not, and each client is
            the owner of its socket.

    Attributes:
        port: the listener's port (set once it is bound).
    """

    def __init__(self, tcp_uid: int, listen_host: str, authenticated_by: str | None) -> None:
        self._authenticated = authenticated_by is not None
        self._uid = tcp_uid
        self._how = authenticated_by or ""
        host = listen_host.strip("[]")
        self._host = "" if host in ("", "0.0.0.0", "::") else host
        self.port = 0

    def requester(self, context: Any) -> Requester:
        peer = str(context.peer())
        if self._authenticated:
            shown = peer.partition(":")[2]
            if self._uid < 0:
                return unattributed(
                    GRPC_TCP, shown, "authenticated TCP clients may only read ([grpc] tcp_uid = -1)"
                )
            return Requester(
                uid=self._uid, transport=GRPC_TCP, peer=shown, note=f"TLS + {self._how}"
            )
        addr = _parse_grpc_peer(peer)
        if addr is None:
            return unattributed(GRPC_TCP, peer, "unknown peer address")
        return _tcp_socket_owner(GRPC_TCP, addr, (self._host, self.port))

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler
        return _with_requester(handler, self.requester)


def _with_requester(
    handler: grpc.RpcMethodHandler, resolve: Callable[[Any], Requester]
) -> grpc.RpcMethodHandler:
    """The same handler, run with the call's requester in `_tcp_requester`."""
    des, ser = handler.request_deserializer, handler.response_serializer
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        async def unary(request: Any, context: Any) -> Any:
            _tcp_requester.set(resolve(context))
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(unary, des, ser)
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            _tcp_requester.set(resolve(context))
            async for item in inner_stream(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, des, ser)
    return handler  # client-streaming methods: none in this API
