"""Protobuf messages of the agent's API -> the UI's plain records. Translation only."""

from __future__ import annotations

import math

from bpfdyno.rpc.processes import row_from_pb
from bpfdyno.rpc.v1 import agent_pb2, kernel_pb2
from bpfdyno.tui.records import (
    AgentStatus,
    CollectorInfo,
    KernelEventInfo,
    MetricSpecInfo,
    MetricsRound,
    MetricValue,
    ProcessTable,
    SeriesPoints,
)


def _enum_word(name: str, prefix: str) -> str:
    """``COLLECTOR_STATE_OK`` -> ``ok``."""
    return name.removeprefix(prefix).lower()


def collector_from_pb(c: agent_pb2.CollectorStatus) -> CollectorInfo:
    """One collector's status."""
    state = _enum_word(agent_pb2.CollectorState.Name(c.state), "COLLECTOR_STATE_")
    return CollectorInfo(
        name=c.name,
        state=state,
        reason=c.reason,
        interval_s=c.interval_seconds,
        collections=c.collections,
        errors=c.errors,
        last_duration_s=c.last_duration_seconds,
        last_success_ts=c.last_success_unix_seconds,
    )


def status_from_pb(st: agent_pb2.Status) -> AgentStatus:
    """The agent's status."""
    return AgentStatus(
        version=st.version,
        hostname=st.hostname,
        kernel_release=st.kernel_release,
        agent_uptime_s=st.agent_uptime_seconds,
        host_uptime_s=st.host_uptime_seconds,
        pid=st.pid,
        config_source=st.config_source,
        started_ts=st.started_unix_seconds,
        collectors=tuple(collector_from_pb(c) for c in st.collectors),
    )


def spec_from_pb(s: agent_pb2.MetricSpec) -> MetricSpecInfo:
    """One metric declaration."""
    return MetricSpecInfo(
        name=s.name,
        kind=_enum_word(agent_pb2.MetricKind.Name(s.kind), "METRIC_KIND_"),
        unit=s.unit,
        help=s.help,
        labels=tuple(s.labels),
        source=s.source,
    )


def series_from_pb(s: agent_pb2.Series) -> SeriesPoints:
    """One series with its points."""
    return SeriesPoints(
        name=s.name,
        labels=tuple((lab.name, lab.value) for lab in s.labels),
        points=tuple((p.unix_seconds, p.value) for p in s.points),
    )


def round_from_pb(snap: agent_pb2.MetricsSnapshot) -> MetricsRound:
    """One streamed round: the last point of each series."""
    values = tuple(
        MetricValue(
            s.name,
            tuple((lab.name, lab.value) for lab in s.labels),
            s.points[-1].value if s.points else math.nan,
        )
        for s in snap.series
    )
    return MetricsRound(ts=snap.unix_seconds, collector=snap.collector, values=values)


def processes_from_pb(resp: kernel_pb2.ListProcessesResponse) -> ProcessTable:
    """The process table."""
    return ProcessTable(
        ts=resp.unix_seconds,
        rows=tuple(row_from_pb(r) for r in resp.processes),
        total_processes=resp.total_processes,
        unavailable=tuple(sorted(resp.unavailable.items())),
    )


def _attr_text(v: kernel_pb2.EventAttrValue) -> str:
    which = v.WhichOneof("value")
    if which == "int_value":
        return str(v.int_value)
    if which == "double_value":
        return f"{v.double_value:g}"
    if which == "string_value":
        return v.string_value
    return ""


def event_from_pb(ev: kernel_pb2.KernelEvent) -> KernelEventInfo:
    """One kernel event; attributes as text, sorted by name for a stable display."""
    return KernelEventInfo(
        ts_ns=ev.unix_ns,
        kind=ev.kind,
        pid=ev.pid,
        tid=ev.tid,
        comm=ev.comm,
        attrs=tuple((k, _attr_text(ev.attrs[k])) for k in sorted(ev.attrs)),
    )
