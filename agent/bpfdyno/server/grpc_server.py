"""The gRPC server: Unix socket by default, TCP only when configured.

The TCP listener is a second grpc.aio server with the same servicers: it has TLS and the
bearer-token check (see `bpfdyno.server.auth`), the Unix socket keeps its permission-based
access control, and no call can reach one listener's checks through the other.

Other services register through `ServicerFactory` callables so this module does not need to
know about every domain (tracing, kernel, ...).
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import socket
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from bpfdyno.core.config import GrpcSection
from bpfdyno.rpc.v1 import agent_pb2_grpc
from bpfdyno.server.agent import AgentServicer
from bpfdyno.server.auth import TokenInterceptor, load_tcp_security
from bpfdyno.server.peers import TcpIdentityInterceptor
from bpfdyno.server.unix_front import UnixFront
from bpfdyno.services.agent import AgentService

log = logging.getLogger(__name__)

#: Adds one more servicer to the server (e.g. tracing, kernel).
ServicerFactory = Callable[[grpc.aio.Server], None]


class AddressInUse(Exception):
    """The socket path or TCP port is taken; the message names it and what to do."""


def prepare_unix_socket(path: str) -> None:
    """Make ``path`` bindable: create its directory, remove a stale socket file.

    Raises:
        AddressInUse: a live process is listening on it, or the path is not a socket.
    """
    p = Path(path)
    if not p.parent.is_dir():
        p.parent.mkdir(parents=True, mode=0o755)
        os.chmod(p.parent, 0o755)  # whatever the umask: users must reach the socket inside
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise AddressInUse(
            f"{path} exists and is not a socket; remove it or set grpc.socket to another path"
        )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(path)
        except OSError as e:
            if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                p.unlink(missing_ok=True)  # stale: its owner is gone
                return
            raise
    raise AddressInUse(
        f"gRPC socket {path} is in use by a running process (another bpfdyno?); stop it "
        "(`systemctl stop bpfdyno`) or set grpc.socket / --socket to another path"
    )


def check_tcp_free(address: str) -> None:
    """Raise AddressInUse if ``host:port`` cannot be bound."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, int(port)))
        except OSError as e:
            raise AddressInUse(
                f"cannot listen on {address} ({e.strerror}); stop whatever uses it "
                "(`ss -ltnp`) or set grpc.tcp to another address"
            ) from e


class GrpcServer:
    """Owns the grpc.aio server and the socket file it creates."""

    def __init__(
        self,
        cfg: GrpcSection,
        service: AgentService,
        extra_servicers: Sequence[ServicerFactory] = (),
    ) -> None:
        self._cfg = cfg
        self._service = service
        self._extra = list(extra_servicers)
        self._server: grpc.aio.Server | None = None
        self._tcp_server: grpc.aio.Server | None = None
        self._front: UnixFront | None = None
        self.tcp_port: int | None = None

    def check_addresses(self) -> None:
        """Fail early, before anything starts, if an address is taken."""
        prepare_unix_socket(self._cfg.socket)
        if self._cfg.tcp:
            check_tcp_free(self._cfg.tcp)

    def _new_server(
        self, interceptors: Sequence[grpc.aio.ServerInterceptor] = ()
    ) -> grpc.aio.Server:
        server = grpc.aio.server(
            interceptors=interceptors,
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 4 << 20)],
        )
        agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(self._service), server)
        for add in self._extra:
            add(server)
        return server

    async def start(self) -> None:
        """Listen on the Unix socket and, when configured, on TCP.

        Raises:
            AddressInUse: the socket path or the TCP address is taken.
            ConfigError: a TLS or token file can no longer be read.
        """
        tcp_server = self._bind_tcp_server() if self._cfg.tcp else None
        try:
            server = self._new_server()
            prepare_unix_socket(self._cfg.socket)
            # gRPC listens privately; the daemon's front accepts on the public socket and
            # relays each connection under its client's credentials (see unix_front).
            self._front = UnixFront(self._cfg.socket)
            server.add_insecure_port(self._front.internal_target)
            # Restrictive umask while binding, so the socket never exists with looser permissions.
            old = os.umask(0o177)
            try:
                self._front.bind()
            finally:
                os.umask(old)
            os.chmod(self._cfg.socket, self._cfg.socket_mode)
            if self._cfg.socket_group and self._cfg.socket_mode & 0o006:
                log.warning(
                    "grpc.socket_group = %r does not limit who may connect while grpc."
                    "socket_mode (%o) lets every user in; set socket_mode = 0o660 for that",
                    self._cfg.socket_group,
                    self._cfg.socket_mode,
                )
            if self._cfg.socket_group:
                try:
                    os.chown(self._cfg.socket, -1, grp.getgrnam(self._cfg.socket_group).gr_gid)
                except (KeyError, PermissionError) as e:
                    log.warning(
                        "cannot give %s to group %s: %s",
                        self._cfg.socket,
                        self._cfg.socket_group,
                        e,
                    )
            await server.start()
            self._server = server
            await self._front.start()
            log.info("gRPC API on unix:%s", self._cfg.socket)
        except BaseException:
            if tcp_server is not None:  # bound but never started: free its port
                await tcp_server.stop(None)
            if self._front is not None:
                await self._front.stop()
            raise
        if tcp_server is not None:
            await tcp_server.start()
            self._tcp_server = tcp_server

    def _bind_tcp_server(self) -> grpc.aio.Server:
        """The TCP server, bound but not started, with TLS and the token check configured."""
        security = load_tcp_security(self._cfg)
        interceptors: list[grpc.aio.ServerInterceptor] = (
            [TokenInterceptor(security.token)] if security.token is not None else []
        )
        identity = TcpIdentityInterceptor(
            self._cfg.tcp_uid, self._cfg.tcp.rpartition(":")[0], security.authenticated_by
        )
        tcp_server = self._new_server([*interceptors, identity])
        try:
            if security.credentials is not None:
                self.tcp_port = tcp_server.add_secure_port(self._cfg.tcp, security.credentials)
            else:
                self.tcp_port = tcp_server.add_insecure_port(self._cfg.tcp)
        except RuntimeError as e:
            raise AddressInUse(f"cannot listen on {self._cfg.tcp}: {e}") from e
        identity.port = self.tcp_port
        if security.authenticated_by is None:
            log.warning(
                "gRPC also listening on TCP %s without TLS or client authentication "
                "(grpc.insecure_tcp): restrict it with a firewall, or configure TLS and a "
                "token (docs/deployment.md)",
                self._cfg.tcp,
            )
        log.info("gRPC API on tcp:%s (%s)", self._cfg.tcp, security.describe())
        return tcp_server

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._tcp_server is not None:
            await self._tcp_server.stop(grace_s)
            self._tcp_server = None
        if self._front is not None:
            await self._front.stop()
            self._front = None
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._cfg.socket)
