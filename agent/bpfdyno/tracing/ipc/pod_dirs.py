"""Per-pod Kineto socket directories for Kubernetes: ``<root>/<name>``, one per trainer pod
(or per job template), each with the agent's endpoint bound in it.

In a cluster the per-user layout (`user_dirs`) does not separate tenants: pods of
different namespaces often run as the same uid (root, or an image's fixed user), and a
shared socket directory mounted into every trainer pod lets any of them configure every
other pod's trainers on the node (libkineto takes its config from any datagram that
reaches its socket; docs/security.md). Here each trainer pod mounts only its own
directory, a hostPath under ``root``; a pod cannot name, let alone reach, a socket in
another pod's directory (it is not in its mount namespace), whatever its uid.

libkineto aborts on a reply whose sender is not under its own ``KINETO_IPC_SOCKET_DIR``
(docs: kineto-ipc), so the directory must have the same path in the pod as in the agent:
the pod mounts hostPath ``<root>/<name>`` at ``<root>/<name>`` and sets
``KINETO_IPC_SOCKET_DIR`` to it (deploy/kubernetes/trainer-example.yaml). The kubelet makes
the directory (``DirectoryOrCreate``: root's, 0755); the agent finds it within
`SCAN_INTERVAL_S` and makes it writable for the pod's trainers of any uid (1777: sticky, so
none can move the agent's socket). The root is the agent's, mode 0700: nobody on the host
but root reaches a pod's directory. A directory that goes (the pod's hostPath removed) has
its endpoint closed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import stat
from collections.abc import Callable

from bpfdyno.core.errors import RequestError
from bpfdyno.tracing.ipc.endpoint import (
    DatagramHandler,
    EndpointStats,
    EndpointUnavailable,
    KinetoEndpoint,
)
from bpfdyno.tracing.ipc.replies import random_name
from bpfdyno.tracing.ipc.user_dirs import MAX_USERS, LayoutTotals
from bpfdyno.tracing.safety import PlacementChecker, Writer

log = logging.getLogger(__name__)

#: How often the root is listed for directories that came or went (a trainer's first poll
#: comes ~0.3 s after its start and libkineto retries it for 10 s).
SCAN_INTERVAL_S = 1.0
#: Pods served at once (each an endpoint socket and a reader on the loop).
MAX_PODS = MAX_USERS
#: A directory name: a Kubernetes name (DNS label characters and dots).
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
#: The mode each pod's directory gets: trainers of any uid in the pod create their sockets
#: there; sticky, so none can remove or replace the agent's.
POD_DIR_MODE = 0o1777
#: The longest libkineto client socket name in a directory (``dynoconfigclient<uuid4>``).
_CLIENT_NAME_BYTES = len("dynoconfigclient") + 36
#: sun_path's size, less its terminating NUL.
_SUN_PATH_BYTES = 107


def max_name_bytes(root: str) -> int:
    """The longest directory name under ``root`` whose trainers' socket paths still fit."""
    return _SUN_PATH_BYTES - len(root.rstrip("/").encode()) - 2 - _CLIENT_NAME_BYTES


class PodSocketDirs:
    """One endpoint per pod directory under ``root``.

    Args:
        root: the parent directory (``[kineto] pod_socket_root``).
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
        self._endpoints: dict[str, KinetoEndpoint] = {}
        #: Directories not served, and why (shown by status; logged once each).
        self.refused: dict[str, str] = {}

    @property
    def is_open(self) -> bool:
        return self._loop is not None

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make (or check) the root and serve the directories already there.

        Raises:
            EndpointUnavailable: the root cannot be made, or is not safe.
        """
        _prepare_root(self.root)
        self._loop = loop
        self.scan()

    def scan(self) -> None:
        """Serve directories that appeared, close the endpoints of those that went."""
        if self._loop is None:
            return
        try:
            names = set(os.listdir(self.root))
        except OSError as e:
            log.warning("cannot list the pod socket root %s: %s", self.root, e.strerror)
            return
        for name in sorted(self._endpoints.keys() - names):
            self._endpoints.pop(name).close()
            log.info("Kineto socket directory %s/%s went; its endpoint is closed", self.root, name)
        for name in sorted(names - self._endpoints.keys() - self.refused.keys()):
            try:
                self._serve(name)
            except EndpointUnavailable as e:
                self.refused[name] = str(e)
                log.warning("not serving %s/%s: %s", self.root, name, e)
        for name in self.refused.keys() - names:
            del self.refused[name]

    def _serve(self, name: str) -> None:
        assert self._loop is not None
        limit = max_name_bytes(self.root)
        if not NAME_RE.fullmatch(name) or len(name.encode()) > limit:
            raise EndpointUnavailable(
                f"the name is not a Kubernetes name of at most {limit} characters (the "
                "trainers' socket paths must fit in 107 bytes); name the pod's directory so"
            )
        if len(self._endpoints) >= MAX_PODS:
            raise EndpointUnavailable(f"the agent serves {MAX_PODS} pod directories already")
        path = os.path.join(self.root, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            raise EndpointUnavailable(f"not a directory ({e.strerror})") from None
        try:
            st = os.fstat(fd)
            # Only root (the kubelet) and the agent can create entries in the 0700 root.
            if st.st_uid not in (0, os.geteuid()):
                raise EndpointUnavailable(f"it belongs to uid {st.st_uid}, not to root")
            if stat.S_IMODE(st.st_mode) != POD_DIR_MODE:
                os.fchmod(fd, POD_DIR_MODE)
        finally:
            os.close(fd)
        ep = KinetoEndpoint(self._handler, path, reply_names=self._reply_names)
        ep.open(self._loop)
        self._endpoints[name] = ep
        log.info("Kineto socket directory %s served (a pod's)", path)

    def serves(self, address: bytes) -> bool:
        """Whether a client at ``address`` polls through one of these directories."""
        if address.startswith(b"\0"):
            return False
        parent = os.path.dirname(os.fsdecode(address))
        return os.path.dirname(parent) == self.root and os.path.basename(parent) in self._endpoints

    def forget_client(self, address: bytes) -> bool:
        """Remove a departed client's socket file (see `KinetoEndpoint.forget_client`)."""
        if not self.serves(address):
            return False
        ep = self._endpoints.get(os.path.basename(os.path.dirname(os.fsdecode(address))))
        return ep.forget_client(address) if ep is not None else False

    def totals(self) -> LayoutTotals:
        stats = [ep.stats for ep in self._endpoints.values()]
        return LayoutTotals(
            len(stats),
            sum(s.received for s in stats),
            sum(s.replied for s in stats),
            sum(sum(s.dropped.values()) for s in stats),
        )

    def stats_of(self, name: str) -> EndpointStats | None:
        ep = self._endpoints.get(name)
        return ep.stats if ep is not None else None

    def close(self) -> None:
        """Stop every endpoint (their sockets go; the directories stay: the pods' mounts)."""
        for ep in self._endpoints.values():
            ep.close()
        self._endpoints.clear()
        self.refused.clear()
        self._loop = None


def _prepare_root(root: str) -> None:
    parent = os.path.dirname(root)
    try:
        os.makedirs(parent, 0o755, exist_ok=True)
        # Nobody else may be able to replace the root (or a directory above it).
        PlacementChecker().check_directory(parent, Writer(os.geteuid()))
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except RequestError as e:
        raise EndpointUnavailable(f"the pod socket root {root} is not safe: {e}") from e
    except OSError as e:
        raise EndpointUnavailable(f"cannot create {root}: {e.strerror}") from e
    st = os.lstat(root)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise EndpointUnavailable(
            f"{root} must be a directory of the agent's user (uid {os.geteuid()}); "
            "remove it or choose another [kineto] pod_socket_root"
        )
    os.chmod(root, 0o700)  # only root reaches a pod's directory from the host
