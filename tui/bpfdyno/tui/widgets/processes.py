"""The Processes tab: a sortable, filterable table of the agent's process table.

Sorting and filtering happen here, on the rows the agent sent (its most active processes
plus trainers), so they respond at once without a round trip. The filter language is the
agent's own (``bpfdyno ps --filter``): ``key=value`` terms and bare words.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Input, Static

from bpfdyno.rpc.processes import (
    FILTER_KEYS,
    THREAD_COLUMNS,
    THREAD_COLUMNS_NOTE,
    ProcessFilter,
    ProcessRow,
    QueryError,
    filter_rows,
    parse_filter,
    sort_key,
    sort_rows,
    threads_text,
)
from bpfdyno.tui.fmt import fmt_bytes, fmt_percent, fmt_si
from bpfdyno.tui.messages import OpenProcess, OpenTraceForm
from bpfdyno.tui.model import TopState
from bpfdyno.tui.widgets.table import Column, FastTable


@dataclass(frozen=True, slots=True)
class ProcessColumn:
    """A column of the process table.

    Attributes:
        key: the `ProcessRow` field (or property) it shows, which is also the sort key it
            sorts by (a word of `bpfdyno.rpc.processes.SORT_KEYS`).
        title: its title in the wide layout.
        text: the field's value as text.
        width: its width in cells in the narrow layout.
        wide_width: its width in the wide layout, if wider.
        narrow_title: its title in the narrow layout, where every cell counts.
        left: left-aligned (text) rather than right-aligned (numbers).
    """

    key: str
    title: str
    text: Callable[[Any], str]
    width: int
    wide_width: int | None = None
    narrow_title: str | None = None
    left: bool = False

    def cell(self, row: ProcessRow) -> str:
        """The row's value in this column, as text."""
        return self.text(getattr(row, self.key))


def _or_dash(text: str) -> str:
    return text or "-"


#: The process table's columns in display order; each can be the sort key. The scheduler
#: columns count threads (`THREAD_COLUMNS`, which ``bpfdyno ps`` shows too).
PROCESS_COLUMNS: tuple[ProcessColumn, ...] = (
    ProcessColumn("pid", "PID", str, 7),
    ProcessColumn("user", "USER", _or_dash, 8, left=True),
    ProcessColumn("cpu_ratio", "CPU%", fmt_percent, 5),
    ProcessColumn("rss_bytes", "RSS", fmt_bytes, 6),
    *(ProcessColumn(field, title, threads_text, 5) for title, field in THREAD_COLUMNS),
    ProcessColumn("tcp_tx_bytes_per_second", "TCP TX/s", fmt_bytes, 7, 9, "TX/s"),
    ProcessColumn("tcp_rx_bytes_per_second", "TCP RX/s", fmt_bytes, 7, 9, "RX/s"),
    ProcessColumn("tcp_retransmits_per_second", "RETX/s", fmt_si, 5, 6, "RETX"),
    ProcessColumn("gpu_memory_bytes", "GPU MEM", fmt_bytes, 6, 7, "GPUMEM"),
    ProcessColumn("slurm_job_id", "JOB", _or_dash, 7, left=True),
    ProcessColumn("command", "COMMAND", str, 14, left=True),
)
_BY_KEY = {c.key: c for c in PROCESS_COLUMNS}
#: Columns shown when the terminal is narrower than `WIDE_AT` (80 columns fit these).
NARROW_KEYS = (
    "pid",
    "cpu_ratio",
    "rss_bytes",
    "runq_wait_ratio",
    "tcp_tx_bytes_per_second",
    "tcp_rx_bytes_per_second",
    "tcp_retransmits_per_second",
    "gpu_memory_bytes",
    "slurm_job_id",
    "command",
)
WIDE_AT = 110


def columns_for(width: int) -> list[Column]:
    """The table's columns for a terminal ``width`` cells wide."""
    wide = width >= WIDE_AT
    shown = PROCESS_COLUMNS if wide else tuple(_BY_KEY[k] for k in NARROW_KEYS)
    return [
        Column(
            c.key,
            c.title if wide else c.narrow_title or c.title,
            (c.wide_width or c.width) if wide else c.width,
            align="left" if c.left else "right",
            flex=c.key == "command",
        )
        for c in shown
    ]


def sort_title(key: str) -> str:
    """How the summary names a sort key: its column's title, else the key itself."""
    column = _BY_KEY.get(key)
    return column.title if column is not None else key


class ProcessTableWidget(FastTable):
    """The process rows, formatted per visible column."""

    def __init__(self) -> None:
        super().__init__(
            columns_for(80),
            format_row=self._cells,
            row_key=lambda r: r.pid,
            row_style=_row_style,
            empty_text="no processes (yet)",
            id="process-table",
        )

    def _cells(self, row: ProcessRow) -> Sequence[str]:
        return [_BY_KEY[c.key].cell(row) for c in self.columns]


def _row_style(row: ProcessRow) -> str:
    if row.pinned:
        return "bold"
    return "dim" if not row.cmdline else ""


class ProcessesView(Vertical):
    """Filter line, summary line and the table.

    Keys: ``/`` filter, ``s``/``S`` next/previous sort column, ``r`` reverse, ``enter``
    details, ``t`` trace the selected process.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("s", "sort(1)", "Sort"),
        Binding("S", "sort(-1)", "Sort back", show=False),
        Binding("r", "reverse", "Reverse"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        Binding("t", "trace", "Trace"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_key = "cpu_ratio"
        self.descending = True
        self.filter = ProcessFilter()
        self.filter_error = ""
        self._state: TopState | None = None
        self._wide: bool | None = None

    def compose(self) -> ComposeResult:
        """Filter input, summary, table."""
        yield Input(
            placeholder="/ filter: words, " + " ".join(f"{k}=" for k in FILTER_KEYS),
            id="process-filter",
        )
        yield Static("", id="process-summary")
        yield ProcessTableWidget()

    @property
    def table(self) -> ProcessTableWidget:
        """The table widget."""
        return self.query_one(ProcessTableWidget)

    def on_resize(self) -> None:
        """Switch between the narrow and the wide column set."""
        wide = self.size.width >= WIDE_AT
        if wide != self._wide:
            self._wide = wide
            self.table.set_columns(columns_for(self.size.width))
            if self._state is not None:
                self.update_view(self._state)

    def update_view(self, state: TopState) -> None:
        """Re-sort, re-filter and show the newest table."""
        self._state = state
        summary = self.query_one("#process-summary", Static)
        table = self.table
        table.set_sort(self.sort_key, self.descending)
        snap = state.processes
        if snap is None:
            reason = state.processes_state.reason
            table.empty_text = f"process table unavailable: {reason}" if reason else "waiting..."
            table.set_items([])
            summary.update(Text(""))
            return
        rows = filter_rows(snap.processes, self.filter)
        rows = sort_rows(rows, self.sort_key, self.descending)
        table.empty_text = "no process matches the filter" if snap.processes else "no processes"
        table.set_items(rows)
        title = sort_title(self.sort_key)
        text = (
            f"{len(rows)} shown of {len(snap.processes)} reported, {snap.total_processes} on host"
            f" · sort {title}{'▼' if self.descending else '▲'}"
        )
        if state.job_id:
            text += f" · job {state.job_id}"
        # The scheduler columns count threads, not percents: say so (narrow: RUNQ only).
        text += f" · {THREAD_COLUMNS_NOTE}" if self._wide else " · RUNQ in threads"
        if snap.unavailable:
            text += " · unknown: " + "; ".join(f"{k} ({v})" for k, v in snap.unavailable.items())
        if self.filter_error:
            # Until the filter is fixed, the last good one stays in force; say what is wrong.
            summary.update(Text(self.filter_error, style="red"))
        else:
            summary.update(Text(text))

    def _refresh(self) -> None:
        if self._state is not None:
            self.update_view(self._state)

    def action_focus_filter(self) -> None:
        """Put the cursor in the filter box."""
        self.query_one("#process-filter", Input).focus()

    def action_sort(self, step: int) -> None:
        """Sort by the next (or previous) visible column, in its natural direction."""
        keys = [c.key for c in self.table.columns]
        i = keys.index(self.sort_key) if self.sort_key in keys else -1
        self.set_sort(keys[(i + step) % len(keys)])

    def set_sort(self, key: str) -> None:
        """Sort by ``key`` (any sort key of ``bpfdyno ps --sort``) in its natural direction.

        Raises:
            QueryError: an unknown key (the message lists the known ones).
        """
        by = sort_key(key)
        self.sort_key, self.descending = by.name, by.descending
        self._refresh()

    def action_reverse(self) -> None:
        """Reverse the sort direction."""
        self.descending = not self.descending
        self._refresh()

    def on_fast_table_header_clicked(self, event: FastTable.HeaderClicked) -> None:
        """A click on the sorted column reverses it; on another column sorts by it."""
        if event.column == self.sort_key:
            self.action_reverse()
        else:
            self.set_sort(event.column)

    def on_input_changed(self, event: Input.Changed) -> None:
        """Apply the filter as it is typed; say what is wrong with a bad one."""
        if event.input.id != "process-filter":
            return
        try:
            self.filter = parse_filter(event.value)
            self.filter_error = ""
            event.input.remove_class("-invalid")
        except QueryError as e:
            self.filter_error = str(e)
            event.input.add_class("-invalid")
        self._refresh()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in the filter box goes back to the table."""
        if event.input.id == "process-filter":
            self.table.focus()

    def action_clear_filter(self) -> None:
        """Empty the filter box and go back to the table."""
        box = self.query_one("#process-filter", Input)
        box.value = ""
        self.filter = ProcessFilter()
        self.filter_error = ""
        self.table.focus()
        self._refresh()

    def on_fast_table_selected(self, event: FastTable.Selected) -> None:
        """Enter on a row opens the process's details."""
        if isinstance(event.key, int):
            self.post_message(OpenProcess(event.key))

    def action_trace(self) -> None:
        """Open the trace form for the selected process."""
        row = self.table.cursor_item
        if isinstance(row, ProcessRow):
            self.post_message(OpenTraceForm(pids=(row.pid,), job_id=row.slurm_job_id))
