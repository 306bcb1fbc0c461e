"""A NIC driver's own statistics through the kernel's ethtool ioctls.

``ETHTOOL_GSSET_INFO`` says how many statistics the driver has, ``ETHTOOL_GSTRINGS`` names
them (as the driver spells them: mlx5's ``rx_discards_phy``, veth's ``peer_ifindex``...), and
``ETHTOOL_GSTATS`` reads their values, all through ``SIOCETHTOOL`` on a datagram socket of the
agent's network namespace; ``ETHTOOL_GDRVINFO`` names the driver. Names are read once per
interface and count, values every collection.

The kernel writes as many entries as the driver has *when it answers*, whatever the caller
asked for, so a driver that grew its statistics between the count and the read (its queues
were reconfigured) would write past a buffer sized for the count. The answers are therefore
written into memory that ends at a page the process may not touch: such a read fails with
EFAULT instead of corrupting the agent, and is retried with the new count.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
#: struct ethtool_drvinfo: cmd, driver, version, fw_version, bus_info, erom_version,
#: reserved2, n_priv_flags, n_stats, testinfo_len, eedump_len, regdump_len.
_DRVINFO = struct.Struct("<I32s32s32s32s32s12sIIIII")
_NOT_SUPPORTED = (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL)

_libc: ctypes.CDLL | None = None


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """What ``ETHTOOL_GDRVINFO`` says of an interface: driver name and bus address."""

    driver: str
    bus_info: str


class _GuardedBuffer:
    """Anonymous memory followed by a page the process may not touch; a request of ``size``
    bytes is placed so that it ends where that page begins."""

    def __init__(self, size: int) -> None:
        global _libc
        page = mmap.PAGESIZE
        pages = max(1, (size + page - 1) // page)
        self._map = mmap.mmap(-1, (pages + 1) * page)
        anchor = ctypes.c_char.from_buffer(self._map)
        self._base = ctypes.addressof(anchor)
        del anchor  # the address stays valid while the map lives
        if _libc is None:
            _libc = ctypes.CDLL(None, use_errno=True)
        guard = ctypes.c_void_p(self._base + pages * page)
        if _libc.mprotect(guard, ctypes.c_size_t(page), 0) != 0:  # PROT_NONE
            err = ctypes.get_errno()
            self._map.close()
            raise OSError(err, f"mprotect of a guard page failed: {errno.errorcode.get(err)}")
        #: The most a request may take.
        self.capacity = pages * page

    def exchange(self, ioctl: Callable[[int], None], request: bytes, size: int) -> bytes:
        """Write ``request`` at the start of a ``size``-byte region ending at the guard page,
        call ``ioctl`` with the region's address, and return the region."""
        offset = self.capacity - size
        self._map[offset : offset + len(request)] = request
        ioctl(self._base + offset)
        return self._map[offset : offset + size]

    def close(self) -> None:
        self._map.close()


class Ethtool:
    """The ethtool ioctls on one socket; use as a context manager or `close` it.

    Raises:
        OSError: no datagram socket could be opened.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._buffer: _GuardedBuffer | None = None

    def close(self) -> None:
        """Close the socket and free the buffer."""
        self._sock.close()
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None

    def __enter__(self) -> Ethtool:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _call(self, ifname: str, request: bytes, size: int) -> bytes:
        """One SIOCETHTOOL request of ``size`` bytes (the answer's), in a guarded buffer that
        is kept and grown as needed (mapping one per call cost more than the call)."""
        name = ifname.encode()
        if not name or len(name) >= IFNAMSIZ:
            raise OSError(errno.EINVAL, f"{ifname!r} is not an interface name")
        size = max(size, len(request))
        if self._buffer is None or self._buffer.capacity < size:
            if self._buffer is not None:
                self._buffer.close()
            self._buffer = _GuardedBuffer(size)

        def ioctl(address: int) -> None:
            ifreq = struct.pack("16sP", name, address).ljust(40, b"\0")
            fcntl.ioctl(self._sock.fileno(), SIOCETHTOOL, ifreq)

        return self._buffer.exchange(ioctl, request, size)

    def driver_info(self, ifname: str) -> DriverInfo:
        """The interface's driver and bus address ("" for a virtual device's bus).

        Raises:
            OSError: no such interface, or the driver answers no ethtool request.
        """
        raw = self._call(ifname, struct.pack("<I", ETHTOOL_GDRVINFO), _DRVINFO.size)
        fields = _DRVINFO.unpack(raw)
        return DriverInfo(_cstr(fields[1]), _cstr(fields[4]))

    def stat_count(self, ifname: str) -> int:
        """How many statistics the driver has; 0 when it has none (loopback, bridges).

        Raises:
            OSError: no such interface (ENODEV), or another failure.
        """
        request = struct.pack("<IIQ", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_STATS)
        try:
            raw = self._call(ifname, request, len(request) + 4)
        except OSError as e:
            if e.errno in _NOT_SUPPORTED:
                return 0
            raise
        _, _, mask, count = struct.unpack("<IIQI", raw)
        return count if mask & (1 << ETH_SS_STATS) else 0

    def stat_names(self, ifname: str, count: int) -> list[str] | None:
        """The names of the driver's ``count`` statistics; None if it has another number now.

        Raises:
            OSError: the interface or the request failed.
        """
        header = struct.pack("<III", ETHTOOL_GSTRINGS, ETH_SS_STATS, count)
        raw = self._guarded(ifname, header, count * ETH_GSTRING_LEN)
        if raw is None:
            return None
        (n,) = struct.unpack_from("<I", raw, 8)
        if n != count:
            return None
        body = raw[len(header) :]
        return [_cstr(body[i * ETH_GSTRING_LEN : (i + 1) * ETH_GSTRING_LEN]) for i in range(n)]

    def stat_values(self, ifname: str, count: int) -> list[int] | None:
        """The values of the driver's ``count`` statistics; None if it has another number now.

        Raises:
            OSError: the interface or the request failed.
        """
        header = struct.pack("<II", ETHTOOL_GSTATS, count)
        raw = self._guarded(ifname, header, count * 8)
        if raw is None:
            return None
        (n,) = struct.unpack_from("<I", raw, 4)
        if n != count:
            return None
        return list(struct.unpack_from(f"<{n}Q", raw, len(header)))

    def _guarded(self, ifname: str, header: bytes, body: int) -> bytes | None:
        """The answer of a request whose body the kernel sizes itself; None on EFAULT (the
        driver has more entries than ``body`` holds now)."""
        try:
            return self._call(ifname, header, len(header) + body)
        except OSError as e:
            if e.errno == errno.EFAULT:
                return None
            raise


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


class DriverStatsReader:
    """Interfaces' driver statistics by name: the names read once per interface and kept
    until the driver's number of statistics changes, the values on every `read`.

    Args:
        ethtool: the ioctls.
    """

    def __init__(self, ethtool: Ethtool) -> None:
        self._ethtool = ethtool
        self._names: dict[str, list[str]] = {}

    def read(self, ifname: str) -> tuple[list[str], list[int]] | None:
        """(names, values) of the interface's statistics now; None when its driver has none.

        The names list is the same object until the driver's statistics change, so a caller
        can key what it derives from them on it.

        Raises:
            OSError: the interface is gone or the driver failed the request.
        """
        for _ in range(2):  # once more if the number changed between the calls
            count = self._ethtool.stat_count(ifname)
            if count == 0:
                self._names.pop(ifname, None)
                return None
            names = self._names.get(ifname)
            if names is None or len(names) != count:
                fresh = self._ethtool.stat_names(ifname, count)
                if fresh is None:
                    continue
                names = self._names[ifname] = fresh
            values = self._ethtool.stat_values(ifname, count)
            if values is not None:
                return names, values
            self._names.pop(ifname, None)
        return None

    def forget(self, ifname: str) -> None:
        """Drop what is kept of an interface that is gone."""
        self._names.pop(ifname, None)
