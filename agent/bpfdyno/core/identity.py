"""Who made a request: the uid the kernel vouches for, and where the request came from.

Every entry point turns its connection into a `Requester` before it calls a service:

* gRPC on the Unix socket: the connecting process's credentials (``SO_PEERCRED``), read by
  the daemon's own front socket (`bpfdyno.server.unix_front`);
* the legacy dyno RPC and gRPC over TCP without TLS: the owner of the peer's socket, when the
  peer is on this host (the kernel's socket diagnostics, `bpfdyno.server.sockdiag`);
* gRPC over TCP with TLS and a token or client certificate: the uid configured for
  authenticated operators (``[grpc] tcp_uid``, root by default);
* code inside the daemon (tests, internal callers): the daemon's own uid.

A requester whose uid cannot be established is *unattributed*: it may read (status,
metrics, trainers) but not act (trace requests are refused naming the rule). Services never
look at transports; they only see a `Requester`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import pwd
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: The uid with every right (root in the daemon's user namespace).
ROOT_UID = 0


@dataclass(frozen=True, slots=True)
class Requester:
    """The origin of one request.

    Attributes:
        uid: the requester's uid as the kernel reports it; None when it cannot be
            established (then ``note`` says why).
        transport: the entry point: ``grpc-unix``, ``grpc-tcp``, ``legacy-rpc``,
            ``in-process``.
        peer: where it came from, for humans and the audit log (``pid 4242``,
            ``127.0.0.1:53122``).
        pid: the requesting process in the daemon's pid namespace; 0 when unknown (TCP).
        note: how the identity was established, or why it could not be.
    """

    uid: int | None
    transport: str
    peer: str = ""
    pid: int = 0
    note: str = ""

    @property
    def attributed(self) -> bool:
        """True when the request's uid is known."""
        return self.uid is not None

    @property
    def privileged(self) -> bool:
        """True for root: it may act on every process and file."""
        return self.uid == ROOT_UID

    @property
    def user(self) -> str:
        """The uid's user name ("" when unknown or unattributed)."""
        return user_name(self.uid) if self.uid is not None else ""


def user_name(uid: int) -> str:
    """The name of ``uid`` in the passwd database ("" when it has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return ""


#: Where subordinate uid ranges are delegated (``newuidmap``, rootless containers).
SUBUID_FILE = Path("/etc/subuid")


class Principals:
    """Who stands behind a uid when resources are shared out: the user itself, or for a
    subordinate uid (``/etc/subuid``: ``alice:100000:65536``) the user it is delegated to.

    A user with a subordinate range runs processes as each of its uids (a rootless
    container), so limits counted per uid would give that one user thousands of shares.
    Only quotas use this; what a request may act on stays decided by its real uid.

    Args:
        path: the subordinate uid file (re-read when it changes).
    """

    def __init__(self, path: Path = SUBUID_FILE) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._ranges: list[tuple[int, int, int]] = []  # (first, end, owner uid)

    def of(self, uid: int) -> int:
        """The uid that ``uid``'s use counts against."""
        self._refresh()
        for first, end, owner in self._ranges:
            if first <= uid < end:
                return owner
        return uid

    def _refresh(self) -> None:
        try:
            st = self._path.stat()
        except OSError:
            self._stamp, self._ranges = None, []
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        ranges = []
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in self._path.read_text(encoding="utf-8").splitlines()[:MAX_SUBUID_LINES]:
                name, _, rest = line.partition(":")
                first, _, count = rest.partition(":")
                owner = _uid_of(name)
                if owner is not None and first.isdigit() and count.isdigit():
                    ranges.append((int(first), int(first) + int(count), owner))
        self._ranges = ranges


#: Lines of /etc/subuid read (one per user with a range; more is not a real system).
MAX_SUBUID_LINES = 100_000


def _uid_of(name: str) -> int | None:
    if name.isdigit():
        return int(name)
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def owner_or_root(uid: int | None) -> int:
    """A file or process owner, with an unknown one taken as root (the safe side: only
    root-controlled places pass as root's)."""
    return ROOT_UID if uid is None else uid


def in_process() -> Requester:
    """The daemon itself (or a test driving it in process): the daemon's own uid."""
    return Requester(
        uid=os.geteuid(), transport="in-process", pid=os.getpid(), note="inside the daemon"
    )


def unattributed(transport: str, peer: str, why: str) -> Requester:
    """A requester whose uid could not be established, and why."""
    return Requester(uid=None, transport=transport, peer=peer, note=why)


class FileIdentityError(OSError):
    """The file-system identity could not be switched (the agent lacks CAP_SETUID/SETGID)."""


#: ``setgroups(2)``'s number per architecture: glibc's ``setgroups()`` (and so Python's
#: ``os.setgroups``) changes the groups of *every* thread of the process (it signals each
#: one to make the call), so the per-thread switch calls the system call itself.
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159, "riscv64": 159, "ppc64le": 81, "s390x": 206}


def user_groups(uid: int, gid: int) -> tuple[int, ...]:
    """The supplementary groups ``uid`` has in the group database (with ``gid`` first);
    just ``gid`` for a uid without a passwd entry."""
    name = user_name(uid)
    if not name:
        return (gid,)
    try:
        groups = os.getgrouplist(name, gid)
    except OSError:
        return (gid,)
    return (gid, *(g for g in groups if g != gid))


def _set_thread_groups(libc: ctypes.CDLL, groups: tuple[int, ...]) -> None:
    """``setgroups(2)`` for the calling thread only.

    Raises:
        FileIdentityError: refused (no CAP_SETGID), or an architecture not in the table.
    """
    number = _SYS_SETGROUPS.get(platform.machine())
    if number is None:
        raise FileIdentityError(
            f"cannot set one thread's supplementary groups on {platform.machine()} (its "
            "setgroups system call number is not known here); kernel tracks are not merged"
        )
    array = (ctypes.c_uint * max(len(groups), 1))(*groups)
    if libc.syscall(ctypes.c_long(number), ctypes.c_size_t(len(groups)), array) != 0:
        raise FileIdentityError(
            f"cannot set this thread's groups ({os.strerror(ctypes.get_errno())}); run the "
            "agent as root or give it CAP_SETGID"
        )


@contextlib.contextmanager
def files_as(uid: int, gid: int, groups: tuple[int, ...] | None = None) -> Iterator[None]:
    """Open, create and rename files on this thread with ``uid``/``gid``'s rights only.

    The agent runs as root but writes into directories its users control (merging kernel
    tracks into their trace files). Switching the thread's file-system uid and gid
    (``setfsuid(2)``/``setfsgid(2)``: per thread, file access only) and its supplementary
    groups (the user's own instead of the agent's: an agent started from a login with
    groups such as ``adm`` or ``disk`` must not lend them) makes every path lookup and
    permission check the owner's own, so a link the owner planted cannot make the agent
    read or write anything the owner could not. Files created meanwhile belong to ``uid``.
    The agent's other threads keep their identity throughout.

    Args:
        uid, gid: whose rights.
        groups: the supplementary groups to act with (default: ``uid``'s in the group
            database, see `user_groups`).

    Raises:
        FileIdentityError: the switch was refused (not root and no CAP_SETUID/CAP_SETGID).
    """
    if uid == os.geteuid():
        yield
        return
    libc = ctypes.CDLL(None, use_errno=True)
    old_groups = tuple(os.getgroups())  # getgroups(2) is per thread: this thread's own
    _set_thread_groups(libc, user_groups(uid, gid) if groups is None else groups)
    old_gid = libc.setfsgid(gid)
    old_uid = libc.setfsuid(uid)
    # Both calls return the previous value even when they fail: ask again to see the result.
    if libc.setfsuid(uid) != uid or libc.setfsgid(gid) != gid:
        libc.setfsuid(old_uid)
        libc.setfsgid(old_gid)
        _set_thread_groups(libc, old_groups)
        raise FileIdentityError(
            f"cannot act on files as uid {uid} (setfsuid refused); run the agent as root or "
            "give it CAP_SETUID and CAP_SETGID"
        )
    try:
        yield
    finally:
        libc.setfsuid(old_uid)  # back to a privileged fsuid first, so the gid can change
        libc.setfsgid(old_gid)
        _set_thread_groups(libc, old_groups)


def file_owner(owner_uid: int | None, path: str) -> tuple[int, int]:
    """(uid, gid) to read or write a traced process's file as: its owner (root when unknown),
    with the group the file was created with (else the owner's primary group)."""
    uid = owner_uid if owner_uid is not None else ROOT_UID
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if st.st_uid == uid:
            return uid, st.st_gid  # the group Kineto created the file with
    try:
        return uid, pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid, uid
