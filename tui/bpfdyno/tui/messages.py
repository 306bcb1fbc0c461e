"""Every message the data workers post to the app.

Workers only fetch and post; the app applies messages to its `TopState` on its own loop, and
the views render from that state. Snapshot-like messages (the whole process table, the
trainer list, the status) set ``can_replace``: when the UI falls behind, the newest one
supersedes a queued older one instead of being processed in turn.
"""

from __future__ import annotations

from collections.abc import Sequence

from textual.message import Message

from bpfdyno.client.cluster import HostResult, JobTraceResult
from bpfdyno.client.cluster.summary import NodeSummary
from bpfdyno.rpc.agent import AgentStatus, MetricSpec, MetricsSnapshot, Series
from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import ProcessList
from bpfdyno.rpc.traces import Trainer
from bpfdyno.tui.model import TraceProgress


class Connected(Message):
    """The agent answered: its status and metric declarations."""

    def __init__(self, status: AgentStatus, specs: Sequence[MetricSpec]) -> None:
        super().__init__()
        self.status = status
        self.specs = tuple(specs)


class ConnectionLost(Message):
    """The agent cannot be reached; the next attempt is in ``retry_in_s``."""

    def __init__(self, reason: str, retry_in_s: float, attempt: int) -> None:
        super().__init__()
        self.reason = reason
        self.retry_in_s = retry_in_s
        self.attempt = attempt


class MetricsHistory(Message):
    """Recent history of every series, fetched after connecting."""

    def __init__(self, series: Sequence[Series]) -> None:
        super().__init__()
        self.series = tuple(series)


class MetricsReceived(Message):
    """One streamed collection round (never replaced: each carries different series)."""

    def __init__(self, rnd: MetricsSnapshot) -> None:
        super().__init__()
        self.round = rnd


class StatusUpdated(Message):
    """A fresh agent status."""

    def __init__(self, status: AgentStatus) -> None:
        super().__init__()
        self.status = status

    def can_replace(self, message: Message) -> bool:
        """A newer status supersedes a queued one."""
        return isinstance(message, StatusUpdated)


class ProcessesUpdated(Message):
    """A fresh process table."""

    def __init__(self, table: ProcessList) -> None:
        super().__init__()
        self.table = table

    def can_replace(self, message: Message) -> bool:
        """A newer table supersedes a queued one."""
        return isinstance(message, ProcessesUpdated)


class TrainersUpdated(Message):
    """A fresh list of registered trainers."""

    def __init__(self, trainers: Sequence[Trainer]) -> None:
        super().__init__()
        self.trainers = tuple(trainers)

    def can_replace(self, message: Message) -> bool:
        """A newer list supersedes a queued one."""
        return isinstance(message, TrainersUpdated)


class DetectionUpdated(Message):
    """The detection events the agent holds, oldest first."""

    def __init__(self, events: Sequence[DetectionEvent]) -> None:
        super().__init__()
        self.events = tuple(events)

    def can_replace(self, message: Message) -> bool:
        """A newer list supersedes a queued one."""
        return isinstance(message, DetectionUpdated)


class EventsReceived(Message):
    """Kernel events, in arrival order."""

    def __init__(self, events: Sequence[KernelEvent]) -> None:
        super().__init__()
        self.events = tuple(events)


class PartUnavailable(Message):
    """A part of the API (processes, trainers, events, detection) is not served; ``reason``
    says why."""

    def __init__(self, part: str, reason: str) -> None:
        super().__init__()
        self.part = part
        self.reason = reason


class TraceUpdated(Message):
    """A trace request's new state (posted to the trace screen that follows it)."""

    def __init__(self, progress: TraceProgress) -> None:
        super().__init__()
        self.progress = progress


class TraceFailed(Message):
    """A trace request was refused or could not be followed; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class OpenTraceForm(Message):
    """The user asked to trace some processes (from the trainers or the process table)."""

    def __init__(self, pids: Sequence[int] = (), job_id: str = "") -> None:
        super().__init__()
        self.pids = tuple(pids)
        self.job_id = job_id


class OpenProcess(Message):
    """The user opened a process's detail view."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid


# -- the cluster view (`bpfdyno top --job-id`) ---------------------------------------------


class NodesUpdated(Message):
    """A fresh row for every node of the job."""

    def __init__(self, nodes: Sequence[NodeSummary]) -> None:
        super().__init__()
        self.nodes = tuple(nodes)

    def can_replace(self, message: Message) -> bool:
        """Newer rows supersede queued ones."""
        return isinstance(message, NodesUpdated)


class ClusterDetectionUpdated(Message):
    """Every node's detection events of the job (or why a node has none to give)."""

    def __init__(self, results: Sequence[HostResult[list[DetectionEvent]]]) -> None:
        super().__init__()
        self.results = tuple(results)

    def can_replace(self, message: Message) -> bool:
        """Newer lists supersede queued ones."""
        return isinstance(message, ClusterDetectionUpdated)


class JobTraceUpdated(Message):
    """A job-wide trace's new state (``finished``: no host's part will change any more)."""

    def __init__(self, trace: JobTraceResult, finished: bool = False) -> None:
        super().__init__()
        self.trace = trace
        self.finished = finished

    def can_replace(self, message: Message) -> bool:
        """A newer state supersedes a queued one."""
        return isinstance(message, JobTraceUpdated)


class OpenNode(Message):
    """The user opened a node's full view."""

    def __init__(self, node: NodeSummary) -> None:
        super().__init__()
        self.node = node
