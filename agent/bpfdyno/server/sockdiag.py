"""Who owns the other end of a TCP connection on this host: the kernel's socket diagnostics.

A TCP peer on the same host has a socket of its own, created by some uid. The kernel reports
that uid (``inet_diag_msg.idiag_uid``) for the socket with a given 4-tuple over
``NETLINK_SOCK_DIAG`` (what ``ss -tne`` shows), so a connection accepted on 127.0.0.1:1778 can
be attributed to the user who opened it. A peer on another host — or in another network
namespace — has no socket here: the lookup finds nothing and the peer stays unattributed.

One exact lookup costs one netlink round trip (~0.3 ms from Python here). When our own
address of the connection is not known (a gRPC listener on a wildcard address reports only
the peer), the TCP sockets are dumped and matched instead.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
_ALL_STATES = 0xFFFFFFFF
_NO_COOKIE = 0xFFFFFFFF

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
_REQ_HEAD = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_PORTS = struct.Struct("!HH")  # sport, dport (network order)
_TAIL = struct.Struct("=III")  # if, cookie[2]
_MSG_HEAD = struct.Struct("=BBBB")  # family, state, timer, retrans
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_SOCKID_SIZE = 48
_TIMEOUT_S = 1.0

Address = tuple[str, int]


class SockDiagUnavailable(Exception):
    """The kernel's socket diagnostics cannot be used here (no NETLINK_SOCK_DIAG, or no
    inet_diag support); the message says why."""


def _family_and_bytes(ip: str) -> tuple[int, bytes]:
    """The address family and 16-byte address field for ``ip`` (IPv4-mapped IPv6 → IPv4)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if isinstance(addr, ipaddress.IPv4Address):
        return socket.AF_INET, addr.packed + bytes(12)
    return socket.AF_INET6, addr.packed


def _request(family: int, states: int, sockid: bytes, flags: int, seq: int) -> bytes:
    body = _REQ_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0, states) + sockid
    return _NLMSGHDR.pack(_NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, flags, seq, 0) + body


def _sockid(src: bytes, sport: int, dst: bytes, dport: int) -> bytes:
    return _PORTS.pack(sport, dport) + src + dst + _TAIL.pack(0, _NO_COOKIE, _NO_COOKIE)


def _open() -> socket.socket:
    try:
        s = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG)
    except OSError as e:
        raise SockDiagUnavailable(
            f"cannot open a NETLINK_SOCK_DIAG socket ({e.strerror}); the kernel needs "
            "CONFIG_INET_DIAG (modprobe inet_diag tcp_diag)"
        ) from e
    s.settimeout(_TIMEOUT_S)
    return s


def _messages(data: bytes) -> list[tuple[int, bytes]]:
    """Split a netlink datagram into (type, payload) messages."""
    out, offset = [], 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size:
            break
        out.append((kind, data[offset + _NLMSGHDR.size : offset + length]))
        offset += (length + 3) & ~3
    return out


def _error(payload: bytes) -> int:
    code: int = struct.unpack_from("=i", payload)[0]
    return -code


def _parse(payload: bytes) -> tuple[bytes, int, bytes, int, int]:
    """(src, sport, dst, dport, uid) of an ``inet_diag_msg``."""
    sport, dport = _PORTS.unpack_from(payload, _MSG_HEAD.size)
    base = _MSG_HEAD.size + _PORTS.size
    src, dst = payload[base : base + 16], payload[base + 16 : base + 32]
    uid = _MSG_TAIL.unpack_from(payload, _MSG_HEAD.size + _SOCKID_SIZE)[3]
    return src, sport, dst, dport, uid


def tcp_owner_uid(peer: Address, local: Address) -> int | None:
    """The uid owning the peer's end of our TCP connection ``local`` <- ``peer``.

    Args:
        peer: the connection's remote (ip, port), as getpeername reports it.
        local: our own (ip, port) of that connection (getsockname), or (``""``, port) when
            only the port is known: the established sockets are then searched.

    Returns:
        The uid, or None when no socket on this host (in this network namespace) has that
        address: the peer is elsewhere.

    Raises:
        SockDiagUnavailable: the kernel's socket diagnostics cannot be used.
    """
    family, src = _family_and_bytes(peer[0])
    if not local[0]:
        return _search(family, src, peer[1], local[1])
    local_family, dst = _family_and_bytes(local[0])
    if local_family != family:
        return None
    seq = int.from_bytes(os.urandom(4), "little")
    request = _request(
        family, _ALL_STATES, _sockid(src, peer[1], dst, local[1]), NLM_F_REQUEST, seq
    )
    with _open() as s:
        try:
            s.sendto(request, (0, 0))
            data = s.recv(65536)
        except OSError as e:
            raise SockDiagUnavailable(f"socket diagnostics failed ({e})") from e
    for kind, payload in _messages(data):
        if kind == NLMSG_ERROR:
            code = _error(payload)
            if code in (errno.ENOENT, 0):
                return None
            raise SockDiagUnavailable(
                f"socket diagnostics refused the lookup ({os.strerror(code)}); "
                "the kernel needs CONFIG_INET_DIAG and tcp_diag"
            )
        if kind == SOCK_DIAG_BY_FAMILY:
            return _parse(payload)[4]
    return None


def _search(family: int, src: bytes, sport: int, dport: int) -> int | None:
    """Dump the TCP sockets and find the one at ``src:sport`` talking to ``dport``."""
    seq = int.from_bytes(os.urandom(4), "little")
    sockid = _sockid(bytes(16), 0, bytes(16), 0)
    request = _request(family, _ALL_STATES, sockid, NLM_F_REQUEST | NLM_F_DUMP, seq)
    found: int | None = None
    with _open() as s:
        try:
            s.sendto(request, (0, 0))
            while True:
                data = s.recv(65536)
                for kind, payload in _messages(data):
                    if kind == NLMSG_DONE:
                        return found
                    if kind == NLMSG_ERROR:
                        raise SockDiagUnavailable(
                            f"socket diagnostics refused the dump ({os.strerror(_error(payload))})"
                        )
                    msg_src, msg_sport, _, msg_dport, uid = _parse(payload)
                    if msg_src == src and msg_sport == sport and msg_dport == dport:
                        found = uid
        except OSError as e:
            raise SockDiagUnavailable(f"socket diagnostics failed ({e})") from e
