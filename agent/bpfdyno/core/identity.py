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


#: The capabilities that override file permissions and ownership: what the kernel drops
#: from the effective set when the file-system uid leaves 0 (its ``CAP_FS_MASK``: CHOWN,
#: DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER, FSETID, LINUX_IMMUTABLE, MAC_OVERRIDE).
FS_CAPABILITIES = (0, 1, 2, 3, 4, 9, 32)
_FS_MASK = sum(1 << c for c in FS_CAPABILITIES)
#: ``_LINUX_CAPABILITY_VERSION_3``: two 32-bit words per set.
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


_CapSets = _CapData * 2


def _thread_caps(libc: ctypes.CDLL) -> ctypes.Array[_CapData]:
    """The calling thread's capability sets (``capget(2)`` with pid 0: this thread)."""
    header, data = _CapHeader(_CAP_VERSION_3, 0), _CapSets()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise FileIdentityError(
            f"cannot read this thread's capabilities ({os.strerror(ctypes.get_errno())})"
        )
    return data


def _set_thread_caps(libc: ctypes.CDLL, data: ctypes.Array[_CapData]) -> None:
    """``capset(2)`` for the calling thread only (glibc's wrapper is the bare system call:
    unlike setuid or setgroups, it is not broadcast to the process's other threads)."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise FileIdentityError(
            f"cannot change this thread's capabilities ({os.strerror(ctypes.get_errno())})"
        )


def _effective(data: ctypes.Array[_CapData]) -> int:
    return int(data[0].effective) | int(data[1].effective) << 32


def thread_fs_capabilities() -> int:
    """The file-system capabilities in the calling thread's effective set (a bit mask of
    `FS_CAPABILITIES`; 0 when none)."""
    return _effective(_thread_caps(ctypes.CDLL(None, use_errno=True))) & _FS_MASK


@contextlib.contextmanager
def _without_fs_capabilities(libc: ctypes.CDLL) -> Iterator[None]:
    """The calling thread without `FS_CAPABILITIES` in its effective set, verified; the
    previous sets restored afterwards.

    setfsuid(2) drops them only when the file-system uid leaves 0: an agent that runs as
    its own user with ambient capabilities (the packaged unit: CAP_DAC_READ_SEARCH) would
    keep reading past every permission "as the owner". Capabilities are per thread, so the
    agent's other threads keep theirs.
    """
    saved = _thread_caps(libc)
    reduced = _CapSets()
    for i in range(2):
        keep = ~(_FS_MASK >> (32 * i)) & 0xFFFFFFFF
        reduced[i].effective = saved[i].effective & keep
        reduced[i].permitted = saved[i].permitted
        reduced[i].inheritable = saved[i].inheritable
    _set_thread_caps(libc, reduced)
    try:
        if _effective(_thread_caps(libc)) & _FS_MASK:
            raise FileIdentityError(
                "this thread kept capabilities that override file permissions after they "
                "were dropped; not acting on files as another user"
            )
        yield
    finally:
        _set_thread_caps(libc, saved)


@contextlib.contextmanager
def files_as(uid: int, gid: int, groups: tuple[int, ...] | None = None) -> Iterator[None]:
    """Open, create and rename files on this thread with ``uid``/``gid``'s rights only.

    The agent runs as root (or as its own user with capabilities) but writes into
    directories its users control (merging kernel tracks into their trace files) and reads
    their files. Switching the thread's file-system uid and gid (``setfsuid(2)``/
    ``setfsgid(2)``: per thread, file access only), its supplementary groups (the user's own
    instead of the agent's: an agent started from a login with groups such as ``adm`` or
    ``disk`` must not lend them) and dropping the capabilities that override file
    permissions from the thread's effective set (see `_without_fs_capabilities`) makes every
    path lookup and permission check the owner's own, so a link the owner planted cannot
    make the agent read or write anything the owner could not. Files created meanwhile
    belong to ``uid``. The agent's other threads keep their identity throughout.

    Args:
        uid, gid: whose rights.
        groups: the supplementary groups to act with (default: ``uid``'s in the group
            database, see `user_groups`).

    Raises:
        FileIdentityError: the switch was refused (not root and no CAP_SETUID/CAP_SETGID),
            or the capabilities could not be dropped.
    """
    if uid == os.geteuid() == ROOT_UID and groups is None:
        yield  # root acting as root
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
        with _without_fs_capabilities(libc):
            yield
    finally:
        libc.setfsuid(old_uid)  # back to a privileged fsuid first, so the gid can change
        libc.setfsgid(old_gid)
        _set_thread_groups(libc, old_groups)


def primary_gid(uid: int) -> int:
    """``uid``'s primary group in the passwd database; for a uid without an entry (a
    container's), the group of the same number."""
    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def file_owner(owner_uid: int | None, path: str) -> tuple[int, int]:
    """(uid, gid) to read or write a traced process's file as: its owner (root when unknown)
    with the group the file was created with when that group is one of the owner's own
    (Kineto creates it with the trainer's group), else the owner's primary group.

    The file's group alone is not enough: a user may own a file of a group she has left
    (or was never in: chown to her own groups only, but membership changes), and acting
    with it would lend her that group's files.
    """
    uid = owner_uid if owner_uid is not None else ROOT_UID
    primary = primary_gid(uid)
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if st.st_uid == uid and st.st_gid in user_groups(uid, primary):
            return uid, st.st_gid
    return uid, primary
