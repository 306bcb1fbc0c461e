"""The gRPC server: Unix socket by default, TCP only when configured.

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

from bpfdyno.config import GrpcSection
from bpfdyno.rpc.agent_servicer import AgentServicer
from bpfdyno.rpc.v1 import agent_pb2_grpc
from bpfdyno.service import AgentService

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
    p.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
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
        self.tcp_port: int | None = None

    def check_addresses(self) -> None:
        """Fail early, before anything starts, if an address is taken."""
        prepare_unix_socket(self._cfg.socket)
        if self._cfg.tcp:
            check_tcp_free(self._cfg.tcp)

    async def start(self) -> None:
        server = grpc.aio.server(
            options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 4 << 20)]
        )
        agent_pb2_grpc.add_AgentServicer_to_server(AgentServicer(self._service), server)
        for add in self._extra:
            add(server)
        prepare_unix_socket(self._cfg.socket)
        # Restrictive umask while binding, so the socket never exists with looser permissions.
        old = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix:{self._cfg.socket}")
        finally:
            os.umask(old)
        os.chmod(self._cfg.socket, self._cfg.socket_mode)
        if self._cfg.socket_group:
            try:
                os.chown(self._cfg.socket, -1, grp.getgrnam(self._cfg.socket_group).gr_gid)
            except (KeyError, PermissionError) as e:
                log.warning(
                    "cannot give %s to group %s: %s", self._cfg.socket, self._cfg.socket_group, e
                )
        if self._cfg.tcp:
            log.warning(
                "gRPC also listening on TCP %s without authentication: restrict it with a "
                "firewall or keep the default (Unix socket only)",
                self._cfg.tcp,
            )
            try:
                self.tcp_port = server.add_insecure_port(self._cfg.tcp)
            except RuntimeError as e:
                raise AddressInUse(f"cannot listen on {self._cfg.tcp}: {e}") from e
        await server.start()
        self._server = server
        log.info("gRPC API on unix:%s", self._cfg.socket)

    async def stop(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            await self._server.stop(grace_s)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._cfg.socket)
