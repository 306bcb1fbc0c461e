"""The one status model: what every part of the daemon reports to `status` and `doctor`.

Collectors, the Kineto IPC endpoint, the legacy RPC and the exporters all report a
`PartStatus` with a `PartState`; the daemon gathers them and the API serves them as they are.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class PartState(enum.Enum):
    """Where one part of the daemon stands."""

    STARTING = "starting"
    OK = "ok"
    DEGRADED = "degraded"  # running, but not fully (see the reason)
    UNAVAILABLE = "unavailable"  # could not start on this machine (see the reason)
    STOPPED = "stopped"
    DISABLED = "disabled"  # turned off in the configuration


@dataclass(frozen=True, slots=True)
class PartStatus:
    """One part's state, with why (and what to do) when it is not ok.

    Attributes:
        name: the part's stable name (``sched``, ``kineto_ipc``, ``legacy_rpc``, ...).
        state: where it stands.
        reason: why it is not ok and what to do; for an ok part, what it is doing.
        interval_s: collection interval of a polled part; 0 for the others.
        collections: successful rounds of a polled part since the daemon started.
        errors: failed rounds (or failed operations) since the daemon started.
        last_duration_s: how long its last round took.
        last_success_ts: wall-clock epoch seconds of its last success; 0 if never.
    """

    name: str
    state: PartState
    reason: str = ""
    interval_s: float = 0.0
    collections: int = 0
    errors: int = 0
    last_duration_s: float = 0.0
    last_success_ts: float = 0.0
