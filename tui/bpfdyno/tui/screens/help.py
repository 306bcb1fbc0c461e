"""The keyboard help: every key the UI answers to, one screen."""

from __future__ import annotations

from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

#: (keys, what they do), grouped by where they work.
KEYS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "Everywhere",
        (
            ("1-6", "Overview Processes Trainers Events Agent Detection"),
            ("?", "this help"),
            ("q / ctrl+c", "quit"),
        ),
    ),
    (
        "Lists",
        (
            ("up/down, pgup/pgdn", "move the cursor"),
            ("home/end", "first / last row"),
            ("/ ; esc", "filter ; clear the filter"),
        ),
    ),
    (
        "Processes",
        (
            ("s / S", "sort by the next / previous column"),
            ("r", "reverse the sort"),
            ("click a title", "sort by it (again: reverse)"),
            ("enter", "details of the process"),
            ("t", "trace the process"),
        ),
    ),
    (
        "Trainers",
        (
            ("t", "trace the selected trainer"),
            ("T", "trace every trainer of its job"),
        ),
    ),
    (
        "Trace form",
        (
            ("tab", "next field"),
            ("enter / ctrl+s", "start the trace"),
            ("esc", "close (the trace goes on)"),
        ),
    ),
    ("Filter", (("words", "match command; pid= user= comm= job= container= cgroup="),)),
)


class HelpScreen(ModalScreen[None]):
    """The key table; any of escape, q or ? closes it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("q", "close", "Close", show=False),
        Binding("question_mark", "close", "Close", show=False),
    ]

    def compose(self) -> ComposeResult:
        """The key table in a scrollable box."""
        table = Table(box=None, show_header=False, pad_edge=False, expand=True)
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column(ratio=1)
        for group, keys in KEYS:
            table.add_row(f"[b]{group}[/b]", "", style="underline")
            for key, what in keys:
                table.add_row(key, what)
        with VerticalScroll(id="help-dialog"):
            yield Static("bpfdyno top — keys (esc closes)", id="help-title")
            yield Static(table)

    def action_close(self) -> None:
        """Back to where the help was opened."""
        self.dismiss(None)
