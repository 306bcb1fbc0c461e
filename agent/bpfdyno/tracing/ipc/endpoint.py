"""The Kineto IPC endpoint: an AF_UNIX datagram socket on the daemon's event loop.

Byte-compatible with dynolog: the abstract name ``"\\0dynolog\\0"`` (the trailing NUL is
part of the name), or ``<dir>/dynolog`` when ``KINETO_IPC_SOCKET_DIR`` is used. Replies go
out with ``sendto`` from a bound socket: an abstract name, or one in the socket directory —
a client receiving a datagram from any other address aborts the training process.

A Kineto client waits only ~80 ms for its reply; a reply that comes later is read by its
*next* poll, and from then on every config arrives one poll late. So instead of dynolog's
one-datagram-per-10-ms loop, the socket is registered with ``loop.add_reader`` and each
wake-up drains every queued datagram (up to `MAX_PER_WAKEUP`, so a flood cannot hold the
loop) and answers each at once, without releasing the GIL (see `rawsock`). Nothing blocks:
a reply that cannot be sent right now (the client's queue is full, the client is gone) is
dropped and counted. Replies go out from a socket of the poller's user (`replies`), so a
user whose clients never read their replies fills only its own send buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from bpfdyno.core.errors import RequestError
from bpfdyno.tracing.ipc import wire
from bpfdyno.tracing.ipc.rawsock import DatagramIO
from bpfdyno.tracing.ipc.replies import REPLY_PREFIX, ReplySockets, random_name
from bpfdyno.tracing.ipc.sender import SenderCreds
from bpfdyno.tracing.safety import PlacementChecker, Writer

log = logging.getLogger(__name__)

ENDPOINT_NAME = "dynolog"
#: Most datagrams handled per wake-up before yielding to the rest of the loop.
MAX_PER_WAKEUP = 512
#: Per-sender token bucket: a Kineto client polls at most about once a second.
SENDER_BURST = 20
SENDER_RATE_PER_S = 10.0
MAX_TRACKED_SENDERS = 8192
#: Datagrams the kernel may queue on the endpoint's socket. The kernel default
#: (net.unix.max_dgram_qlen = 10) makes the 12th of many trainers polling at once find the
#: queue full and back off 10 ms or more; see `_socket_with_queue`.
QUEUE_LEN = 512
_QLEN_SYSCTL = "/proc/sys/net/unix/max_dgram_qlen"


class EndpointUnavailable(Exception):
    """The endpoint cannot be opened; the message says why and what to do."""


class DatagramHandler(Protocol):
    """What the endpoint calls for each valid datagram (`bpfdyno.tracing.polls.KinetoPolls`).

    ``sender`` carries the kernel's credentials of the datagram (None when the kernel
    attached none, which a socket with ``SO_PASSCRED`` never sees).
    """

    def on_request(
        self, address: bytes, req: wire.KinetoRequest, sender: SenderCreds | None = None
    ) -> str: ...

    def on_context(self, address: bytes, ctxt: wire.KinetoContext) -> int: ...


#: The drop reason of a reply to a trainer whose socket is in another mount namespace's
#: path (the Kineto directory mounted elsewhere in its container).
ELSEWHERE = "kineto_dir_elsewhere"


@dataclass(slots=True)
class EndpointStats:
    """Counters shown by status; every dropped datagram is counted under a reason."""

    received: int = 0
    replied: int = 0
    wakeups: int = 0
    malformed: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    #: Replies dropped, per user (its reply socket could not be bound, its queue was full).
    replies_dropped_by_user: Counter[int] = field(default_factory=Counter)

    def summary(self) -> str:
        bad = sum(self.malformed.values())
        dropped = sum(self.dropped.values())
        text = (
            f"{self.received} datagrams, {self.replied} replies, {bad} malformed, {dropped} dropped"
        )
        if self.dropped[ELSEWHERE]:
            text += (
                f"; {self.dropped[ELSEWHERE]} replies to trainers whose container mounts the "
                "Kineto directory at another path than the agent's: mount it at the same path"
            )
        if self.replies_dropped_by_user:
            worst = self.replies_dropped_by_user.most_common(5)
            text += " (replies dropped: " + ", ".join(f"uid {u}: {n}" for u, n in worst) + ")"
        return text


def socket_path(socket_dir: str) -> str:
    return os.path.join(socket_dir, ENDPOINT_NAME)


class KinetoEndpoint:
    """The daemon's end of the Kineto IPC fabric.

    Args:
        handler: receives every valid datagram and returns the reply content.
        socket_dir: "" for the abstract name (the default, per network namespace), else the
            directory shared with the trainers (``KINETO_IPC_SOCKET_DIR``).
        mono: monotonic clock (for the per-sender rate limit).
        queue_len: datagrams the kernel may queue for the endpoint (0: the kernel default).
        reply_names: names a user's reply socket (`replies.random_name`; tests pass their own).
        dir_owner: ``socket_dir`` is this user's own (the per-user layout, `user_dirs`): it
            must be that uid's, mode 0700 — nobody else can reach a socket in it.
    """

    def __init__(
        self,
        handler: DatagramHandler,
        socket_dir: str = "",
        mono: Callable[[], float] | None = None,
        queue_len: int = QUEUE_LEN,
        reply_names: Callable[[int], str] = random_name,
        dir_owner: int | None = None,
    ) -> None:
        self._handler = handler
        self._reply_names = reply_names
        self._dir_owner = dir_owner
        self._queue_len = queue_len
        #: The queue length the socket got (the kernel's when it could not be raised).
        self.queue_len = 0
        #: Receive and send without releasing the GIL (see `rawsock`); read by open().
        self.keep_gil = True
        #: Ask the kernel for each sender's credentials (SO_PASSCRED); read by open(). Only
        #: a benchmark turns it off, to measure what attributing polls costs.
        self.pass_credentials = True
        self.socket_dir = socket_dir
        self._mono = mono or time.monotonic
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._io: DatagramIO | None = None
        self._replies: ReplySockets | None = None
        self._buckets: OrderedDict[bytes, list[float]] = OrderedDict()
        self._logged: set[str] = set()
        self._bound_ino: int | None = None
        self.stats = EndpointStats()

    @property
    def address(self) -> str:
        """Where trainers reach the endpoint, as /proc/net/unix shows it."""
        return socket_path(self.socket_dir) if self.socket_dir else f"@{ENDPOINT_NAME}@"

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Bind the socket and start answering on ``loop``.

        Raises:
            EndpointUnavailable: the name is taken (dynolog or another bpfdyno runs) or the
                socket directory is unusable.
        """
        sock, self.queue_len = _socket_with_queue(self._queue_len)
        try:
            sock.setblocking(False)
            # The kernel then attaches each sender's real pid, uid and gid to its datagrams:
            # polls are attributed to who sent them, not to the pid they claim.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, int(self.pass_credentials))
            if self.socket_dir:
                self._bind_path(sock)
            else:
                self._bind_abstract(sock)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._io = DatagramIO(sock, wire.MAX_DATAGRAM, keep_gil=self.keep_gil)
        self._replies = ReplySockets(
            self.socket_dir, keep_gil=self.keep_gil, names=self._reply_names
        )
        self._loop = loop
        loop.add_reader(sock.fileno(), self._on_readable)
        log.info("Kineto IPC endpoint listening at %s", self.address)

    def _bind_abstract(self, sock: socket.socket) -> None:
        try:
            # The name is "dynolog" plus a trailing NUL, exactly as libkineto addresses it.
            sock.bind(b"\0" + ENDPOINT_NAME.encode() + b"\0")
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise EndpointUnavailable(
                    "the abstract socket @dynolog@ is already bound in this network namespace "
                    "(dynolog or another bpfdyno is running); stop it, or set [kineto] "
                    "socket_dir and KINETO_IPC_SOCKET_DIR for the trainers"
                ) from e
            raise EndpointUnavailable(f"cannot bind @dynolog@: {e.strerror}") from e

    def _bind_path(self, sock: socket.socket) -> None:
        path = socket_path(self.socket_dir)
        if not os.path.isdir(self.socket_dir):
            raise EndpointUnavailable(
                f"the Kineto socket directory {self.socket_dir} does not exist; create it "
                "(shared with the trainers as KINETO_IPC_SOCKET_DIR) or unset [kineto] socket_dir"
            )
        try:
            if self._dir_owner is not None:
                _check_private(self.socket_dir, self._dir_owner)
            else:
                # Trainers must be able to create their sockets there, but nobody may be
                # able to move ours away and answer them in our place: root's, and sticky
                # if shared.
                PlacementChecker().check_directory(self.socket_dir, Writer(os.geteuid()))
        except RequestError as e:
            raise EndpointUnavailable(
                f"the Kineto socket directory is not safe: {e}. Make it root's and not "
                f"writable by others, or sticky (chmod 1777 {self.socket_dir}) when trainers "
                "of several users share it"
            ) from e
        _remove_stale(path, owner_uid=os.geteuid())
        for name in os.listdir(self.socket_dir):  # reply sockets of an agent that was killed
            if name.startswith(REPLY_PREFIX):
                with contextlib.suppress(EndpointUnavailable):
                    _remove_stale(os.path.join(self.socket_dir, name))
        try:
            sock.bind(path)
            os.chmod(path, 0o666)  # trainers run as other users; Kineto does the same
        except OSError as e:
            raise EndpointUnavailable(
                f"cannot bind {path}: {e.strerror}; check the directory's permissions"
            ) from e
        self._bound_ino = os.stat(path).st_ino

    def close(self) -> None:
        """Stop answering; remove the socket file (only if it is still ours)."""
        sock, self._sock = self._sock, None
        self._io = None
        if self._replies is not None:
            self._replies.close()
            self._replies = None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()
        if self.socket_dir and self._bound_ino is not None:
            path = socket_path(self.socket_dir)
            try:
                if os.stat(path).st_ino == self._bound_ino:
                    os.unlink(path)
            except OSError:
                pass

    def forget_client(self, address: bytes) -> bool:
        """Remove the socket file a departed client left in the socket directory.

        libkineto never removes its ``dynoconfigclient<uuid>`` file, so a shared directory
        fills up over months of jobs. Only a socket file directly in our directory, with
        that name, that no process is bound to any more, is removed.

        Returns:
            True when a file was removed.
        """
        if not self.socket_dir or address.startswith(b"\0"):
            return False
        path = os.fsdecode(address)
        if os.path.dirname(path) != self.socket_dir.rstrip("/") or not os.path.basename(
            path
        ).startswith("dynoconfigclient"):
            return False
        try:
            _remove_stale(path)
        except EndpointUnavailable:
            return False  # still bound: the process lives on (or is not a socket)
        return not os.path.lexists(path)

    # -- the hot path ---------------------------------------------------------------------

    def _on_readable(self) -> None:
        io = self._io
        if io is None:
            return
        self.stats.wakeups += 1
        for _ in range(MAX_PER_WAKEUP):
            try:
                data, size, address, creds = io.recvmsg()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._drop("recv_error", f"recvfrom failed: {e.strerror}")
                return
            self.stats.received += 1
            if address is None:
                self._drop("unnamed_sender", "a datagram from an unbound socket; cannot reply")
            elif not self._admit(address):
                # Checked before any parsing: a flooding sender costs one recv per datagram.
                self._drop("rate_limited", f"sender {address[:60]!r} over {SENDER_RATE_PER_S}/s")
            elif size > wire.MAX_DATAGRAM:
                self._malformed("too_large", f"datagram of {size} bytes", address)
            else:
                self._handle(data, address, creds)

    def _handle(self, data: bytes, address: bytes, creds: SenderCreds | None) -> None:
        try:
            msg = wire.parse_datagram(data)
        except wire.MalformedDatagram as e:
            self._malformed(e.reason, str(e), address)
            return
        try:
            if isinstance(msg, wire.KinetoRequest):
                reply = wire.encode_config_reply(self._handler.on_request(address, msg, creds))
            else:
                reply = wire.encode_context_reply(self._handler.on_context(address, msg))
        except Exception:
            # A bug must not silence the endpoint for every other trainer.
            self.stats.dropped["handler_error"] += 1
            log.exception("Kineto request handler failed; continuing")
            return
        self._reply(reply, address, creds)

    def _reply(self, reply: bytes, address: bytes, creds: SenderCreds | None) -> None:
        assert self._io is not None
        io, user = self._io, None  # in-process callers (no credentials): our own socket
        if creds is not None and self._replies is not None:
            user = self._replies.user_of(creds.uid)
            # Never the endpoint's own socket for a user's poll: its buffer is everyone's.
            user_io = self._replies.for_uid(creds.uid)
            if user_io is None:
                self._drop_reply(user, "no_reply_socket", "no reply socket could be bound")
                return
            io = user_io
        try:
            io.sendto(reply, address)
            self.stats.replied += 1
        except BlockingIOError:
            self._drop_reply(
                user, "reply_queue_full", "a client's receive queue is full; reply dropped"
            )
        except (ConnectionRefusedError, FileNotFoundError):
            path = "" if address.startswith(b"\0") else os.fsdecode(address)
            if self.socket_dir and path and os.path.dirname(path) != self.socket_dir:
                # A container mounting the directory at another path: its socket's name is
                # its own mount namespace's, which the agent cannot reach.
                self._drop(
                    ELSEWHERE,
                    f"a trainer polls from {path!r}, outside the agent's Kineto directory "
                    f"{self.socket_dir}: its container mounts the directory at another path, "
                    "so no config reaches it; mount it at the agent's path there (and set "
                    f"KINETO_IPC_SOCKET_DIR={self.socket_dir})",
                )
                return
            self._drop("client_gone", "a client closed its socket before the reply")
        except OSError as e:
            self._drop_reply(user, "reply_error", f"sendto failed: {e.strerror}")

    def _drop_reply(self, user: int | None, reason: str, detail: str) -> None:
        if user is not None:
            self.stats.replies_dropped_by_user[user] += 1
        self._drop(reason, detail)

    def _admit(self, address: bytes) -> bool:
        now = self._mono()
        bucket = self._buckets.get(address)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED_SENDERS:
                self._buckets.popitem(last=False)
            bucket = self._buckets[address] = [float(SENDER_BURST), now]
        else:
            self._buckets.move_to_end(address)
            bucket[0] = min(SENDER_BURST, bucket[0] + (now - bucket[1]) * SENDER_RATE_PER_S)
            bucket[1] = now
        if bucket[0] < 1.0:
            return False
        bucket[0] -= 1.0
        return True

    def _malformed(self, reason: str, detail: str, address: bytes) -> None:
        self.stats.malformed[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning(
                "dropped a malformed Kineto datagram from %r (%s); further ones of this kind "
                "are only counted",
                address[:80],
                detail,
            )

    def _drop(self, reason: str, detail: str) -> None:
        self.stats.dropped[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("Kineto IPC: %s; further ones are only counted", detail)


def _socket_with_queue(want: int) -> tuple[socket.socket, int]:
    """A datagram socket whose receive queue holds ``want`` datagrams, if we may set that.

    The kernel gives each new AF_UNIX socket the queue length of the network namespace's
    ``net.unix.max_dgram_qlen`` at creation, and keeps it. So the sysctl is raised just
    around creating this one socket and put back at once: no other socket keeps the change.
    Without the permission (not root), the socket gets the kernel's length.
    """
    try:
        with open(_QLEN_SYSCTL, encoding="ascii") as f:
            current = int(f.read())
    except (OSError, ValueError):
        return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), 0
    if want <= current:
        return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), current
    try:
        with open(_QLEN_SYSCTL, "w", encoding="ascii") as f:
            f.write(str(want))
    except OSError:
        log.info(
            "cannot raise %s to %d (not root?); trainers polling at the same instant will "
            "retry after 10 ms when more than %d are queued",
            _QLEN_SYSCTL,
            want,
            current + 1,
        )
        return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), current
    try:
        return socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM), want
    finally:
        try:
            with open(_QLEN_SYSCTL, "w", encoding="ascii") as f:
                f.write(str(current))
        except OSError as e:
            log.warning("could not put %s back to %d: %s", _QLEN_SYSCTL, current, e.strerror)


def _check_private(directory: str, owner: int) -> None:
    """``directory`` is ``owner``'s own: a directory (not a link), theirs, mode 0700 — or,
    for an agent that is not root, 0770 with the agent's own group (see
    `bpfdyno.tracing.ipc.user_dirs.private_dir_access`).

    Raises:
        RequestError: it is not.
    """
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise RequestError(f"{directory} is not a directory")
    mode = stat.S_IMODE(st.st_mode)
    agents_group = os.geteuid() != 0 and st.st_gid == os.getegid()
    if st.st_uid != owner or mode & 0o007 or (mode & 0o070 and not agents_group):
        unit = (
            f", or 0770 with the agent's own group {os.getegid()} (it has group {st.st_gid})"
            if os.geteuid() != 0
            else ""
        )
        raise RequestError(
            f"{directory} must be uid {owner}'s with mode 0700 (it is uid {st.st_uid}'s, "
            f"mode {mode:04o}){unit}"
        )


def _remove_stale(path: str, owner_uid: int | None = None) -> None:
    """Remove a leftover socket file at ``path`` unless a live process is bound to it.

    Args:
        owner_uid: the daemon's uid when ``path`` is the daemon's own name: a live socket
            there that someone else bound is an impostor (a user answering trainers in the
            daemon's place while it was down) and is removed too.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if owner_uid is not None and st.st_uid != owner_uid:
        log.warning(
            "removing %s: uid %d bound it while the agent was not running, so it could "
            "answer trainers in the agent's place",
            path,
            st.st_uid,
        )
        try:
            os.unlink(path)
        except OSError as e:
            raise EndpointUnavailable(
                f"{path} belongs to uid {st.st_uid} and cannot be removed ({e.strerror}); "
                "remove it by hand"
            ) from e
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise EndpointUnavailable(f"{path} exists and is not a socket; move it away")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)
        return
    except OSError as e:
        raise EndpointUnavailable(f"cannot check {path}: {e.strerror}") from e
    finally:
        probe.close()
    raise EndpointUnavailable(
        f"{path} is bound by a running process (dynolog or another bpfdyno); stop it or "
        "choose another [kineto] socket_dir"
    )
