"""The per-user Kineto socket layout: ``<root>/<uid>``, one directory per user, mode 0700.

libkineto takes its on-demand config from any datagram that reaches its client socket —
an abstract name anyone can address, or a 0666 file in a shared directory — so in the open
layouts any local user can configure any trainer without the agent (its file, its
duration; see docs/security.md). In this layout each user's trainers get the user's own
directory as ``KINETO_IPC_SOCKET_DIR``; the agent binds an endpoint of its own in each
(with its reply sockets, which libkineto requires to be in the same directory). The kernel's
permission check on the directory then keeps every other user (root excepted) from
reaching those sockets at all.

A user's directory is made when it is asked for (`open_for`: ``bpfdyno run`` asks for its
caller's, the SLURM prolog, as root, for the job's user), not for every account in advance:
nodes of large sites have thousands of accounts and only a few users on each node. The
parent is the agent's, mode 0711 (a user can reach her own directory, not list the
others'). Directories stay when the agent stops, so trainers running meanwhile find the
restarted agent there; at start the agent adopts those it finds (a number, owned by that
uid, mode 0700, a directory and not a link), and leaves anything else alone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass

from bpfdyno.core.errors import RequestError, Unavailable
from bpfdyno.tracing.ipc.endpoint import (
    DatagramHandler,
    EndpointStats,
    EndpointUnavailable,
    KinetoEndpoint,
)
from bpfdyno.tracing.ipc.replies import random_name
from bpfdyno.tracing.safety import PlacementChecker, Writer

log = logging.getLogger(__name__)

#: Users served at once (each an endpoint socket and a reader on the loop).
MAX_USERS = 4096
#: Why a user gets no directory of her own from an agent without the layout.
NO_LAYOUT = (
    "this agent serves no per-user Kineto socket directories ([kineto] user_socket_root is "
    "empty); trainers use its shared socket"
)
#: Largest uid (uid_t is 32 bits; -1 means "none").
MAX_UID = 2**32 - 2


class TooManyUsers(Unavailable):
    """Every one of `MAX_USERS` directories is in use."""


@dataclass(frozen=True, slots=True)
class LayoutTotals:
    """What the endpoints of the per-user directories did, together (for status)."""

    users: int
    received: int
    replied: int
    dropped: int


class UserSocketDirs:
    """One endpoint per user directory under ``root``.

    Args:
        root: the parent directory (``[kineto] user_socket_root``).
        handler: every endpoint's datagram handler (the same registry for all).
        reply_names: names reply sockets (tests pass their own).
    """

    def __init__(
        self,
        root: str,
        handler: DatagramHandler,
        reply_names: Callable[[int], str] = random_name,
    ) -> None:
        self.root = root.rstrip("/") or "/"
        self._handler = handler
        self._reply_names = reply_names
        self._loop: asyncio.AbstractEventLoop | None = None
        self._endpoints: dict[int, KinetoEndpoint] = {}

    @property
    def is_open(self) -> bool:
        return self._loop is not None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make (or check) the root and serve the directories already there.

        Raises:
            EndpointUnavailable: the root cannot be made, or is not safe (it or a
                directory above it could be replaced by someone else).
        """
        _prepare_root(self.root)
        self._loop = loop
        for name in sorted(os.listdir(self.root)):
            if not name.isdigit() or int(name) > MAX_UID:
                continue
            uid = int(name)
            try:
                self._serve(uid, os.path.join(self.root, name))
            except EndpointUnavailable as e:
                log.warning("not serving %s/%s: %s", self.root, name, e)

    def path_of(self, uid: int) -> str:
        return os.path.join(self.root, str(uid))

    def open_for(self, uid: int) -> str:
        """``uid``'s directory, made and served if it is not yet; its path.

        Raises:
            EndpointUnavailable: the layout is not open, or the directory cannot be made
                or served (the message says why).
            TooManyUsers: `MAX_USERS` are served already.
        """
        if self._loop is None:
            raise EndpointUnavailable("the per-user Kineto socket layout is not running")
        if not 0 <= uid <= MAX_UID:
            raise EndpointUnavailable(f"uid {uid} is out of range")
        path = self.path_of(uid)
        if uid in self._endpoints:
            return path
        if len(self._endpoints) >= MAX_USERS:
            raise TooManyUsers(
                f"the agent serves the socket directories of {MAX_USERS} users already; "
                "remove those of users who left the node"
            )
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as e:
            raise EndpointUnavailable(f"cannot create {path}: {e.strerror}") from e
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            raise EndpointUnavailable(
                f"{path} exists and is not a directory ({e.strerror}); move it away"
            ) from None
        # Only the agent can create entries in the root: this is the directory just made
        # (or one of a run before), never something a user put there.
        gid, mode = private_dir_access()
        try:
            st = os.fstat(fd)
            if (st.st_uid, st.st_gid if gid != -1 else -1, stat.S_IMODE(st.st_mode)) != (
                uid,
                gid,
                mode,
            ):
                # Mode first, while the directory is still the agent's: an agent that is
                # not root (the packaged unit) may not change a mode once it is hers.
                os.fchown(fd, os.geteuid(), -1)
                os.fchmod(fd, mode)
                os.fchown(fd, uid, gid)
        except OSError as e:
            raise EndpointUnavailable(
                f"cannot give {path} to uid {uid}: {e.strerror} (the agent needs root or CAP_CHOWN)"
            ) from e
        finally:
            os.close(fd)
        self._serve(uid, path)
        log.info("Kineto socket directory %s made for uid %d", path, uid)
        return path

    def _serve(self, uid: int, path: str) -> None:
        assert self._loop is not None
        ep = KinetoEndpoint(self._handler, path, reply_names=self._reply_names, dir_owner=uid)
        ep.open(self._loop)
        self._endpoints[uid] = ep

    def serves(self, address: bytes) -> bool:
        """Whether a client at ``address`` polls through one of these directories."""
        if address.startswith(b"\0"):
            return False
        parent = os.path.dirname(os.fsdecode(address))
        return os.path.dirname(parent) == self.root and os.path.basename(parent).isdigit()

    def forget_client(self, address: bytes) -> bool:
        """Remove a departed client's socket file (see `KinetoEndpoint.forget_client`)."""
        if not self.serves(address):
            return False
        name = os.path.basename(os.path.dirname(os.fsdecode(address)))
        ep = self._endpoints.get(int(name))
        return ep.forget_client(address) if ep is not None else False

    def totals(self) -> LayoutTotals:
        stats = [ep.stats for ep in self._endpoints.values()]
        return LayoutTotals(
            len(stats),
            sum(s.received for s in stats),
            sum(s.replied for s in stats),
            sum(sum(s.dropped.values()) for s in stats),
        )

    def stats_of(self, uid: int) -> EndpointStats | None:
        ep = self._endpoints.get(uid)
        return ep.stats if ep is not None else None

    def close(self) -> None:
        """Stop every endpoint (their sockets go; the directories stay for the next run)."""
        for ep in self._endpoints.values():
            ep.close()
        self._endpoints.clear()
        self._loop = None


def private_dir_access() -> tuple[int, int]:
    """(group, mode) of a user's directory: (-1: unchanged, 0700) for an agent run as root;
    for an agent run as its own user (the packaged unit, without CAP_DAC_OVERRIDE), 0770
    with the agent's own group, which it must be able to write to bind its sockets there
    and which holds no one else (socket access has a group of its own: docs/security.md)."""
    if os.geteuid() == 0:
        return -1, 0o700
    return os.getegid(), 0o770


def _prepare_root(root: str) -> None:
    parent = os.path.dirname(root)
    try:
        os.makedirs(parent, 0o755, exist_ok=True)
        # Nobody else may be able to replace the root (or a directory above it) and with it
        # every user's directory.
        PlacementChecker().check_directory(parent, Writer(os.geteuid()))
        os.mkdir(root, 0o711)
    except FileExistsError:
        pass
    except RequestError as e:
        raise EndpointUnavailable(f"the per-user socket root {root} is not safe: {e}") from e
    except OSError as e:
        raise EndpointUnavailable(f"cannot create {root}: {e.strerror}") from e
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise EndpointUnavailable(
            f"{root} must be a directory of the agent's user (uid {os.geteuid()}); "
            "remove it or choose another [kineto] user_socket_root"
        )
    os.chmod(root, 0o711)  # users reach their own directory; nobody lists the others
