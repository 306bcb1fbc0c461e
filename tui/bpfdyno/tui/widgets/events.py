"""The Events tab: a live list of kernel and GPU events, newest first, with counts per kind."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Input, Static

from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.tui.model import TopState
from bpfdyno.tui.widgets.table import Column, FastTable

EVENT_COLUMNS = (
    Column("time", "TIME", 12, align="left"),
    Column("kind", "KIND", 18, align="left"),
    Column("pid", "PID", 7),
    Column("comm", "COMM", 14, align="left"),
    Column("detail", "DETAIL", 20, align="left", flex=True),
)
#: Colours by kind prefix: the events an engineer looks for first stand out.
KIND_STYLE = {
    "tcp_retransmit": "yellow",
    "tcp_reset": "red",
    "drop": "magenta",
    "gpu_": "bold red",
    "events_lost": "bold red",
}


def event_time(unix_ns: int) -> str:
    """Local ``HH:MM:SS.mmm`` of an epoch-ns time."""
    secs, ns = divmod(unix_ns, 1_000_000_000)
    return time.strftime("%H:%M:%S", time.localtime(secs)) + f".{ns // 1_000_000:03d}"


def _cells(ev: KernelEvent) -> Sequence[str]:
    return [event_time(ev.unix_ns), ev.kind, str(ev.pid) if ev.pid else "-", ev.comm, ev.detail()]


def _style(ev: KernelEvent) -> str:
    for prefix, style in KIND_STYLE.items():
        if ev.kind.startswith(prefix):
            return style
    return ""


class EventsView(Vertical):
    """Counts line, filter box and the event list."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "focus_filter", "Filter"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._words: list[str] = []
        self._state: TopState | None = None
        self._shown_generation = -1

    def compose(self) -> ComposeResult:
        """Counts, filter, table."""
        yield Static("", id="event-counts")
        yield Input(placeholder="/ filter: kind, comm or detail words", id="event-filter")
        yield FastTable(
            EVENT_COLUMNS,
            format_row=_cells,
            row_key=lambda ev: (ev.unix_ns, ev.kind, ev.pid, ev.tid),
            row_style=_style,
            empty_text="no events yet",
            id="event-table",
        )

    def update_view(self, state: TopState) -> None:
        """Show the newest events (only when something changed)."""
        self._state = state
        log = state.events
        if log.generation == self._shown_generation and state.events_state.ok:
            return
        self._shown_generation = log.generation
        table = self.query_one("#event-table", FastTable)
        counts = self.query_one("#event-counts", Static)
        if not state.events_state.ok and not log.events:
            table.empty_text = f"kernel events unavailable: {state.events_state.reason}"
            table.set_items([])
            counts.update(Text(""))
            return
        events = log.newest_first()
        if self._words:
            events = [e for e in events if all(w in _haystack(e) for w in self._words)]
        table.empty_text = "no event matches the filter" if log.events else "no events yet"
        table.set_items(events)
        text = Text()
        for kind, n in sorted(log.counts.items()):
            if text:
                text.append(" · ")
            text.append(kind, style=_style(KernelEvent(0, kind)) or "bold")
            text.append(f" {n}")
        if not state.events_state.ok:
            text.append(f" · stream stopped: {state.events_state.reason}", style="yellow")
        counts.update(text or Text("no events yet", style="dim"))

    def action_focus_filter(self) -> None:
        """Put the cursor in the filter box."""
        self.query_one("#event-filter", Input).focus()

    def action_clear_filter(self) -> None:
        """Empty the filter and go back to the list."""
        self.query_one("#event-filter", Input).value = ""
        self.query_one("#event-table", FastTable).focus()

    def on_input_changed(self, event: Input.Changed) -> None:
        """Filter as the words are typed."""
        self._words = event.value.lower().split()
        self._shown_generation = -1
        if self._state is not None:
            self.update_view(self._state)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter goes back to the list."""
        self.query_one("#event-table", FastTable).focus()


def _haystack(ev: KernelEvent) -> str:
    return f"{ev.kind} {ev.comm} {ev.pid} {ev.detail()}".lower()
