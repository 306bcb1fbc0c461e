"""recvmsg / sendto on the non-blocking IPC socket *without releasing the GIL*.

Python's socket methods release the GIL around every system call. When another thread of
the daemon runs Python code (a collector walking /proc), each release hands it the GIL for a
whole switch interval, so answering 64 queued polls costs 128 hand-overs: tens of
milliseconds instead of one (the "convoy effect"; measured in docs/performance.md). The
socket is non-blocking, so its calls never wait and there is nothing to gain by releasing
the GIL; libc's functions are called through ``ctypes.PyDLL``, which keeps it.

Each datagram comes with its sender's kernel credentials (``SCM_CREDENTIALS``: pid, uid,
gid) when the socket has ``SO_PASSCRED`` set, so the endpoint knows who really polls
(`bpfdyno.tracing.ipc.sender`).

Falls back to the socket module where libc cannot be loaded.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

from bpfdyno.tracing.ipc.sender import SenderCreds

_AF_UNIX = struct.pack("=H", socket.AF_UNIX)
_SOCKADDR_UN_SIZE = 110  # sa_family_t + sun_path[108]
_RECV_FLAGS = socket.MSG_DONTWAIT | socket.MSG_TRUNC  # MSG_TRUNC: report the real length
_SCM_CREDENTIALS = getattr(socket, "SCM_CREDENTIALS", 2)
_UCRED = struct.Struct("=iII")  # struct ucred: pid_t pid; uid_t uid; gid_t gid
#: Ancillary space for one SCM_CREDENTIALS message (CMSG_SPACE(sizeof(struct ucred))).
CRED_SPACE = socket.CMSG_SPACE(_UCRED.size)


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_void_p),
        ("namelen", ctypes.c_uint32),
        ("iov", ctypes.POINTER(_IoVec)),
        ("iovlen", ctypes.c_size_t),
        ("control", ctypes.c_void_p),
        ("controllen", ctypes.c_size_t),
        ("flags", ctypes.c_int),
    ]


class _CredCmsg(ctypes.Structure):
    """A control buffer holding one cmsghdr followed by a struct ucred."""

    _fields_ = [
        ("len", ctypes.c_size_t),
        ("level", ctypes.c_int),
        ("type", ctypes.c_int),
        ("pid", ctypes.c_int32),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


_CMSG_MIN = _CredCmsg.pid.offset + _UCRED.size  # header + ucred
_CMSG_SPACE = ctypes.sizeof(_CredCmsg)

try:
    _libc = ctypes.PyDLL(None, use_errno=True)
    _recvmsg = _libc.recvmsg
    _recvmsg.restype = ctypes.c_ssize_t
    _recvmsg.argtypes = [ctypes.c_int, ctypes.POINTER(_MsgHdr), ctypes.c_int]
    _sendto = _libc.sendto
    _sendto.restype = ctypes.c_ssize_t
    _sendto.argtypes = [
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_uint32,
    ]
    AVAILABLE = True
except (OSError, AttributeError):  # pragma: no cover - libc always has them on Linux
    AVAILABLE = False


def _raise_errno() -> None:
    e = ctypes.get_errno()
    raise OSError(e, os.strerror(e))  # becomes BlockingIOError, ConnectionRefusedError...


class DatagramIO:
    """Receive and send datagrams on ``sock`` (AF_UNIX, SOCK_DGRAM, non-blocking).

    With ``keep_gil`` False (or without libc) the socket module is used instead. Addresses
    are bytes: abstract names keep their leading and trailing NULs, paths are
    the path without a terminating NUL.
    """

    def __init__(self, sock: socket.socket, bufsize: int, keep_gil: bool = True) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._use_libc = AVAILABLE and keep_gil
        self._buf = ctypes.create_string_buffer(bufsize)
        self._bufsize = bufsize
        self._addr = ctypes.create_string_buffer(_SOCKADDR_UN_SIZE)
        self._addr_name = ctypes.addressof(self._addr) + 2
        self._last: bytes | None = None  # the name in self._addr, reused for the reply
        self._last_len = 0
        self._out = ctypes.create_string_buffer(_SOCKADDR_UN_SIZE)
        # One msghdr reused for every call; only the lengths are reset.
        self._iov = _IoVec(ctypes.addressof(self._buf), bufsize)
        self._cmsg = _CredCmsg()
        self._msg = _MsgHdr(
            ctypes.addressof(self._addr),
            _SOCKADDR_UN_SIZE,
            ctypes.pointer(self._iov),
            1,
            ctypes.addressof(self._cmsg),
            ctypes.sizeof(self._cmsg),
            0,
        )
        self._msg_ref = ctypes.byref(self._msg)

    def recvmsg(self) -> tuple[bytes, int, bytes | None, SenderCreds | None]:
        """One datagram: (its first ``bufsize`` bytes, its full length, sender or None, the
        sender's credentials or None when the socket lacks ``SO_PASSCRED``).

        Raises:
            BlockingIOError: nothing is queued.
            OSError: any other receive error.
        """
        if not self._use_libc:
            return self._recvmsg_socket()
        msg = self._msg
        msg.namelen = _SOCKADDR_UN_SIZE
        msg.controllen = _CMSG_SPACE
        self._last = None
        n = _recvmsg(self._fd, self._msg_ref, _RECV_FLAGS)
        if n < 0:
            _raise_errno()
        data = ctypes.string_at(self._buf, n if n < self._bufsize else self._bufsize)
        creds: SenderCreds | None = None
        cm = self._cmsg
        if (
            msg.controllen >= _CMSG_MIN
            and cm.level == socket.SOL_SOCKET
            and cm.type == _SCM_CREDENTIALS
        ):
            creds = SenderCreds(cm.pid, cm.uid, cm.gid)
        namelen = msg.namelen - 2
        if namelen <= 0:
            return data, n, None, creds
        name = ctypes.string_at(self._addr_name, namelen)
        if name[0] != 0:
            name = name.split(b"\0", 1)[0]  # a path: up to its terminating NUL
        self._last = name
        self._last_len = msg.namelen
        return data, n, name, creds

    def _recvmsg_socket(self) -> tuple[bytes, int, bytes | None, SenderCreds | None]:
        # One byte more than the buffer: a longer datagram shows as such (and is refused).
        data, ancillary, _, sender = self._sock.recvmsg(self._bufsize + 1, CRED_SPACE)
        size = len(data)
        creds: SenderCreds | None = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == _SCM_CREDENTIALS:
                pid, uid, gid = _UCRED.unpack_from(payload)
                creds = SenderCreds(pid, uid, gid)
        if isinstance(sender, str):
            sender = os.fsencode(sender)
        return data[: self._bufsize], size, sender or None, creds

    def sendto(self, data: bytes, address: bytes) -> None:
        """Send one datagram to ``address``.

        Raises:
            BlockingIOError: the receiver's queue is full.
            ConnectionRefusedError, FileNotFoundError: nobody is bound there any more.
        """
        if not self._use_libc:
            self._sock.sendto(data, address)
            return
        if address == self._last:  # the usual case: replying to what was just received
            out, outlen = self._addr, self._last_len
        else:
            if len(address) > _SOCKADDR_UN_SIZE - 2:
                raise OSError(36, "address too long")
            ctypes.memmove(self._out, _AF_UNIX + address, 2 + len(address))
            out, outlen = self._out, 2 + len(address)
        if _sendto(self._fd, data, len(data), socket.MSG_DONTWAIT, out, outlen) < 0:
            _raise_errno()
