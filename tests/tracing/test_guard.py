"""The kernel guard over real sockets: which senders reach a guarded abstract name (the
attack as real users against a served agent is in test_attacks_kineto)."""

from __future__ import annotations

import errno
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.tracing.ipc.guard import KernelGuard, cgroup2_root

pytestmark = pytest.mark.root

OWNER, OTHER = 4242, 4343


def _as(uid: int, address: bytes) -> tuple[str, str]:
    """(sendto, connect) to ``address`` from a process of ``uid``: "ok" or the errno name."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only system calls, then _exit
        try:
            os.setgid(uid)
            os.setuid(uid)
            out = []
            for op in ("sendto", "connect"):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                try:
                    s.sendto(b"x", address) if op == "sendto" else s.connect(address)
                    out.append("ok")
                except OSError as e:
                    out.append(errno.errorcode[e.errno or 0])
            os.write(w, " ".join(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    with os.fdopen(r) as f:
        send, connect = f.read().split()
    return send, connect


@pytest.fixture
def guard() -> Iterator[KernelGuard]:
    g = KernelGuard()
    g.load()
    try:
        yield g
    finally:
        g.close()


@pytest.fixture
def trainer() -> Iterator[bytes]:
    """A bound abstract socket named as libkineto names its own (trailing NUL included)."""
    address = f"\0dynoconfigclient{uuid.uuid4()}\0".encode()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    try:
        yield address
    finally:
        s.close()


def test_only_the_owner_root_and_the_agent_reach_a_guarded_name(
    guard: KernelGuard, trainer: bytes
) -> None:
    assert _as(OTHER, trainer) == ("ok", "ok")  # not registered yet
    guard.protect(trainer, OWNER)
    assert guard.guarded == 1
    assert _as(OTHER, trainer) == ("EPERM", "EPERM")
    assert _as(OWNER, trainer) == ("ok", "ok")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as agent:  # root, the agent
        agent.sendto(b"reply", trainer)
    # The same name without its trailing NUL is another socket: not guarded, not there.
    assert _as(OTHER, trainer[:-1]) == ("ECONNREFUSED", "ECONNREFUSED")
    guard.release(trainer)
    assert _as(OTHER, trainer) == ("ok", "ok")


def test_closing_the_guard_detaches_it(trainer: bytes) -> None:
    g = KernelGuard()
    g.load()
    g.protect(trainer, OWNER)
    assert _as(OTHER, trainer) == ("EPERM", "EPERM")
    g.close()
    assert not g.active
    assert _as(OTHER, trainer) == ("ok", "ok")


def test_paths_are_left_to_the_directories(guard: KernelGuard) -> None:
    guard.protect(b"/tmp/dynoconfigclient-a-path", OWNER)  # only abstract names are kept
    assert guard.guarded == 0


def test_the_cgroup2_hierarchy_is_found_where_it_is_mounted(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    with pytest.raises(BpfLoadError, match="no cgroup v2 hierarchy is mounted"):
        cgroup2_root(str(mounts))
    with mounts.open("a") as f:
        f.write("cgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
    assert cgroup2_root(str(mounts)) == "/sys/fs/cgroup/unified"
