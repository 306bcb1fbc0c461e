"""Who is on the other end: socket diagnostics for TCP peers, the Unix front for gRPC.

Peers are real processes that switched to another uid (``nobody``) after connecting
nothing: the kernel reports the uid that owns their socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import encodings.idna  # noqa: F401  # imported before a child drops to uid nobody
import os
import shutil
import socket
import stat
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bpfdyno.server.peers import TcpIdentityInterceptor, front_name, requester_from_peer
from bpfdyno.server.sockdiag import tcp_owner_uid
from bpfdyno.server.unix_front import UnixFront, peer_credentials

NOBODY = 65534
_kept: list[socket.socket] = []  # the child's connections stay open while it waits


def connect_tcp(host: str, port: int) -> Callable[[], None]:
    return lambda: _kept.append(socket.create_connection((host, port)))


@contextlib.contextmanager
def as_nobody(act: Callable[[], None]) -> Iterator[int]:
    """Fork a child that becomes uid/gid 65534 and runs ``act``; yield its pid."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            act()
            os.write(write_end, b"1")
            time.sleep(30)
        except BaseException:
            traceback.print_exc(file=sys.stderr)
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        assert os.read(read_end, 1) == b"1", "the child failed"
        yield pid
    finally:
        os.close(read_end)
        os.kill(pid, 9)
        os.waitpid(pid, 0)


def test_tcp_owner_of_a_loopback_peer() -> None:
    for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with socket.socket(family, socket.SOCK_STREAM) as srv:
            srv.bind((host, 0))
            srv.listen()
            port = srv.getsockname()[1]
            with as_nobody(connect_tcp(host, port)):
                conn, peer = srv.accept()
                with conn:
                    local = conn.getsockname()
                    assert tcp_owner_uid(peer[:2], local[:2]) == NOBODY
                    # Our own address unknown (a wildcard listener): found by searching.
                    assert tcp_owner_uid(peer[:2], ("", port)) == NOBODY
                    assert tcp_owner_uid((host, 1), local[:2]) is None  # nobody there


def test_ipv4_client_on_a_dual_stack_listener() -> None:
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as srv:
        srv.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        srv.bind(("::", 0))
        srv.listen()
        port = srv.getsockname()[1]
        with as_nobody(connect_tcp("127.0.0.1", port)):
            conn, peer = srv.accept()
            with conn:
                assert peer[0] == "::ffff:127.0.0.1"
                assert tcp_owner_uid(peer[:2], conn.getsockname()[:2]) == NOBODY


def test_front_names_are_trusted_only_in_a_root_only_directory(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    name = front_name(1000, 1000, 4242, 7)
    who = requester_from_peer(f"unix:{private}/{name}")
    assert (who.uid, who.pid, who.transport, who.peer) == (1000, 4242, "grpc-unix", "pid 4242")
    # The same name anywhere a user could bind it proves nothing.
    os.chmod(private, 0o755)
    assert requester_from_peer(f"unix:{private}/{name}").uid is None
    os.chmod(private, 0o700)
    os.chown(private, NOBODY, NOBODY)
    assert requester_from_peer(f"unix:{private}/{name}").uid is None
    assert requester_from_peer("unix:").uid is None  # a client straight to a gRPC socket
    assert requester_from_peer("ipv4:127.0.0.1:5000").uid is None  # TCP without its listener


def test_front_names_are_trusted_in_the_agents_own_directory_when_it_is_not_root() -> None:
    """The systemd unit runs the agent as an unprivileged user: its private directory is that
    user's, and the names the front binds there are the agent's own."""
    base = Path(tempfile.mkdtemp(prefix="bdpriv-", dir="/tmp"))
    os.chmod(base, 0o755)  # the agent's user must reach it
    private = base / "private"
    private.mkdir(mode=0o700)
    os.chown(private, NOBODY, NOBODY)
    name = f"unix:{private}/{front_name(1000, 1000, 4242, 7)}"

    def as_the_agent() -> None:  # fails the child, and so the test, on a wrong answer
        assert requester_from_peer(name).uid == 1000
        os.chmod(private, 0o755)  # others may enter: no longer private
        assert requester_from_peer(name).uid is None

    try:
        with as_nobody(as_the_agent):
            pass
    finally:
        shutil.rmtree(base)


async def test_front_relays_with_the_clients_credentials() -> None:
    """A client running as nobody connects to the front; the inner end sees its name."""
    base = Path(tempfile.mkdtemp(prefix="bdfront-", dir="/tmp"))
    os.chmod(base, 0o755)  # nobody must reach the public socket
    public = str(base / "front.sock")
    front = UnixFront(public)
    seen: list[str] = []
    echoed = asyncio.Event()

    async def inner(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        seen.append(sock.getpeername())
        data = await reader.readexactly(5)
        writer.write(data.upper())
        await writer.drain()
        echoed.set()
        writer.close()

    server = await asyncio.start_unix_server(inner, front.internal_target[len("unix:") :])
    front.bind()
    os.chmod(public, 0o666)
    await front.start()
    try:
        assert stat.S_IMODE(os.stat(front.private_dir).st_mode) == 0o700
        replies: list[bytes] = []

        def client() -> None:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(public)
                s.sendall(b"hello")
                replies.append(s.recv(5))
                assert replies[-1] == b"HELLO"

        loop = asyncio.get_running_loop()
        child_pid = await loop.run_in_executor(None, _run_as_nobody, client)
        await asyncio.wait_for(echoed.wait(), 10)
        [name] = seen
        assert os.path.dirname(name) == front.private_dir
        assert os.path.basename(name) == front_name(NOBODY, NOBODY, child_pid, 1)
        assert not os.path.exists(name)  # removed at once; the kernel keeps the name
        assert requester_from_peer(f"unix:{name}").uid == NOBODY
    finally:
        await front.stop()
        server.close()
        await server.wait_closed()
        shutil.rmtree(base)
    assert not os.path.exists(front.private_dir)


def _run_as_nobody(act: Callable[[], None]) -> int:
    with as_nobody(act) as pid:
        return pid


def test_peer_credentials_of_a_socket_pair() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_credentials(a) == (os.getpid(), os.getuid(), os.getgid())


class _Context:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer


def test_authenticated_tcp_clients_act_as_the_configured_uid() -> None:
    token = TcpIdentityInterceptor(0, "0.0.0.0", "bearer token")
    who = token.requester(_Context("ipv4:10.1.2.3:5555"))
    assert (who.uid, who.transport, who.peer, who.note) == (
        0,
        "grpc-tcp",
        "10.1.2.3:5555",
        "TLS + bearer token",
    )
    mtls = TcpIdentityInterceptor(4000, "", "client certificate")
    assert mtls.requester(_Context("ipv6:[fd00::1]:5555")).uid == 4000
    reader = TcpIdentityInterceptor(-1, "", "bearer token")
    assert reader.requester(_Context("ipv4:10.1.2.3:5555")).uid is None


def test_insecure_tcp_clients_act_as_their_sockets_owner() -> None:
    insecure = TcpIdentityInterceptor(0, "127.0.0.1", None)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        insecure.port = srv.getsockname()[1]
        with as_nobody(connect_tcp("127.0.0.1", insecure.port)):
            conn, (host, port) = srv.accept()
            with conn:
                who = insecure.requester(_Context(f"ipv4:{host}:{port}"))
                assert (who.uid, who.peer) == (NOBODY, f"127.0.0.1:{port}")
    # A peer that is not on this host has no socket here: unattributed.
    assert insecure.requester(_Context("ipv4:192.0.2.7:4000")).uid is None


async def test_front_releases_closed_connections_and_limits_each_uid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    base = Path(tempfile.mkdtemp(prefix="bdfront-", dir="/tmp"))
    front = UnixFront(str(base / "front.sock"))
    inner = await asyncio.start_unix_server(
        lambda r, w: None, front.internal_target[len("unix:") :]
    )  # accepts and never answers, like gRPC waiting for a preface
    front.bind()
    await front.start()
    loop = asyncio.get_running_loop()

    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(front.public_path)
        return s

    try:
        # Clients that connect and leave at once: nothing stays open for them.
        for _ in range(10):
            (await loop.run_in_executor(None, connect)).close()
        async with asyncio.timeout(10):
            while front.relayed < 10 or front._limits.active:
                await asyncio.sleep(0.02)
        # One uid holds at most MAX_CONNECTIONS_PER_UID relays (3 here); the next is closed.
        monkeypatch.setattr(front._limits, "max_per_peer", 3)
        held = [await loop.run_in_executor(None, connect) for _ in range(3)]
        async with asyncio.timeout(10):
            while front._limits.active < 3:
                await asyncio.sleep(0.02)
        extra = await loop.run_in_executor(None, connect)
        extra.settimeout(10)
        assert await loop.run_in_executor(None, extra.recv, 1) == b""  # closed by the front
        assert front.refused == 1
        for s in [*held, extra]:
            s.close()
    finally:
        await front.stop()
        inner.close()
        shutil.rmtree(base)
