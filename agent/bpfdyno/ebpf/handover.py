"""The compile helper's answer on the wire: a JSON header and the maps' fds (SCM_RIGHTS).

Both ends use this module: the helper (`bpfdyno.ebpf.compilehelper`) sends, the daemon
(`bpfdyno.ebpf.compiled`) receives. A message is an 8-byte length, then that many bytes of
JSON; the answer's first message carries the fds.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

#: At most this many fds in one answer (the kernel's SCM_MAX_FD is 253).
MAX_FDS = 250
_LEN = struct.Struct("<Q")
#: A request or answer larger than this is refused as corrupt.
_MAX_MESSAGE = 64 << 20


def send(sock: socket.socket, message: Any, fds: list[int] | None = None) -> None:
    """Send ``message`` as JSON, the fds attached to its first bytes."""
    body = json.dumps(message).encode()
    head = _LEN.pack(len(body))
    if fds:
        socket.send_fds(sock, [head], fds)
    else:
        sock.sendall(head)
    sock.sendall(body)


def receive(sock: socket.socket) -> tuple[Any, list[int]]:
    """One message and the fds that came with it.

    Raises:
        ConnectionError: the other end closed or sent something that is not a message.
    """
    head, fds, _, _ = socket.recv_fds(sock, _LEN.size, MAX_FDS)
    try:
        while len(head) < _LEN.size:
            more = sock.recv(_LEN.size - len(head))
            if not more:
                raise ConnectionError("the compile helper closed the connection")
            head += more
        (size,) = _LEN.unpack(head)
        if size > _MAX_MESSAGE:
            raise ConnectionError(f"a message of {size} bytes from the compile helper")
        parts: list[bytes] = []
        got = 0
        while got < size:
            chunk = sock.recv(min(1 << 20, size - got))
            if not chunk:
                raise ConnectionError("the compile helper closed the connection mid-message")
            parts.append(chunk)
            got += len(chunk)
        return json.loads(b"".join(parts)), fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
