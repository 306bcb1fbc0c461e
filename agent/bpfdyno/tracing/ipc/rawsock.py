"""recvfrom / sendto on the non-blocking IPC socket *without releasing the GIL*.

Python's socket methods release the GIL around every system call. When another thread of
the daemon runs Python code (a collector walking /proc), each release hands it the GIL for a
whole switch interval, so answering 64 queued polls costs 128 hand-overs: tens of
milliseconds instead of one (the "convoy effect"; measured in docs/performance.md). The
socket is non-blocking, so its calls never wait and there is nothing to gain by releasing
the GIL; libc's functions are called through ``ctypes.PyDLL``, which keeps it.

Falls back to the socket module where libc cannot be loaded.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct

_AF_UNIX = struct.pack("=H", socket.AF_UNIX)
_SOCKADDR_UN_SIZE = 110  # sa_family_t + sun_path[108]
_RECV_FLAGS = socket.MSG_DONTWAIT | socket.MSG_TRUNC  # MSG_TRUNC: report the real length

try:
    _libc = ctypes.PyDLL(None, use_errno=True)
    _recvfrom = _libc.recvfrom
    _recvfrom.restype = ctypes.c_ssize_t
    _recvfrom.argtypes = [
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_void_p,
        ctypes.POINTER(ctypes.c_uint32),
    ]
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
        self._pybuf = bytearray(bufsize + 1)  # one more byte: a longer datagram shows as such
        self._bufsize = bufsize
        self._addr = ctypes.create_string_buffer(_SOCKADDR_UN_SIZE)
        self._addr_name = ctypes.addressof(self._addr) + 2
        self._addrlen = ctypes.c_uint32(0)
        self._addrlen_ref = ctypes.byref(self._addrlen)
        self._last: bytes | None = None  # the name in self._addr, reused for the reply
        self._out = ctypes.create_string_buffer(_SOCKADDR_UN_SIZE)

    def recvfrom(self) -> tuple[bytes, int, bytes | None]:
        """One datagram: (its first ``bufsize`` bytes, its full length, sender or None).

        Raises:
            BlockingIOError: nothing is queued.
            OSError: any other receive error.
        """
        if not self._use_libc:
            n, sender = self._sock.recvfrom_into(self._pybuf)
            if isinstance(sender, str):
                sender = os.fsencode(sender)
            return bytes(self._pybuf[: min(n, len(self._buf))]), n, sender or None
        self._addrlen.value = _SOCKADDR_UN_SIZE
        self._last = None
        n = _recvfrom(
            self._fd, self._buf, self._bufsize, _RECV_FLAGS, self._addr, self._addrlen_ref
        )
        if n < 0:
            _raise_errno()
        data = ctypes.string_at(self._buf, n if n < self._bufsize else self._bufsize)
        namelen = self._addrlen.value - 2
        if namelen <= 0:
            return data, n, None
        name = ctypes.string_at(self._addr_name, namelen)
        if name[0] != 0:
            name = name.split(b"\0", 1)[0]  # a path: up to its terminating NUL
        self._last = name
        return data, n, name

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
            out, outlen = self._addr, self._addrlen.value
        else:
            if len(address) > _SOCKADDR_UN_SIZE - 2:
                raise OSError(36, "address too long")
            ctypes.memmove(self._out, _AF_UNIX + address, 2 + len(address))
            out, outlen = self._out, 2 + len(address)
        if _sendto(self._fd, data, len(data), socket.MSG_DONTWAIT, out, outlen) < 0:
            _raise_errno()
