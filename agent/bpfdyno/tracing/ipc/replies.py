"""The sockets replies to Kineto polls are sent from: one per user.

A datagram sent on an AF_UNIX socket is charged to the *sender's* send buffer until the
receiver reads it (about 768 bytes of kernel memory for a 40-byte reply). A client that
polls and never reads its replies therefore pins the agent's buffer: measured here, 278
unread replies (28 sockets, 10 queued each) fill the default 208 KiB, and from then on every
reply to every trainer on the node fails — no config is delivered to anyone. So each user
(`bpfdyno.core.identity.Principals`: subordinate uids are their user's) gets a socket of its
own to be answered from, with its own buffer: a user that does not read its replies fills
only its own.

libkineto takes a reply from any abstract name (or, with ``KINETO_IPC_SOCKET_DIR``, any
name in that directory), not only from ``dynolog``; these sockets are bound to
``dynolog-reply-<uid>-<random>`` there, so nobody can take a name before the agent does.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections import OrderedDict

from bpfdyno.core.identity import Principals
from bpfdyno.tracing.ipc.rawsock import DatagramIO

log = logging.getLogger(__name__)

#: Reply sockets kept open at once (one per user polling); the least recently used closes.
MAX_SOCKETS = 1024
#: How the reply sockets' names begin (``dynolog-reply-<uid>-<random>``).
REPLY_PREFIX = "dynolog-reply-"


class ReplySockets:
    """One sending socket per user, created at its first reply.

    Args:
        socket_dir: "" for abstract names, else the Kineto socket directory.
        keep_gil: send without releasing the GIL (see `rawsock`).
        principals: who stands behind a uid.
    """

    def __init__(
        self, socket_dir: str, keep_gil: bool = True, principals: Principals | None = None
    ) -> None:
        self._dir = socket_dir
        self._keep_gil = keep_gil
        self._principals = principals or Principals()
        self._token = secrets.token_hex(4)
        self._open: OrderedDict[int, tuple[socket.socket, DatagramIO, str]] = OrderedDict()
        self._failed = False

    def for_uid(self, uid: int) -> DatagramIO | None:
        """The socket to answer ``uid``'s polls from (None: it could not be made; use the
        endpoint's own)."""
        user = self._principals.of(uid)
        entry = self._open.get(user)
        if entry is not None:
            self._open.move_to_end(user)
            return entry[1]
        made = self._make(user)
        if made is None:
            return None
        self._open[user] = made
        while len(self._open) > MAX_SOCKETS:
            _, (old, _, path) = self._open.popitem(last=False)
            _close(old, path)
        return made[1]

    def _make(self, user: int) -> tuple[socket.socket, DatagramIO, str] | None:
        name = f"{REPLY_PREFIX}{user}-{self._token}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = os.path.join(self._dir, name) if self._dir else ""
        try:
            sock.setblocking(False)
            sock.bind(path if path else b"\0" + name.encode())
            sock.shutdown(socket.SHUT_RD)  # nothing is read from it
        except OSError as e:
            sock.close()
            if not self._failed:
                self._failed = True
                log.warning(
                    "cannot bind a reply socket (%s); replies go out from the endpoint's own "
                    "socket, whose buffer every user shares",
                    e.strerror,
                )
            return None
        return sock, DatagramIO(sock, 64, keep_gil=self._keep_gil), path

    def close(self) -> None:
        while self._open:
            _, (sock, _, path) = self._open.popitem()
            _close(sock, path)


def _close(sock: socket.socket, path: str) -> None:
    sock.close()
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
