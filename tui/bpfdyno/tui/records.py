"""The plain records the data source hands to the UI.

The UI never sees protobuf messages, psutil objects or anything live: every data source
(gRPC, a recording) converts what it receives into these frozen dataclasses, so screens and
the pure model can be tested with hand-made values. A value that is not known is NaN (floats)
or None (counts), never 0.

Process rows and trace requests are the API's own records (`bpfdyno.rpc.processes.ProcessRow`,
`bpfdyno.rpc.traces.TraceSpec`): the agent and the UI share one vocabulary for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bpfdyno.rpc.processes import ProcessRow

NAN = float("nan")

#: Label pairs of one series, in the order the metric declares them.
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class CollectorInfo:
    """One collector's state as the agent reports it.

    Attributes:
        name: the collector's name (``host``, ``sched``, ``gpu``...).
        state: lower-case state: starting, ok, degraded, unavailable, stopped, disabled.
        reason: why it is degraded or unavailable and what to do; empty when ok.
        interval_s: collection interval in seconds.
        collections: successful rounds since the agent started.
        errors: failed rounds since the agent started.
        last_duration_s: how long the last round took, in seconds.
        last_success_ts: wall-clock epoch seconds of the last good round; 0 if none.
    """

    name: str
    state: str
    reason: str = ""
    interval_s: float = NAN
    collections: int = 0
    errors: int = 0
    last_duration_s: float = NAN
    last_success_ts: float = 0.0


@dataclass(frozen=True, slots=True)
class AgentStatus:
    """What ``GetStatus`` answers: the agent's identity and its collectors."""

    version: str
    hostname: str
    kernel_release: str
    agent_uptime_s: float
    host_uptime_s: float
    pid: int
    config_source: str
    started_ts: float
    collectors: tuple[CollectorInfo, ...] = ()

    def collector(self, name: str) -> CollectorInfo | None:
        """The named collector's state, or None if the agent does not have it."""
        for c in self.collectors:
            if c.name == name:
                return c
        return None


@dataclass(frozen=True, slots=True)
class MetricSpecInfo:
    """One declared metric: its unit comes from here, never from the UI's guesses."""

    name: str
    kind: str
    unit: str
    help: str = ""
    labels: tuple[str, ...] = ()
    source: str = ""


@dataclass(frozen=True, slots=True)
class SeriesPoints:
    """Points of one series inside a window: ``(epoch seconds, value)`` pairs, oldest first."""

    name: str
    labels: Labels
    points: tuple[tuple[float, float], ...]


@dataclass(frozen=True, slots=True)
class MetricValue:
    """One series' value in a collection round."""

    name: str
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class MetricsRound:
    """One collection round of one collector (what the metrics stream delivers)."""

    ts: float
    collector: str
    values: tuple[MetricValue, ...]


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """A process table snapshot.

    Attributes:
        ts: wall-clock epoch seconds of the refresh.
        rows: the processes the agent chose to report (the most active plus trainers).
        total_processes: processes on the host, shown or not.
        unavailable: sources whose columns are unknown (name -> reason with a fix).
    """

    ts: float
    rows: tuple[ProcessRow, ...]
    total_processes: int
    unavailable: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class TrainerInfo:
    """A PyTorch process registered with the agent for on-demand tracing."""

    pid: int
    job_id: str = ""
    comm: str = ""
    state: str = "idle"
    first_seen_ts: float = NAN
    last_poll_ts: float = NAN
    ancestors: tuple[int, ...] = ()
    trace_id: str = ""
    role: str = ""


@dataclass(frozen=True, slots=True)
class TraceProcess:
    """One process of a trace: where it stands and the file it writes."""

    pid: int
    state: str
    path: str = ""
    size_bytes: int | None = None
    message: str = ""
    kernel_tracks: str = ""  # its kernel tracks in words ("" when none were asked for)


@dataclass(frozen=True, slots=True)
class TraceStatus:
    """A trace request followed to completion.

    Attributes:
        trace_id: the agent's id for the request.
        state: overall state (pending, running, done, failed...).
        processes: per process progress and file path.
        message: what the agent said about the request as a whole (no match, busy...).
        finished: no process will change state any more.
    """

    trace_id: str
    state: str
    processes: tuple[TraceProcess, ...] = ()
    message: str = ""
    finished: bool = False


@dataclass(frozen=True, slots=True)
class KernelEventInfo:
    """One kernel (or GPU) event: a retransmit, a drop, a reset, an exec, an XID..."""

    ts_ns: int
    kind: str
    pid: int = 0
    tid: int = 0
    comm: str = ""
    attrs: tuple[tuple[str, str], ...] = field(default=())

    def detail(self) -> str:
        """The attributes as ``key=value`` words, in a stable order."""
        return " ".join(f"{k}={v}" for k, v in self.attrs)


def is_known(value: float | int | None) -> bool:
    """Whether a value is known: not None and not NaN."""
    return value is not None and not (isinstance(value, float) and math.isnan(value))
