"""The transport-free façade over the detection's events (docs/detection.md).

Events name jobs, ranks, pids and what their threads do, as the Kernel service's events and
process table name every process: whoever may use the agent's socket may read them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.detection.events import EventLog
from bpfdyno.rpc.detection import DetectionEvent

#: Longest job id a caller may filter by (SLURM's are numbers; a rendezvous address is short).
MAX_JOB_ID = 256


class DetectionService:
    def __init__(self, events: EventLog) -> None:
        self._events = events

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
