"""The gRPC Unix socket's front: know who connects, then relay to the private gRPC listener.

grpc-python does not tell a servicer who is on the other end of a Unix socket. So the daemon
listens on the public socket itself and, for every connection:

1. reads the client's credentials from the kernel (``SO_PEERCRED``: pid, uid, gid);
2. opens a connection to the gRPC server's private listener in a directory only root can
   enter (``/run/bpfdyno/bpfdyno-*``, mode 0700), from a socket bound to
   ``<that directory>/c-<uid>-<gid>-<pid>-<n>`` (the file is removed at once; the kernel
   keeps the name), which gRPC reports as the call's peer (`bpfdyno.server.peers`);
3. copies bytes both ways, with flow control, until either side closes (then both close).

Everything runs on the daemon's event loop with asyncio protocols (no thread per
connection). The socket file's permissions stay the first gate, as before; the front adds
the identity. The cost of the extra hop is measured in docs/performance.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import shutil
import socket
import stat
import struct
import tempfile

from bpfdyno.core.connections import ConnectionLimits
from bpfdyno.core.identity import Requester
from bpfdyno.server.peers import GRPC_UNIX, front_name

log = logging.getLogger(__name__)

_UCRED = struct.Struct("=iII")
#: Connections relayed at once, in all and per uid (each costs two file descriptors).
MAX_CONNECTIONS = 1024
MAX_CONNECTIONS_PER_UID = 128
#: The private directory's parent when the public socket's own directory will not do.
PRIVATE_PARENT = "/run"
_INTERNAL_NAME = "grpc"
#: Longest private directory path: sun_path holds 107 bytes, a client name up to ~52.
_MAX_PRIVATE_DIR = 50


def peer_credentials(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a connected Unix socket."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return pid, uid, gid


def default_private_parent(public_path: str) -> str | None:
    """Where the private directory goes: next to the public socket when that directory is
    ours alone (``/run/bpfdyno``, removed with it by systemd), else /run, else the system's
    temporary directory (None). Short paths only: the client names must fit in sun_path."""
    directory = os.path.dirname(os.path.abspath(public_path))
    for candidate in (directory, PRIVATE_PARENT):
        try:
            st = os.lstat(candidate)
        except OSError:
            continue
        if (
            stat.S_ISDIR(st.st_mode)
            and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and len(candidate) + len("/bpfdyno-xxxxxxxx") <= _MAX_PRIVATE_DIR
        ):
            return candidate
    return None


class _Half(asyncio.Protocol):
    """One direction's receiving end; what it receives goes to its peer's transport."""

    def __init__(self, on_lost: asyncio.Future[None] | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Half | None = None
        self._pending: list[bytes] = []
        self._on_lost = on_lost
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def attach(self, peer: _Half) -> None:
        """Start relaying to ``peer`` (data received before is sent first)."""
        self.peer = peer
        assert peer.transport is not None
        for chunk in self._pending:
            peer.transport.write(chunk)
        self._pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.peer is None or self.peer.transport is None:
            self._pending.append(data)  # the inner connection is being set up
            return
        self.peer.transport.write(data)

    def eof_received(self) -> bool:
        # gRPC never half-closes: an end of stream means that side is gone. Closing here
        # (False) ends the relay at once; otherwise gRPC would keep a connection that never
        # sent its preface until its handshake timeout, holding a slot of the client's uid.
        return False

    def pause_writing(self) -> None:
        # Our transport cannot take more: stop reading from the side that feeds it.
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        if self._on_lost is not None and not self._on_lost.done():
            self._on_lost.set_result(None)


class UnixFront:
    """Owns the public socket, the private directory, and the relays between them.

    Args:
        public_path: the socket clients connect to (``[grpc] socket``).
        private_parent: where the private directory is created (default: see
            `default_private_parent`).
    """

    def __init__(self, public_path: str, private_parent: str | None = None) -> None:
        self.public_path = public_path
        parent = private_parent or default_private_parent(public_path)
        # mkdtemp: a fresh directory, mode 0700, owned by us; nobody else can bind in it.
        self.private_dir = tempfile.mkdtemp(prefix="bpfdyno-", dir=parent)
        self._internal = os.path.join(self.private_dir, _INTERNAL_NAME)
        self._sock: socket.socket | None = None
        self._server: asyncio.AbstractServer | None = None
        self._seq = itertools.count(1)
        self._limits = ConnectionLimits(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_UID)
        self._tasks: set[asyncio.Task[None]] = set()
        self.relayed = 0
        self.refused = 0

    @property
    def internal_target(self) -> str:
        """The gRPC address of the private listener (for ``add_insecure_port``)."""
        return f"unix:{self._internal}"

    def bind(self) -> None:
        """Bind and listen on the public path (callers set the umask and permissions)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(self.public_path)
            sock.listen(256)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock

    async def start(self) -> None:
        """Accept connections on the bound public socket."""
        assert self._sock is not None, "bind() first"
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(self._accepted, sock=self._sock)

    def _accepted(self) -> _Half:
        return _Outer(self)

    async def stop(self) -> None:
        """Stop accepting, close every relay, remove the private directory."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        shutil.rmtree(self.private_dir, ignore_errors=True)

    def admit(self, uid: int) -> bool:
        """Count a new connection of ``uid``; False (and counted as refused) over a limit."""
        peer = self._peer(uid)
        if self._limits.admit(peer):
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "gRPC front: refused a connection of uid %d (%d open in all, %d of %s; "
                    "limits %d and %d)",
                    uid,
                    self._limits.active,
                    self._limits.held(peer),
                    peer,
                    MAX_CONNECTIONS,
                    MAX_CONNECTIONS_PER_UID,
                )
            return False
        self.relayed += 1
        return True

    def release(self, uid: int) -> None:
        self._limits.release(self._peer(uid))

    def _peer(self, uid: int) -> str:
        return self._limits.peer_of(Requester(uid=uid, transport=GRPC_UNIX))

    def relay(self, outer: _Outer, pid: int, uid: int, gid: int) -> None:
        task = asyncio.get_running_loop().create_task(self._relay(outer, pid, uid, gid))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _relay(self, outer: _Outer, pid: int, uid: int, gid: int) -> None:
        loop = asyncio.get_running_loop()
        lost: asyncio.Future[None] = loop.create_future()
        inner = _Half(lost)
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            name = os.path.join(self.private_dir, front_name(uid, gid, pid, next(self._seq)))
            try:
                s.bind(name)
                await loop.sock_connect(s, self._internal)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)  # the kernel keeps the name for the connection
            await loop.create_unix_connection(lambda: inner, sock=s)
            outer.attach(inner)
            inner.attach(outer)
            if outer.closed:  # the client left while the relay was being set up
                return
            assert outer.transport is not None
            outer.transport.resume_reading()
            await lost  # until the inner side closes (the outer closing closes it)
        except OSError as e:
            log.warning("gRPC front: cannot reach the private listener: %s", e)
            if outer.transport is not None:
                outer.transport.close()
        finally:
            if inner.transport is not None:
                inner.transport.close()
            self.release(uid)


class _Outer(_Half):
    """The client's side: on connect, read its credentials and start the relay."""

    def __init__(self, front: UnixFront) -> None:
        super().__init__()
        self._front = front

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        try:
            pid, uid, gid = peer_credentials(sock)
        except OSError as e:
            log.warning("gRPC front: cannot read a client's credentials (%s); closing", e)
            transport.close()
            return
        if not self._front.admit(uid):
            transport.close()
            return
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()  # until the relay is set up
        self._front.relay(self, pid, uid, gid)
