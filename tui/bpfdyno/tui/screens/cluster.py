"""The cluster view: one row per node of a job, live at the refresh rate.

``enter`` opens the selected node's full view (every tab, narrowed to the job); ``T`` traces
the whole job through the same fan-out as ``bpfdyno gputrace --job-id``. A node whose agent
does not answer stays in the table, in red, with why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, Static

from bpfdyno.client.cluster.summary import NodeSummary
from bpfdyno.tui.cluster_model import (
    ClusterState,
    detection_lines,
    flagged_cells,
    lines_text,
    node_cells,
    node_detail,
    node_style,
    summary_line,
    trace_lines,
)
from bpfdyno.tui.fmt import fmt_clock
from bpfdyno.tui.messages import OpenNode, OpenTraceForm
from bpfdyno.tui.widgets.table import Column, FastTable

#: The node column's width when names are short; it grows with them up to `MAX_NODE_WIDTH`.
NODE_WIDTH = 8
MAX_NODE_WIDTH = 24
CLUSTER_COLUMNS = (
    Column("node", "NODE", NODE_WIDTH, align="left"),
    Column("agent", "AGENT", 8, align="left"),
    Column("cpu", "CPU", 4),
    Column("mem", "MEM", 4),
    Column("gpu", "GPU", 4),
    Column("gmem", "GMEM", 4),
    Column("power", "POWER", 5),
    Column("rx", "NET RX", 6),
    Column("tx", "NET TX", 6),
    Column("rdma", "RDMA", 6),
    Column("rerr", "RERR", 4),
    Column("retx", "RETX", 4),
    Column("runq", "RUNQ99", 6),
    Column("trainers", "TRN", 3),
    Column("note", "NOTE", 6, align="left", flex=True),
)


def cluster_columns(names: Sequence[str]) -> tuple[Column, ...]:
    """The table's columns, the node column wide enough for the longest name (capped)."""
    width = min(MAX_NODE_WIDTH, max([NODE_WIDTH, *(len(n) for n in names)]))
    return (replace(CLUSTER_COLUMNS[0], width=width), *CLUSTER_COLUMNS[1:])


class NodeTable(FastTable):
    """The node table: ``enter`` opens the node (and says so in the footer)."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("enter", "select", "Node view")]


class ClusterScreen(Screen[None]):
    """Summary line, node table, the selected node's details, the last job trace.

    Args:
        job_id: the job a job-wide trace is for ("" for hosts given without one).
        names: the nodes' names (to size their column).
    """

    BINDINGS: ClassVar[list[BindingType]] = [Binding("T", "trace_job", "Trace job")]

    def __init__(self, job_id: str = "", names: Sequence[str] = ()) -> None:
        super().__init__()
        self._job_id = job_id
        self._names = tuple(names)
        self._state: ClusterState | None = None

    def compose(self) -> ComposeResult:
        """The parts, top to bottom."""
        yield Static("", id="cluster-summary")
        yield NodeTable(
            cluster_columns(self._names),
            format_row=self._cells,
            row_key=lambda n: n.node.target,
            row_style=self._style,
            empty_text="asking every node's agent...",
            id="cluster-table",
        )
        yield Static("", id="cluster-detail")
        yield Static("", id="cluster-detection")
        yield Static("", id="cluster-trace")
        yield Footer()

    def on_mount(self) -> None:
        """The table takes the keys; show what arrived before the screen was ready."""
        self.query_one(FastTable).focus()
        if self._state is not None:
            self.update_view(self._state)

    def _cells(self, n: NodeSummary) -> Sequence[str]:
        if self._state is None:
            return node_cells(n)
        return flagged_cells(n, self._state.node_flags(n))

    def _style(self, n: NodeSummary) -> str:
        flags = self._state.node_flags(n) if self._state is not None and n.up else []
        return flags[0].style if flags else node_style(n)

    @property
    def table(self) -> FastTable:
        """The node table."""
        return self.query_one("#cluster-table", FastTable)

    def update_view(self, state: ClusterState) -> None:
        """Show the newest rows, the selected node's details and the last job trace."""
        self._state = state
        if not self.is_mounted or not self.query("#cluster-summary"):
            # Pushed but not composed yet (on_mount shows it), or its widgets are being
            # removed while the app shuts down (a refresh tick may still come).
            return
        summary = summary_line(state)
        if state.updated_ts:
            summary += f" · {fmt_clock(state.updated_ts)}"
        self.query_one("#cluster-summary", Static).update(Text(summary))
        self.table.set_items(state.nodes)
        self._show_detail()
        detection = detection_lines(state)
        panel = self.query_one("#cluster-detection", Static)
        panel.display = bool(detection)
        if detection:
            panel.update(lines_text(detection))
        panel = self.query_one("#cluster-trace", Static)
        panel.display = state.trace is not None
        if state.trace is not None:
            panel.update(lines_text(trace_lines(state.trace, state.trace_finished)))

    def _show_detail(self) -> None:
        node = self.table.cursor_item
        detail = self.query_one("#cluster-detail", Static)
        if not isinstance(node, NodeSummary):
            detail.update("")
            return
        detail.update(Text(node_detail(node), style="" if node.up else "red"))

    def on_fast_table_highlighted(self, event: FastTable.Highlighted) -> None:
        """The cursor moved: show that node's details."""
        self._show_detail()

    def on_fast_table_selected(self, event: FastTable.Selected) -> None:
        """Enter (or a double click) on a row opens that node's full view."""
        node = self.table.cursor_item
        if isinstance(node, NodeSummary):
            self.post_message(OpenNode(node))

    def action_trace_job(self) -> None:
        """Open the form for a trace of every node of the job."""
        self.post_message(OpenTraceForm(job_id=self._job_id))
