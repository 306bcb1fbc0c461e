"""The Trainers tab: PyTorch processes registered for on-demand tracing, and the last trace.

A rank the agent's detection flags (suspected or confirmed straggler, the rank a hang names)
is marked in its row (``SUSPECTED``, ``CONFIRMED``, ``HUNG`` in the state column, coloured) and
said with its evidence in the summary line.

``t`` traces the selected trainer, ``T`` every trainer of its job; the form opens with those
filled in. The panel under the table follows the last trace to the files it wrote.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Static

from bpfdyno.rpc.traces import Trainer, words
from bpfdyno.tui.detection_model import RankFlag, flagged, flags_by_pid
from bpfdyno.tui.fmt import fmt_bytes, fmt_duration
from bpfdyno.tui.messages import OpenTraceForm
from bpfdyno.tui.model import TopState, TraceProgress
from bpfdyno.tui.widgets.table import Column, FastTable

TRAINER_COLUMNS = (
    Column("pid", "PID", 7),
    Column("job", "JOB", 8, align="left"),
    Column("role", "ROLE", 11, align="left"),
    Column("state", "STATE", 14, align="left"),
    Column("polled", "POLLED", 7),
    Column("trace", "TRACE", 10, align="left"),
    Column("comm", "COMMAND", 12, align="left", flex=True),
)
STATE_STYLE = {"tracing": "bold green", "config pending": "yellow"}


def trace_table(progress: TraceProgress) -> Table:
    """Per process state and file of a trace, as a Rich table."""
    table = Table(box=None, pad_edge=False, expand=True, show_edge=False)
    table.add_column("PID", justify="right", no_wrap=True)
    table.add_column("STATE", no_wrap=True)
    table.add_column("SIZE", justify="right", no_wrap=True)
    table.add_column("FILE / MESSAGE", ratio=1, overflow="fold")
    for p in progress.lines():
        style = {"written": "green", "failed": "red", "timed out": "red"}.get(p.state, "")
        where = Text(p.path or p.message)  # Text: a path or reason is not Rich markup
        if p.kernel_tracks:
            merged = " merged " in p.kernel_tracks
            where.append("\n" + p.kernel_tracks, style="dim" if merged else "yellow")
        table.add_row(str(p.pid), Text(p.state, style=style), fmt_bytes(p.size_bytes), where)
    return table


def trace_summary(progress: TraceProgress) -> Text:
    """One line: the trace id, its state and what the agent said."""
    text = Text(f"trace {progress.start.trace_id}: ", style="bold")
    text.append(progress.state, style="green" if progress.state == "done" else "yellow")
    if progress.message:
        text.append(f" · {progress.message}")
    return text


class TrainersView(Vertical):
    """Summary line, trainer table and the last trace's progress."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("t", "trace(0)", "Trace"),
        Binding("T", "trace(1)", "Trace job"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._now = time.time
        self._commands: dict[int, str] = {}
        self._flags: dict[int, RankFlag] = {}

    def compose(self) -> ComposeResult:
        """Summary, table, trace panel."""
        yield Static("", id="trainer-summary")
        yield FastTable(
            TRAINER_COLUMNS,
            format_row=self._cells,
            row_key=lambda t: t.pid,
            row_style=self._style,
            empty_text="no PyTorch process registered: start training with KINETO_USE_DAEMON=1",
            id="trainer-table",
        )
        yield Static("", id="trace-panel")

    def _style(self, t: Trainer) -> str:
        flag = self._flags.get(t.pid)
        return flag.style if flag is not None else STATE_STYLE.get(words(t.state), "")

    def _cells(self, t: Trainer) -> Sequence[str]:
        age = self._now() - t.last_poll_unix_seconds if t.last_poll_unix_seconds else math.nan
        flag = self._flags.get(t.pid)
        return [
            str(t.pid),
            str(t.job_id or "-"),
            words(t.role) if t.role else "-",
            # Upper case, in the row's colour: the detection's word beats the trace state's
            # (the TRACE column still names a running trace), and 80 columns have no room for
            # both.
            flag.marker if flag is not None else words(t.state),
            fmt_duration(age) if not math.isnan(age) else "-",
            t.trace_id or "-",
            self._commands.get(t.pid) or "-",
        ]

    def update_view(self, state: TopState) -> None:
        """Show the newest trainer list and trace."""
        table = self.query_one("#trainer-table", FastTable)
        summary = self.query_one("#trainer-summary", Static)
        # Ages against the agent's clock when known, so a recording reads the same later.
        now = state.metrics.now
        self._now = (lambda: now) if now else time.time
        # The tracing API knows pids; the process table knows what they run.
        if state.processes is not None:
            self._commands = {r.pid: r.command for r in state.processes.processes}
        job = state.job_id
        trainers = [t for t in state.trainers if not job or str(t.job_id) == job]
        # This agent's events name its own ranks' pids (hosts differ only across agents).
        self._flags = flags_by_pid(flagged(state.detection))
        pids = {t.pid for t in trainers}
        standing = [f for pid, f in self._flags.items() if pid in pids]
        if not state.trainers_state.ok:
            table.empty_text = f"tracing unavailable: {state.trainers_state.reason}"
            table.set_items([])
            summary.update(Text(""))
        else:
            table.empty_text = (
                "no PyTorch process registered: start training with KINETO_USE_DAEMON=1"
            )
            table.set_items(sorted(trainers, key=lambda t: (t.job_id, t.pid)))
            jobs = {t.job_id for t in trainers if t.job_id}
            text = Text(
                f"{len(trainers)} trainer(s) in {len(jobs)} job(s)"
                + (f" · job {job}" if job else "")
            )
            for f in standing:
                text.append(" · ")
                text.append(f"rank {f.event.rank} {f.marker}: {f.reason}", style=f.style)
            if not standing:
                text.append(" · t: trace selected · T: trace its whole job")
            summary.update(text)
        panel = self.query_one("#trace-panel", Static)
        if state.last_trace is None:
            panel.display = False
        else:
            panel.display = True
            group = Table.grid(expand=True)
            group.add_row(trace_summary(state.last_trace))
            group.add_row(trace_table(state.last_trace))
            panel.update(group)

    def action_trace(self, whole_job: int) -> None:
        """Open the trace form for the selected trainer (or its whole job)."""
        item = self.query_one("#trainer-table", FastTable).cursor_item
        if not isinstance(item, Trainer):
            self.notify("no trainer selected", severity="warning")
            return
        job = str(item.job_id or "")
        if whole_job and job:
            self.post_message(OpenTraceForm(job_id=job))
        else:
            self.post_message(OpenTraceForm(pids=(item.pid,), job_id=job))
