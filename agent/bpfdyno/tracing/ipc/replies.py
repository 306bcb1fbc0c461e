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
name in that directory), not only from ``dynolog``. Each socket is bound to
``dynolog-reply-<uid>-<random>``, a fresh 96-bit name per socket: names are visible to
everyone (/proc/net/unix, the directory), so a name shared by several sockets or guessable
from another would let a user bind a victim's name before the agent does. A bind that fails
is retried under new names; when none can be bound the reply is dropped and counted
against that user — never sent from the endpoint's own socket, whose buffer every user
shares (a user who made the agent fall back to it could fill it and silence everyone).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections import Counter, OrderedDict
from collections.abc import Callable

from bpfdyno.core.identity import Principals
from bpfdyno.tracing.ipc.rawsock import DatagramIO

log = logging.getLogger(__name__)

#: Reply sockets kept open at once (one per user polling); the least recently used closes.
MAX_SOCKETS = 1024
#: How the reply sockets' names begin (``dynolog-reply-<uid>-<random>``).
REPLY_PREFIX = "dynolog-reply-"
#: Names tried, each fresh, before a user's reply is given up on.
BIND_TRIES = 4


def random_name(user: int) -> str:
    """A reply socket's name: its user, then 96 random bits (nobody can bind it first)."""
    return f"{REPLY_PREFIX}{user}-{secrets.token_hex(12)}"


class ReplySockets:
    """One sending socket per user, created at its first reply.

    Args:
        socket_dir: "" for abstract names, else the Kineto socket directory.
        keep_gil: send without releasing the GIL (see `rawsock`).
        principals: who stands behind a uid.
        names: makes a name for a user's socket (tests give a predictable one).
    """

    def __init__(
        self,
        socket_dir: str,
        keep_gil: bool = True,
        principals: Principals | None = None,
        names: Callable[[int], str] = random_name,
    ) -> None:
        self._dir = socket_dir
        self._keep_gil = keep_gil
        self._principals = principals or Principals()
        self._names = names
        self._open: OrderedDict[int, tuple[socket.socket, DatagramIO, str]] = OrderedDict()
        #: Binds that failed (a name taken, the directory unusable), per user.
        self.bind_failures: Counter[int] = Counter()

    def user_of(self, uid: int) -> int:
        """The user whose socket answers ``uid`` (subordinate uids are their user's)."""
        return self._principals.of(uid)

    def for_uid(self, uid: int) -> DatagramIO | None:
        """The socket to answer ``uid``'s polls from; None when none could be bound (the
        reply must then be dropped; a later reply tries again)."""
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
        error = ""
        for _ in range(BIND_TRIES):
            name = self._names(user)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            path = os.path.join(self._dir, name) if self._dir else ""
            try:
                sock.setblocking(False)
                sock.bind(path if path else b"\0" + name.encode())
                sock.shutdown(socket.SHUT_RD)  # nothing is read from it
            except OSError as e:
                sock.close()
                self.bind_failures[user] += 1
                error = e.strerror or str(e)
                continue
            return sock, DatagramIO(sock, 64, keep_gil=self._keep_gil), path
        if self.bind_failures[user] == BIND_TRIES:  # the first time only
            log.warning(
                "cannot bind a reply socket for uid %d after %d names (%s); its replies are "
                "dropped and counted until one can be bound",
                user,
                BIND_TRIES,
                error,
            )
        return None

    def close(self) -> None:
        while self._open:
            _, (sock, _, path) = self._open.popitem()
            _close(sock, path)


def _close(sock: socket.socket, path: str) -> None:
    sock.close()
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)
