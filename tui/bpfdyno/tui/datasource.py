"""The one door between the UI and its data: the `DataSource` protocol and the live source.

Screens and workers only ever call a `DataSource`; they never import gRPC, psutil, NVML or
bcc (ruff's banned-api rule enforces it for ``tui/``). Every call returns the API's own
records (`bpfdyno.rpc`) or raises the client's `AgentError` (`bpfdyno.client.errors`), whose
kind the UI turns into a banner (the agent is lost) or an "unavailable" panel (a part of it
is) — never a crash. Three implementations exist:

- `AgentDataSource`, a running agent through `bpfdyno.client.AgentClient` (Unix socket or
  ``host:port``);
- `RecordedDataSource` (`bpfdyno.tui.recorded`) replays a recording, for demos and for
  tests without root, BPF or a GPU;
- `ClusterDataSource` (`bpfdyno.tui.cluster_source`) reads every node of a job for the
  cluster view, and gives an `AgentDataSource` for each node's full view.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.client.pods import PodNotFound, pod_processes
from bpfdyno.rpc.agent import AgentStatus, MetricSpec, MetricsSnapshot, Series
from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import DEFAULT_SORT, ProcessList
from bpfdyno.rpc.traces import TraceSpec, TraceStart, TraceStatus, Trainer

#: Events of the recent past shown when the UI connects.
RECENT_EVENTS = 200


class DataSource(Protocol):
    """What the UI needs from an agent. All calls run on the app's event loop and raise
    `AgentError` when they cannot answer."""

    @property
    def target(self) -> str:
        """A human description of where the data comes from (socket path, host:port...)."""
        ...

    async def status(self) -> AgentStatus:
        """The agent's identity and collectors' states."""
        ...

    async def metric_specs(self) -> list[MetricSpec]:
        """Every metric the agent declares (names, units, labels)."""
        ...

    async def metrics_window(self, names: Sequence[str], seconds: float) -> list[Series]:
        """History of the matching series (names or prefixes ending in ``*``) over the last
        ``seconds`` of the agent's clock."""
        ...

    def stream_metrics(self) -> AsyncIterator[MetricsSnapshot]:
        """Every collection round as it happens; ends by raising `AgentError`."""
        ...

    async def processes(self, limit: int, job_id: str = "") -> ProcessList:
        """The agent's process table (the most active processes plus trainers)."""
        ...

    async def trainers(self) -> list[Trainer]:
        """PyTorch processes registered for on-demand tracing."""
        ...

    async def start_trace(self, request: TraceSpec) -> TraceStart:
        """Ask for a trace; the answer says which processes were triggered."""
        ...

    def watch_trace(self, trace_id: str) -> AsyncIterator[TraceStatus]:
        """Each change of a trace's state until it is finished."""
        ...

    def stream_events(self) -> AsyncIterator[KernelEvent]:
        """Recent kernel and GPU events, then new ones as they happen."""
        ...

    async def detection_events(self, job_id: str = "") -> list[DetectionEvent]:
        """The straggler and hang events the agent holds, oldest first (of one job)."""
        ...

    async def close(self) -> None:
        """Release the connection; the source is not used afterwards."""
        ...


def stream_ended(target: str, what: str) -> AgentError:
    """The error of a stream the agent ended: the UI treats it as a lost agent."""
    return AgentError(
        ErrorKind.UNREACHABLE, f"the agent at {target} ended the {what} stream (stopping?)"
    )


class AgentDataSource:
    """The UI's data from the agent at ``target`` (a Unix socket path or ``host:port``).

    Args:
        target: where the agent listens.
        call_timeout_s: deadline of each unary call.
        pod: show only this Kubernetes pod's processes and trainers (``--pod``: the
            ``NAMESPACE/NAME`` or uid `bpfdyno.client.pods` takes); "" for all.
    """

    def __init__(self, target: str, call_timeout_s: float = 5.0, pod: str = "") -> None:
        self._agent = AgentClient(target, timeout_s=call_timeout_s)
        self._pod = pod

    @property
    def target(self) -> str:
        """Where the agent listens, as given."""
        return self._agent.target

    async def status(self) -> AgentStatus:
        """The agent's identity and its collectors' states."""
        return await self._agent.status()

    async def metric_specs(self) -> list[MetricSpec]:
        """Every declared metric."""
        return await self._agent.metric_specs()

    async def metrics_window(self, names: Sequence[str], seconds: float) -> list[Series]:
        """History of the matching series over the last ``seconds``."""
        # The agent's clock, not ours: a remote agent's clock may differ from this host's.
        now = (await self._agent.status()).now_unix_seconds
        return await self._agent.metrics_window(names, now - seconds, now)

    async def stream_metrics(self) -> AsyncIterator[MetricsSnapshot]:
        """Every collection round; raises `AgentError` when the stream ends."""
        async for snap in self._agent.stream_metrics():
            yield snap
        raise stream_ended(self.target, "metrics")

    async def processes(self, limit: int, job_id: str = "") -> ProcessList:
        """The agent's process table (only ``job_id``'s, and the pod's, processes if given)."""
        terms = (f"job={job_id}" if job_id else "", f"pod={self._pod}" if self._pod else "")
        return await self._agent.processes(DEFAULT_SORT, limit, " ".join(t for t in terms if t))

    async def trainers(self) -> list[Trainer]:
        """Registered PyTorch processes (the pod's only, when one is asked for)."""
        trainers = await self._agent.trainers()
        if not self._pod:
            return trainers
        try:
            return (await pod_processes(self._agent, self._pod)).trainers(trainers)
        except PodNotFound:
            return []  # none of it here (yet): the processes tab says the same

    async def start_trace(self, request: TraceSpec) -> TraceStart:
        """Ask for a trace; the answer lists who was triggered, with their file names."""
        return await self._agent.start_trace(request)

    def watch_trace(self, trace_id: str) -> AsyncIterator[TraceStatus]:
        """The trace's state now and after every change, until every process has ended."""
        return self._agent.watch_trace(trace_id)

    async def stream_events(self) -> AsyncIterator[KernelEvent]:
        """Recent events the agent still holds, then new ones as they happen."""
        # Subscribe first, then fetch the recent past: an event in between arrives twice
        # (dropped by key below) rather than not at all.
        live = self._agent.stream_events()
        recent = (await self._agent.events(limit=RECENT_EVENTS)).events
        seen = {_event_key(ev) for ev in recent}
        for ev in recent:
            yield ev
        async for ev in live:
            if seen and _event_key(ev) in seen:
                continue
            seen.clear()  # past the overlap: stop paying for the check
            yield ev
        raise stream_ended(self.target, "event")

    async def detection_events(self, job_id: str = "") -> list[DetectionEvent]:
        """The straggler and hang events the agent holds, oldest first (of one job)."""
        return await self._agent.detection_events(job_id)

    async def close(self) -> None:
        """Close the connection (cancelling its calls); the source is not used afterwards."""
        await self._agent.close()


def _event_key(ev: KernelEvent) -> tuple[int, str, int, int]:
    return (ev.unix_ns, ev.kind, ev.pid, ev.tid)
