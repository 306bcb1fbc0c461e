"""Plain records of the cluster view (``bpfdyno top --job-id``): what the UI shows of a
job-wide trace. Node rows are the client library's own `NodeSummary` (plain values only).
"""

from __future__ import annotations

from dataclasses import dataclass

from bpfdyno.client.cluster import JobTraceResult, TraceFile
from bpfdyno.client.cluster.summary import NodeSummary

__all__ = ["HostTraceRow", "JobTraceView", "NodeSummary", "TraceFile", "job_trace_view"]


@dataclass(frozen=True, slots=True)
class HostTraceRow:
    """One host's part of a job-wide trace.

    Attributes:
        host: the node's name.
        outcome: ok, in progress, not traced, incomplete or failed.
        reason: why it is not ok ("" when it is).
        clock_offset_s: the agent's clock minus ours; None when not measured.
        files: the traced processes' files with their states.
    """

    host: str
    outcome: str
    reason: str
    clock_offset_s: float | None
    files: tuple[TraceFile, ...]


@dataclass(frozen=True, slots=True)
class JobTraceView:
    """A job-wide trace as the UI shows it.

    Attributes:
        outcome: all, some failed or none (meaningful once finished).
        start_time_ms: the common start of a duration trace (epoch ms); 0 otherwise.
        hosts: one row per node.
        finished: no host's part will change any more.
    """

    outcome: str
    start_time_ms: int
    hosts: tuple[HostTraceRow, ...]
    finished: bool = False


def job_trace_view(result: JobTraceResult, finished: bool = False) -> JobTraceView:
    """The UI's record of a job-wide trace result."""
    spec = result.spec
    return JobTraceView(
        outcome=result.outcome.value.replace("_", " "),
        start_time_ms=0 if spec.iteration_mode else spec.profile_start_time_ms,
        hosts=tuple(
            HostTraceRow(
                host=h.node.name,
                outcome=h.outcome.value.replace("_", " "),
                reason=h.reason,
                clock_offset_s=h.clock.offset_s if h.clock is not None else None,
                files=tuple(h.files()),
            )
            for h in result.hosts
        ),
        finished=finished,
    )
