"""The Agent service's records (``agent.proto``): status, metric specs, series, rounds, clock.

Field names are the messages' (units in the names); `bpfdyno.rpc.wire` maps them. The agent
sends them, and `bpfdyno.client.AgentClient` hands them to ``bpfdyno status``/``metrics``, the
cluster summary and the TUI.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.wire import message, record


class CollectorState(enum.StrEnum):
    """A part's state (`bpfdyno.core.status.PartState` on the agent's side)."""

    STARTING = "starting"
    OK = "ok"
    DEGRADED = "degraded"
    UNAVAILABLE = "unavailable"
    STOPPED = "stopped"
    DISABLED = "disabled"


class MetricKind(enum.StrEnum):
    """What a metric's value is (`bpfdyno.core.metrics.MetricKind` on the agent's side)."""

    GAUGE = "gauge"
    RATE = "rate"
    RATIO = "ratio"
    COUNTER = "counter"
    HISTOGRAM = "histogram"


@record(pb.CollectorStatus)
class CollectorStatus:
    """One collector's (or other part's) state as the agent reports it.

    Attributes:
        name: the collector's name (``host``, ``sched``, ``gpu``...).
        state: where it stands.
        reason: why it is degraded or unavailable and what to do; empty when ok.
        interval_seconds: collection interval; 0 for a part that does not collect.
        collections: successful rounds since the agent started.
        errors: failed rounds since the agent started.
        last_duration_seconds: how long the last round took.
        last_success_unix_seconds: wall-clock time of the last good round; 0 if none.
    """

    name: str
    state: CollectorState = CollectorState.OK
    reason: str = ""
    interval_seconds: float = 0.0
    collections: int = 0
    errors: int = 0
    last_duration_seconds: float = 0.0
    last_success_unix_seconds: float = 0.0


@record(pb.Status)
class AgentStatus:
    """What ``GetStatus`` answers: the agent's identity and each part's state."""

    version: str = ""
    hostname: str = ""
    kernel_release: str = ""
    agent_uptime_seconds: float = 0.0
    host_uptime_seconds: float = 0.0
    pid: int = 0
    config_source: str = ""
    collectors: tuple[CollectorStatus, ...] = ()
    started_unix_seconds: float = 0.0

    def collector(self, name: str) -> CollectorStatus | None:
        """The named collector's state, or None if the agent does not have it."""
        return next((c for c in self.collectors if c.name == name), None)

    @property
    def now_unix_seconds(self) -> float:
        """The agent's clock when it answered (a remote agent's clock may differ from ours)."""
        return self.started_unix_seconds + self.agent_uptime_seconds


@record(pb.MetricSpec)
class MetricSpec:
    """One declared metric: its unit comes from here, never from a client's guesses."""

    name: str
    kind: MetricKind = MetricKind.GAUGE
    unit: str = ""
    help: str = ""
    labels: tuple[str, ...] = ()
    source: str = ""


@message(pb.Label)
class Label(NamedTuple):
    """A label of a series: a ``(name, value)`` pair."""

    name: str
    value: str


@message(pb.Point)
class Point(NamedTuple):
    """A point of a series: ``(unix_seconds, value)``."""

    unix_seconds: float
    value: float


@record(pb.Series)
class Series:
    """One series (a metric and its labels, in the order the metric declares them) and its
    points, oldest first."""

    name: str
    labels: tuple[Label, ...] = ()
    points: tuple[Point, ...] = ()

    @property
    def value(self) -> float:
        """The newest point's value (NaN when there is none)."""
        return self.points[-1].value if self.points else float("nan")


@record(pb.MetricsSnapshot)
class MetricsSnapshot:
    """The latest value of many series, or one streamed round of one collector.

    Attributes:
        unix_seconds: when it was taken (or the round collected).
        collector: for a streamed round, the collector that produced it.
        series: one point each.
    """

    unix_seconds: float = 0.0
    collector: str = ""
    series: tuple[Series, ...] = ()


@record(pb.MetricsWindow)
class MetricsWindow:
    """Every matching series' points inside a window."""

    series: tuple[Series, ...] = ()


@record(pb.Clock)
class Clock:
    """The agent's wall clock when it received a ``GetClock`` and when it answered."""

    receive_unix_seconds: float
    transmit_unix_seconds: float
