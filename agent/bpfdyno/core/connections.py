"""How many connections an entry point serves at once: in all, and per peer.

Every port local users can reach (the legacy dyno RPC, the gRPC front, the Prometheus
endpoint) counts its connections here, so that no peer can hold them all: a peer is a user —
its subordinate uids counted as its own (`bpfdyno.core.identity.Principals`) — or, when the
connection's user cannot be established, its address. Root is not limited per peer.
"""

from __future__ import annotations

import threading
from collections import Counter

from bpfdyno.core.identity import Principals, Requester

#: Rules a refused connection names.
PEER_LIMIT = "peer_connection_limit"
TOTAL_LIMIT = "connection_limit"


class ConnectionLimits:
    """Counts of open connections, with the two limits (safe to use from several threads).

    Args:
        max_total: connections served at once.
        max_per_peer: of them, from one peer (`peer_of`).
        principals: who stands behind a uid.
    """

    def __init__(
        self, max_total: int, max_per_peer: int, principals: Principals | None = None
    ) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._principals = principals or Principals()
        self._lock = threading.Lock()
        self._per_peer: Counter[str] = Counter()
        self._active = 0
        #: Connections refused, by rule.
        self.refused: Counter[str] = Counter()

    def peer_of(self, requester: Requester) -> str:
        """``uid N`` (N: the user it counts against) or the address of an unattributed one."""
        if requester.uid is not None:
            return f"uid {self._principals.of(requester.uid)}"
        return requester.peer.rsplit(":", 1)[0] or "unknown"

    def admit(self, peer: str, privileged: bool = False) -> str:
        """Count a new connection of ``peer``; "" when admitted, else the rule it breaks
        (then it is not counted). ``privileged`` (root) is not limited per peer."""
        with self._lock:
            if not privileged and self._per_peer[peer] >= self.max_per_peer:
                rule = PEER_LIMIT
            elif self._active >= self.max_total:
                rule = TOTAL_LIMIT
            else:
                self._active += 1
                self._per_peer[peer] += 1
                return ""
            self.refused[rule] += 1
            return rule

    def release(self, peer: str) -> None:
        """An admitted connection of ``peer`` ended."""
        with self._lock:
            self._active -= 1
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]

    def held(self, peer: str) -> int:
        """Connections ``peer`` holds now."""
        with self._lock:
            return self._per_peer[peer]

    @property
    def active(self) -> int:
        return self._active
