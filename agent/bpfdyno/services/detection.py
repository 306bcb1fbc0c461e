"""The transport-free façade over the detection's events (docs/detection.md).

Events name jobs, ranks, pids and what their threads do, as the Kernel service's events and
process table name every process: whoever may use the agent's socket may read them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

from bpfdyno.core.errors import InvalidArgument, Unavailable
from bpfdyno.detection.events import EventLog
from bpfdyno.rpc.detection import DetectionEvent, RankSignal

#: Longest job id a caller may filter by (SLURM's are numbers; a rendezvous address is short).
MAX_JOB_ID = 256


class DetectionService:
    """Args:
    events: the detection's events.
    rank_signals: this node's ranks' latest signals of a job ("": all), when the detection
        runs (None: it is turned off, and peers asking are told so).
    """

    def __init__(
        self, events: EventLog, rank_signals: Callable[[str], list[RankSignal]] | None = None
    ) -> None:
        self._events = events
        self._rank_signals = rank_signals

    def rank_signals(self, job_id: str = "") -> list[RankSignal]:
        """The last interval's signals of this node's ranks (of one job)."""
        _check_job(job_id)
        if self._rank_signals is None:
            raise Unavailable(
                "the detection is turned off on this agent: set [collectors.detection] "
                "enabled = true (and restart it) to compare its ranks with the job's others"
            )
        return self._rank_signals(job_id)

    def list_events(self, job_id: str = "") -> list[DetectionEvent]:
        """The events the agent holds, oldest first (only ``job_id``'s when given)."""
        _check_job(job_id)
        return self._events.held(job_id)

    def watch_events(self, job_id: str = "") -> AsyncGenerator[DetectionEvent]:
        """The held events, then each new one, until the caller stops reading."""
        _check_job(job_id)
        return self._events.watch(job_id)


def _check_job(job_id: str) -> None:
    if len(job_id) > MAX_JOB_ID:
        raise InvalidArgument(
            f"a job id of {len(job_id)} characters: give at most {MAX_JOB_ID} (a SLURM job "
            "id, or the ranks' MASTER_ADDR:MASTER_PORT without one)",
            "job_id_length",
        )
