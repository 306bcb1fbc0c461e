"""The trace form: which processes, for how long, with which profiler options — then progress.

Submitting posts `TraceSubmitted`; the app sends the request and follows the trace, and
hands every new state back with `show_status`, so the form turns into a live list of the
traced processes and the files they wrote. Closing the form does not stop the trace: the
Trainers tab keeps showing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import ClassVar

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, RadioButton, RadioSet, Static

from bpfdyno.rpc.kernel_tracks import ALL, KERNEL_TRACKS, NONE
from bpfdyno.rpc.traces import (
    DEFAULT_DURATION_MS,
    DEFAULT_PROCESS_LIMIT,
    PROFILER_SWITCHES,
    TraceSpec,
)
from bpfdyno.tui.model import TraceProgress
from bpfdyno.tui.widgets.trainers import trace_summary, trace_table

#: Kernel track checkboxes: (checkbox id, track name); all are checked at first.
TRACKS = tuple((f"track-{name}", name) for name in KERNEL_TRACKS)
#: The amount the form suggests when switched to iterations.
DEFAULT_ITERATIONS = 5


class FormError(ValueError):
    """A form field is invalid; the message names it and says what to enter."""


#: What the empty log-file field means: the agent picks a fresh, timestamped name in the
#: user's own trace directory, which works on every host (docs/tracing.md#safety-rules).
LOG_FILE_PLACEHOLDER = "empty: a new file in /tmp/bpfdyno/<you>/"


def _positive_int(text: str, field: str, example: str) -> int:
    text = text.strip()
    if not text.isdigit() or int(text) <= 0:
        raise FormError(f"{field}: enter a whole number above 0, e.g. {example}")
    return int(text)


def parse_trace_form(
    pids: str,
    job_id: str,
    mode: str,
    amount: str,
    log_file: str,
    process_limit: str,
    options: Sequence[str] = (),
    kernel_tracks: Sequence[str] = KERNEL_TRACKS,
    pre_window: str = "",
) -> TraceSpec:
    """Build a trace request from the form's texts.

    Args:
        pids: process ids separated by spaces or commas (may be empty if ``job_id`` is set).
        job_id: a SLURM job id (may be empty if ``pids`` is set).
        mode: ``duration`` (``amount`` in ms) or ``iterations``.
        amount: the duration in ms or the number of iterations.
        log_file: absolute path of the trace file ending in ``.json``; empty: the agent
            picks a new name in the user's own trace directory.
        process_limit: most processes to trace.
        options: the TraceSpec option fields to turn on (``record_shapes``...).
        kernel_tracks: the kernel tracks to merge into the files (all of them: "all").
        pre_window: seconds of rare network events before the request ("" = the agent's
            default).

    Raises:
        FormError: the first invalid field, with what to enter instead.
    """
    pid_list: list[int] = []
    for word in pids.replace(",", " ").split():
        if not word.isdigit() or int(word) <= 0:
            raise FormError(f"PIDs: {word!r} is not a process id; enter numbers like 1234 5678")
        pid_list.append(int(word))
    job = job_id.strip()
    if job and not job.isdigit():
        raise FormError(f"Job id: {job!r} is not a SLURM job id; enter a number or leave it empty")
    if not pid_list and not job:
        raise FormError("enter at least one PID or a job id to choose what to trace")
    if mode not in ("duration", "iterations"):
        raise FormError(f"unknown mode {mode!r}: choose duration or iterations")
    n = _positive_int(amount, "Duration (ms)" if mode == "duration" else "Iterations", "500")
    path = log_file.strip()
    if path and not path.startswith("/"):
        raise FormError(
            "Log file: enter an absolute path such as ~/traces/t.json written out, or leave "
            "it empty for a new file in your own trace directory"
        )
    if path and not path.endswith(".json"):
        raise FormError(
            "Log file: end the name in .json, so each process writes its own <name>_<pid>.json"
        )
    limit = _positive_int(process_limit, "Process limit", "3")
    flags = {field: field in options for field, _, _ in PROFILER_SWITCHES}
    chosen = [t for t in KERNEL_TRACKS if t in kernel_tracks]
    tracks = ALL if len(chosen) == len(KERNEL_TRACKS) else ",".join(chosen) or NONE
    window: float | None = None
    if pre_window.strip():
        try:
            window = float(pre_window)
        except ValueError:
            window = -1.0
        if not 0 <= window <= 3600:
            raise FormError("Pre-window: enter seconds from 0 to 3600, or leave it empty")
    spec = TraceSpec(
        log_file=path,
        pids=tuple(pid_list),
        job_id=int(job or 0),
        process_limit=limit,
        kernel_tracks=tracks,
        pre_window_seconds=window,
        **flags,
    )
    return replace(spec, duration_ms=n) if mode == "duration" else replace(spec, iterations=n)


class TraceSubmitted(Message):
    """The form was filled in correctly; the app should send ``request``."""

    def __init__(self, request: TraceSpec) -> None:
        super().__init__()
        self.request = request


class TraceScreen(ModalScreen[None]):
    """The trace form, then the trace's progress.

    Args:
        pids: processes to prefill.
        job_id: job to prefill.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "close", "Close"),
        Binding("ctrl+s", "submit", "Start trace"),
    ]

    def __init__(self, pids: Sequence[int] = (), job_id: str = "") -> None:
        super().__init__()
        self._pids = " ".join(str(p) for p in pids)
        self._job_id = job_id
        self.submitted = False

    def compose(self) -> ComposeResult:
        """The form and the (hidden) progress panel."""
        with Vertical(id="trace-dialog"):
            yield Label("Trace PyTorch processes", id="trace-title")
            with Horizontal(classes="form-row"):
                yield Label("PIDs", classes="form-label")
                yield Input(self._pids, id="trace-pids", compact=True, placeholder="1234 5678")
                yield Label(" Job id ", classes="form-label-inline")
                yield Input(self._job_id, id="trace-job", compact=True, placeholder="none")
            with Horizontal(classes="form-row"):
                yield Label("Mode", classes="form-label")
                with RadioSet(id="trace-mode", compact=True):
                    yield RadioButton("duration ms", value=True, id="mode-duration", compact=True)
                    yield RadioButton("iterations", id="mode-iterations", compact=True)
                yield Label(" Amount ", classes="form-label-inline")
                yield Input(str(DEFAULT_DURATION_MS), id="trace-amount", compact=True)
            with Horizontal(classes="form-row"):
                yield Label("Log file", classes="form-label")
                yield Input("", id="trace-file", compact=True, placeholder=LOG_FILE_PLACEHOLDER)
            with Horizontal(classes="form-row"):
                yield Label("Limit", classes="form-label")
                yield Input(str(DEFAULT_PROCESS_LIMIT), id="trace-limit", compact=True)
                yield Label(" processes", classes="form-label-inline")
            with Horizontal(classes="form-row", id="trace-options"):
                yield Label("Options", classes="form-label")
                for _, word, _ in PROFILER_SWITCHES:
                    yield Checkbox(word, id=f"opt-{word}", compact=True)
            with Horizontal(classes="form-row", id="trace-tracks"):
                yield Label("Kernel", classes="form-label")
                for cid, name in TRACKS:
                    yield Checkbox(name, value=True, id=cid, compact=True)
            with Horizontal(classes="form-row"):
                yield Label("Before", classes="form-label")
                yield Input("", id="trace-prewindow", compact=True, placeholder="default")
                yield Label(
                    " s of rare network events before the request", classes="form-label-inline"
                )
            yield Static("", id="trace-error")
            yield Static("", id="trace-progress")
            with Horizontal(id="trace-buttons"):
                yield Button("Start (ctrl+s)", id="trace-start", variant="primary", compact=True)
                yield Button("Close (esc)", id="trace-close", compact=True)

    def on_mount(self) -> None:
        """Start in the first empty field."""
        self.query_one("#trace-progress", Static).display = False
        self.query_one("#trace-error", Static).display = False
        first = "#trace-pids" if not self._pids and not self._job_id else "#trace-amount"
        self.query_one(first, Input).focus()

    def on_radio_set_changed(self, event: RadioSet.Changed) -> None:
        """Switching mode puts that mode's default amount in the box."""
        amount = self.query_one("#trace-amount", Input)
        if event.pressed.id == "mode-iterations":
            amount.value = str(DEFAULT_ITERATIONS)
        else:
            amount.value = str(DEFAULT_DURATION_MS)

    def _mode(self) -> str:
        pressed = self.query_one("#trace-mode", RadioSet).pressed_button
        iterations = pressed is not None and pressed.id == "mode-iterations"
        return "iterations" if iterations else "duration"

    def action_submit(self) -> None:
        """Check the form and, if it is right, ask the app to send the request."""
        if self.submitted:
            return
        try:
            request = parse_trace_form(
                pids=self.query_one("#trace-pids", Input).value,
                job_id=self.query_one("#trace-job", Input).value,
                mode=self._mode(),
                amount=self.query_one("#trace-amount", Input).value,
                log_file=self.query_one("#trace-file", Input).value,
                process_limit=self.query_one("#trace-limit", Input).value,
                options=[
                    field
                    for field, word, _ in PROFILER_SWITCHES
                    if self.query_one(f"#opt-{word}", Checkbox).value
                ],
                kernel_tracks=[n for cid, n in TRACKS if self.query_one(f"#{cid}", Checkbox).value],
                pre_window=self.query_one("#trace-prewindow", Input).value,
            )
        except FormError as e:
            self.show_error(str(e))
            return
        self.submitted = True
        self.query_one("#trace-start", Button).disabled = True
        self.show_error("")
        self._progress(Text("sending the request...", style="dim"))
        self.post_message(TraceSubmitted(request))

    def on_button_pressed(self, event: Button.Pressed) -> None:
        """Start or close."""
        if event.button.id == "trace-start":
            self.action_submit()
        else:
            self.action_close()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        """Enter in any box starts the trace."""
        self.action_submit()

    def action_close(self) -> None:
        """Close the form (a running trace goes on; the Trainers tab follows it)."""
        self.dismiss(None)

    def show_error(self, message: str) -> None:
        """Show why the form or the request was refused (empty clears it)."""
        error = self.query_one("#trace-error", Static)
        error.update(Text(message, style="bold red"))
        error.display = bool(message)
        if message and self.submitted:
            # Refused by the agent: let the user fix the form and try again.
            self.submitted = False
            self.query_one("#trace-start", Button).disabled = False

    def show_status(self, progress: TraceProgress) -> None:
        """Show the trace's newest state: per process, where its file is."""
        self._progress(Group(trace_summary(progress), trace_table(progress)))

    def _progress(self, renderable: Text | Group) -> None:
        panel = self.query_one("#trace-progress", Static)
        panel.display = True
        panel.update(renderable)
