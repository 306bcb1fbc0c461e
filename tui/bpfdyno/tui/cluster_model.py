"""The cluster view's state and its derived text: one row per node of a job. Pure, no I/O.

A value the node does not have (no GPU, no BPF scheduler data) shows as ``-``; a node whose
agent does not answer shows ``down`` and why. A node with a rank the detection flags (a
suspected or confirmed straggler, a hang) says so in its row's note, with the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from rich.text import Text

from bpfdyno.analysis.verdict import verdict_text
from bpfdyno.client.cluster import HostOutcome, JobOutcome, JobTraceResult
from bpfdyno.client.cluster.summary import NodeSummary
from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.rpc.traces import words
from bpfdyno.tui.detection_model import (
    KIND_STYLE,
    RankFlag,
    event_cells,
    flag_line,
    flagged,
    rank_text,
)
from bpfdyno.tui.fmt import UNKNOWN, fmt_bytes, fmt_percent, fmt_seconds, fmt_si, fmt_value


@dataclass
class ClusterState:
    """What the cluster screen renders, updated only on the app's loop.

    Attributes:
        job: the job as the user named it ("" for hosts given by hand).
        origin: where the nodes came from (``SLURM``, ``--hosts``...).
        node_count: how many nodes the job has.
        nodes: the newest row of every node (empty until the first poll answers).
        updated_ts: when those rows arrived (epoch seconds; 0: not yet).
        trace: the last job-wide trace, if any.
        trace_finished: no host's part of it will change any more.
        polls: how many polls have answered (0: the rows are not there yet).
    """

    job: str
    origin: str
    node_count: int
    nodes: tuple[NodeSummary, ...] = ()
    updated_ts: float = 0.0
    trace: JobTraceResult | None = None
    trace_finished: bool = False
    polls: int = 0
    #: Per node (its target): the detection events of the job it holds, oldest first.
    detection: dict[str, tuple[DetectionEvent, ...]] = field(default_factory=dict)
    #: Per node (its target): why it gave no detection events.
    detection_errors: dict[str, str] = field(default_factory=dict)

    def flags(self) -> dict[tuple[str, str, int], RankFlag]:
        """Every rank of the job that stands out now, on any node."""
        return flagged(e for events in self.detection.values() for e in events)

    def node_flags(self, n: NodeSummary) -> list[RankFlag]:
        """The ranks of one node that stand out now."""
        return list(flagged(self.detection.get(n.node.target, ())).values())

    @property
    def answering(self) -> int:
        """Nodes whose agent answered the last poll."""
        return sum(n.up for n in self.nodes)


def _ratio(used: float, total: float) -> float:
    return used / total if total > 0 and not math.isnan(used) else math.nan


def node_cells(n: NodeSummary) -> list[str]:
    """A node's cells, in `CLUSTER_COLUMNS` order (see the cluster screen)."""
    if not n.up:
        note = n.error.message if n.error is not None else "no answer"
        return [n.node.name, "down", *([UNKNOWN] * 12), note]
    note = n.problems[0] if n.problems else (n.hostname if n.hostname != n.node.name else "")
    return [
        n.node.name,
        n.agent_state,
        fmt_percent(n.cpu_ratio),
        fmt_percent(_ratio(n.memory_used_bytes, n.memory_total_bytes)),
        fmt_percent(n.gpu_utilization_ratio) if n.gpus else UNKNOWN,
        fmt_percent(_ratio(n.gpu_memory_used_bytes, n.gpu_memory_total_bytes))
        if n.gpus
        else UNKNOWN,
        fmt_value(n.gpu_power_watts, "watts") if n.gpus else UNKNOWN,
        fmt_bytes(n.net_rx_bytes_per_second),
        fmt_bytes(n.net_tx_bytes_per_second),
        fmt_bytes(n.rdma_bytes_per_second),
        fmt_si(n.rdma_errors_per_second),
        fmt_si(n.tcp_retransmits_per_second),
        fmt_seconds(n.runqueue_p99_seconds),
        str(n.trainers) if n.trainers is not None else UNKNOWN,
        note,
    ]


def flagged_cells(n: NodeSummary, flags: list[RankFlag]) -> list[str]:
    """A node's cells with its flagged ranks in the note (marker, rank, the evidence)."""
    cells = node_cells(n)
    if flags:
        cells[-1] = "; ".join(
            f"{f.marker} rank {rank_text(f.event.rank)}: {f.reason}" for f in flags
        )
    return cells


def node_style(n: NodeSummary) -> str:
    """A row's colour: red for a node that does not answer, yellow for a degraded agent."""
    if not n.up:
        return "red"
    return "yellow" if n.agent_state != "ok" else ""


def node_detail(n: NodeSummary) -> str:
    """Everything about one node that does not fit its row."""
    head = f"{n.node.name} ({n.node.target})"
    if n.node.job_ids:
        head += " · job id" + ("s " if len(n.node.job_ids) > 1 else " ")
        head += ",".join(str(j) for j in n.node.job_ids)
    if not n.up:
        why = n.error.message if n.error is not None else "no answer"
        return f"{head} · down: {why}"
    parts = [head, f"host {n.hostname}", f"bpfdyno {n.version}"]
    if n.trainers is not None:
        parts.append(f"{n.trainers} trainer(s) registered, {n.tracing} tracing")
    if n.memory_total_bytes > 0:
        parts.append(f"mem {fmt_bytes(n.memory_used_bytes)}/{fmt_bytes(n.memory_total_bytes)}")
    if n.gpus:
        parts.append(
            f"{n.gpus} GPU(s), mem {fmt_bytes(n.gpu_memory_used_bytes)}/"
            f"{fmt_bytes(n.gpu_memory_total_bytes)}"
        )
    if n.unavailable:
        parts.append("not collected here: " + ", ".join(n.unavailable))
    lines = [" · ".join(parts), *n.problems]
    return "\n".join(lines)


#: Recent detection events the cluster screen lists.
RECENT_DETECTION = 5


def detection_lines(state: ClusterState) -> list[tuple[str, str]]:
    """The job's detection as (text, style) lines: the ranks that stand out now, then the
    newest events of every node (empty when there is nothing to say)."""
    flags = state.flags()
    events = sorted(
        (e for evs in state.detection.values() for e in evs), key=lambda e: e.unix_seconds
    )
    lines: list[tuple[str, str]] = []
    if events or flags:
        head = (
            f"detection: {len(flags)} rank(s) stand out"
            if flags
            else "detection: no rank stands out"
        )
        lines.append((head, "bold red" if flags else "bold"))
        lines += [(flag_line(f), f.style) for f in flags.values()]
        lines += [
            (" ".join(event_cells(e)), KIND_STYLE.get(e.kind, ""))
            for e in reversed(events[-RECENT_DETECTION:])
        ]
    for target, why in sorted(state.detection_errors.items()):
        lines.append((f"detection of {target} unknown: {why}", "yellow"))
    return lines


def summary_line(state: ClusterState) -> str:
    """The screen's first line: which job, how many nodes answer."""
    what = f"job {state.job}" if state.job else "hosts"
    text = f"{what} · {state.node_count} node(s) from {state.origin}"
    if state.polls:
        down = len(state.nodes) - state.answering
        text += f" · {state.answering} answering" + (f", {down} down" if down else "")
    else:
        text += " · asking every agent..."
    return text


#: Colours of a host's outcome in a job-wide trace.
OUTCOME_STYLE = {HostOutcome.OK: "green", HostOutcome.FAILED: "red", HostOutcome.INCOMPLETE: "red"}


def trace_lines(trace: JobTraceResult, finished: bool) -> list[tuple[str, str]]:
    """A job-wide trace as (text, style) lines: the verdict, then per host and file."""
    outcome = words(trace.outcome)
    head = "job trace: " + (f"done, {outcome}" if finished else "running")
    lines = [(head, "bold green" if finished and trace.outcome is JobOutcome.ALL else "bold")]
    width = max([4, *(len(h.node.name) for h in trace.hosts)])
    for h in trace.hosts:
        clock = f"{h.clock.offset_s * 1e3:+.1f}ms" if h.clock is not None else UNKNOWN
        style = OUTCOME_STYLE.get(h.outcome, "")
        lines.append((f"{h.node.name:<{width}} {words(h.outcome):<12} clock {clock}", style))
        if h.reason:
            lines.append((f"{'':<{width}}   {h.reason}", style))
        for f in h.files():
            size = fmt_bytes(f.size_bytes) if f.size_bytes is not None else UNKNOWN
            lines.append((f"{'':<{width}}   pid {f.pid} {f.state} {size} {f.path}", ""))
    if trace.verdict is not None:  # which rank held the job back, and why
        first, *rest = verdict_text(trace.verdict).splitlines()
        lines.append((first, "bold red" if trace.verdict.stragglers else "bold green"))
        lines += [(line, "") for line in rest]
    return lines


def lines_text(lines: list[tuple[str, str]]) -> Text:
    """(text, style) lines as one Rich text."""
    text = Text()
    for i, (line, style) in enumerate(lines):
        if i:
            text.append("\n")
        text.append(line, style=style)
    return text
