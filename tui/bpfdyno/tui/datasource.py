"""The one door between the UI and its data: the `DataSource` protocol and its errors.

Screens and workers only ever call a `DataSource`; they never import gRPC, psutil, NVML or
bcc (ruff's banned-api rule enforces it for ``tui/``). Two implementations exist:

- `GrpcDataSource` talks to a running agent (Unix socket or ``host:port``);
- `RecordedDataSource` replays a JSON recording, for demos and for tests without root,
  BPF or a GPU.

The cluster view (``bpfdyno top --job-id``) reads every node of a job through
`ClusterDataSource`, and each node's full view through a `GrpcDataSource` of its own.

Every call either returns plain records (`bpfdyno.tui.records`) or raises one of the three
errors below, which the UI turns into a banner or an "unavailable" panel — never a crash.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.cluster_source import ClusterDataSource
from bpfdyno.tui.errors import DataSourceError, Disconnected, RequestFailed, ServiceUnavailable
from bpfdyno.tui.grpc_source import GrpcDataSource
from bpfdyno.tui.recorded import RecordedDataSource
from bpfdyno.tui.records import (
    AgentStatus,
    KernelEventInfo,
    MetricSpecInfo,
    MetricsRound,
    ProcessTable,
    SeriesPoints,
    TraceStatus,
    TrainerInfo,
)


class DataSource(Protocol):
    """What the UI needs from an agent. All calls run on the app's event loop."""

    @property
    def target(self) -> str:
        """A human description of where the data comes from (socket path, host:port...)."""
        ...

    async def status(self) -> AgentStatus:
        """The agent's identity and collectors' states.

        Raises:
            Disconnected: the agent cannot be reached.
        """
        ...

    async def metric_specs(self) -> list[MetricSpecInfo]:
        """Every metric the agent declares (names, units, labels)."""
        ...

    async def metrics_window(self, names: Sequence[str], seconds: float) -> list[SeriesPoints]:
        """History of the matching series (names or prefixes ending in ``*``) over ``seconds``."""
        ...

    def stream_metrics(self) -> AsyncIterator[MetricsRound]:
        """Every collection round as it happens; ends by raising `Disconnected`."""
        ...

    async def processes(self, limit: int, job_id: str = "") -> ProcessTable:
        """The agent's process table (the most active processes plus trainers).

        Raises:
            ServiceUnavailable: the agent has no process table.
        """
        ...

    async def trainers(self) -> list[TrainerInfo]:
        """PyTorch processes registered for on-demand tracing.

        Raises:
            ServiceUnavailable: the agent does not serve tracing.
        """
        ...

    async def start_trace(self, request: TraceSpec) -> TraceStatus:
        """Ask for a trace; the answer says which processes were triggered.

        Raises:
            RequestFailed: the agent refused the request (the message says why).
            ServiceUnavailable: the agent does not serve tracing.
        """
        ...

    def watch_trace(self, trace_id: str) -> AsyncIterator[TraceStatus]:
        """Each change of a trace's state until it is finished."""
        ...

    def stream_events(self) -> AsyncIterator[KernelEventInfo]:
        """Kernel and GPU events as they happen.

        Raises:
            ServiceUnavailable: the agent does not stream events.
        """
        ...

    async def close(self) -> None:
        """Release the connection; the source is not used afterwards."""
        ...


__all__ = [
    "ClusterDataSource",
    "DataSource",
    "DataSourceError",
    "Disconnected",
    "GrpcDataSource",
    "RecordedDataSource",
    "RequestFailed",
    "ServiceUnavailable",
]
