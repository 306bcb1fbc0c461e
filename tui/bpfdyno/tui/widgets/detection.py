"""The Detection tab: the ranks that stand out now, and every straggler and hang event the
agent holds, newest first; the selected event's evidence (a hang's threads) below."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static

from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.tui.detection_model import (
    KIND_STYLE,
    event_cells,
    event_detail,
    flag_line,
    flagged,
    summary_line,
)
from bpfdyno.tui.model import TopState
from bpfdyno.tui.widgets.table import Column, FastTable

DETECTION_COLUMNS = (
    Column("time", "TIME", 8, align="left"),
    Column("kind", "KIND", 9, align="left"),
    Column("job", "JOB", 8, align="left"),
    Column("rank", "RANK", 4),
    Column("host", "HOST", 10, align="left"),
    Column("pid", "PID", 7),
    Column("evidence", "EVIDENCE", 20, align="left", flex=True),
)
EMPTY = "no detection events: no rank stood out and no job hung"


def _key(e: DetectionEvent) -> tuple[float, str, str, str, int]:
    return (e.unix_seconds, e.host, e.kind.value, e.job_id, e.rank)


class DetectionView(Vertical):
    """Summary line, the standing ranks, the event table, the selected event's details."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._shown: tuple[DetectionEvent, ...] | None = None

    def compose(self) -> ComposeResult:
        """Summary, standing ranks, table, details."""
        yield Static("", id="detection-summary")
        yield Static("", id="detection-flags")
        yield FastTable(
            DETECTION_COLUMNS,
            format_row=event_cells,
            row_key=_key,
            row_style=lambda e: KIND_STYLE.get(e.kind, ""),
            empty_text=EMPTY,
            id="detection-table",
        )
        yield Static("", id="detection-detail")

    def update_view(self, state: TopState) -> None:
        """Show the newest events (only when they changed)."""
        table = self.query_one("#detection-table", FastTable)
        summary = self.query_one("#detection-summary", Static)
        flags_panel = self.query_one("#detection-flags", Static)
        if not state.detection_state.ok:
            table.empty_text = f"detection unavailable: {state.detection_state.reason}"
            table.set_items([])
            summary.update(Text(""))
            flags_panel.display = False
            self._shown = None
            return
        job = state.job_id
        events = tuple(e for e in state.detection if not job or e.job_id == job)
        if events == self._shown:
            return
        self._shown = events
        flags = flagged(events)
        table.empty_text = EMPTY
        table.set_items(list(reversed(events)))
        summary.update(Text(summary_line(flags, len(events)) + (f" · job {job}" if job else "")))
        flags_panel.display = bool(flags)
        text = Text()
        for f in flags.values():
            if text:
                text.append("\n")
            text.append(flag_line(f), style=f.style)
        flags_panel.update(text)
        self._show_detail()

    def _show_detail(self) -> None:
        item = self.query_one("#detection-table", FastTable).cursor_item
        detail = self.query_one("#detection-detail", Static)
        detail.display = isinstance(item, DetectionEvent)
        if isinstance(item, DetectionEvent):
            detail.update(Text(event_detail(item)))

    def on_fast_table_highlighted(self, event: FastTable.Highlighted) -> None:
        """The cursor moved: show that event's details."""
        self._show_detail()
