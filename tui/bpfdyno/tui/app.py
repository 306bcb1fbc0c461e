"""`bpfdyno top`: the live terminal UI over one agent.

Data flows one way. Async workers on the app's loop talk to the `DataSource` — a connection
loop (status, metric specs, history, then the metrics stream; on loss it says so and retries
with back-off), an event stream, and polls of the process table, trainers and status — and
post messages. Message handlers update the `TopState`; a refresh tick (1 Hz by default)
renders only what is on screen. No handler waits on I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar

from textual import work
from textual.app import App, ComposeResult, ScreenStackError
from textual.binding import Binding, BindingType
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent, TabPane

from bpfdyno.client.errors import AgentError
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.datasource import AgentDataSource, DataSource, stream_ended
from bpfdyno.tui.fmt import fmt_clock
from bpfdyno.tui.messages import (
    Connected,
    ConnectionLost,
    DetectionUpdated,
    EventsReceived,
    MetricsHistory,
    MetricsReceived,
    OpenProcess,
    OpenTraceForm,
    PartUnavailable,
    ProcessesUpdated,
    StatusUpdated,
    TraceFailed,
    TraceUpdated,
    TrainersUpdated,
)
from bpfdyno.tui.model import Connection, TopState, TraceProgress
from bpfdyno.tui.recorded import RecordedDataSource, RecordingError
from bpfdyno.tui.screens.help import HelpScreen
from bpfdyno.tui.screens.process import ProcessScreen
from bpfdyno.tui.screens.trace import TraceScreen, TraceSubmitted
from bpfdyno.tui.widgets.agent import AgentView
from bpfdyno.tui.widgets.detection import DetectionView
from bpfdyno.tui.widgets.events import EventsView
from bpfdyno.tui.widgets.overview import OverviewView
from bpfdyno.tui.widgets.processes import ProcessesView
from bpfdyno.tui.widgets.status_bar import StatusBar
from bpfdyno.tui.widgets.trainers import TrainersView


class TopTabs(TabbedContent):
    """The tabs, switched only by the user (keys, clicks), never by where focus lands.

    TabbedContent makes the pane of a programmatically focused widget the active one. The
    list focused after a switch ("2") could then land after the next switch ("3") and take
    the tabs back to its own pane: the user typed "2" then "3" and saw the processes.
    """

    def _on_tab_pane_focused(self, event: TabPane.Focused) -> None:
        event.prevent_default()  # the base class's handler is the one that switches
        event.stop()


TABS = ("overview", "processes", "trainers", "events", "agent", "detection")
#: Seconds of metric history fetched after connecting (the sparklines' memory).
HISTORY_S = 120.0
#: How long "reconnected" stays in the status bar.
NOTICE_S = 10.0


class TopApp(App[int]):
    """The UI over one data source.

    Args:
        source: where the data comes from.
        job_id: show only this SLURM job's processes and trainers.
        refresh_s: seconds between screen refreshes and polls.
        process_limit: most processes asked of the agent per poll.
        retry_s: first and longest wait between reconnection attempts.
        clock: wall clock, injectable so screenshots of time-dependent text are stable.
    """

    CSS_PATH = "app.tcss"
    TITLE = "bpfdyno top"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "tab('overview')", "Overview", show=False),
        Binding("2", "tab('processes')", "Processes", show=False),
        Binding("3", "tab('trainers')", "Trainers", show=False),
        Binding("4", "tab('events')", "Events", show=False),
        Binding("5", "tab('agent')", "Agent", show=False),
        Binding("6", "tab('detection')", "Detection", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(
        self,
        source: DataSource,
        *,
        job_id: str = "",
        refresh_s: float = 1.0,
        process_limit: int = 500,
        retry_s: tuple[float, float] = (0.5, 5.0),
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self.source = source
        self.refresh_s = refresh_s
        self.process_limit = process_limit
        self.retry_s = retry_s
        self.clock = clock
        self.state = TopState(Connection(source.target), job_id=job_id)
        self._in_flight: set[str] = set()
        self._notice_until = 0.0

    def compose(self) -> ComposeResult:
        """Status bar, the six tabs, the key footer."""
        yield StatusBar(id="status-bar")
        with TopTabs(initial="overview", id="tabs"):
            with TabPane("1 Overview", id="overview"):
                yield OverviewView(id="overview-view")
            with TabPane("2 Processes", id="processes"):
                yield ProcessesView(id="processes-view")
            with TabPane("3 Trainers", id="trainers"):
                yield TrainersView(id="trainers-view")
            with TabPane("4 Events", id="events"):
                yield EventsView(id="events-view")
            with TabPane("5 Agent", id="agent"):
                yield AgentView(id="agent-view")
            with TabPane("6 Detection", id="detection"):
                yield DetectionView(id="detection-view")
        yield Footer()

    def on_mount(self) -> None:
        """Start fetching data and the refresh tick."""
        # Held, not queried: App.query_one searches the active screen, which is a modal
        # (help, trace form) or a detail screen while those are open.
        self._bar = self.query_one(StatusBar)
        self._tabs = self.query_one("#tabs", TabbedContent)
        self._views = {tab: self.query_one(f"#{tab}-view") for tab in TABS}
        self.render_views()
        self.start_data()
        self.set_interval(self.refresh_s, self._tick)

    def start_data(self) -> None:
        """Start the workers that fetch the agent's data (the connection loop)."""
        self._connection_loop()

    # -- rendering ---------------------------------------------------------------------

    def _top_screen(self) -> Screen[object] | None:
        """The screen on top, None while the app shuts down (the stack is empty then)."""
        try:
            return self.screen
        except ScreenStackError:
            return None

    @property
    def active_tab(self) -> str:
        """The id of the tab on screen."""
        return str(self._tabs.active)

    def render_views(self) -> None:
        """Render the status bar, the visible tab, and a detail screen if one is open."""
        if not self._bar.is_attached:
            return  # shutting down: the widgets are being removed
        state = self.state
        if self._notice_until and self.clock() > self._notice_until:
            self._notice_until = 0.0
            state.connection.message = ""
        self._bar.update_view(state)
        view = self._views.get(self.active_tab)
        update = getattr(view, "update_view", None)
        if update is not None:
            update(state)
        screen = self._top_screen()
        if isinstance(screen, ProcessScreen):
            screen.update_view(state)

    def _tick(self) -> None:
        if self.state.connection.connected:
            self._poll_all()
        self.render_views()

    def _poll_all(self) -> None:
        tab = self.active_tab
        self._poll("status", self._fetch_status)
        if tab in ("processes", "trainers") or isinstance(self._top_screen(), ProcessScreen):
            self._poll("processes", self._fetch_processes)
        if tab == "trainers" or isinstance(self._top_screen(), TraceScreen):
            self._poll("trainers", self._fetch_trainers)
        if tab in ("trainers", "detection"):  # the trainers' rows mark the ranks that stand out
            self._poll("detection", self._fetch_detection)

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        """Render the new tab at once, fetch what it needs, and focus its list."""
        if self.state.connection.connected:
            self._poll_all()
        self.render_views()
        if event.pane is not None and event.pane.id is not None:
            # After the switch has settled: the pane's widgets are shown only then.
            self.call_later(self._focus_list, event.pane.id)

    def _focus_list(self, tab: str) -> None:
        """Focus the list of `tab` if it is still the tab on screen (keys typed back to
        back may have switched on already)."""
        if self.active_tab != tab:
            return
        lists = self._tabs.get_pane(tab).query("FastTable, VerticalScroll")
        if lists:
            target = lists.first()
            # On the screen holding the tabs: a detail screen opened meanwhile keeps its own.
            target.screen.set_focus(target)

    def action_tab(self, tab: str) -> None:
        """Show one of the tabs."""
        self._tabs.active = tab

    def action_help(self) -> None:
        """Open the key help."""
        self.push_screen(HelpScreen())

    # -- workers -------------------------------------------------------------------------

    @work(exclusive=True, group="connection")
    async def _connection_loop(self) -> None:
        """Connect, stream metrics until the agent goes away, say so, retry with back-off."""
        first, longest = self.retry_s
        delay, attempt = first, 0
        while True:
            try:
                status = await self.source.status()
                specs = await self.source.metric_specs()
                self.post_message(Connected(status, specs))
                history = await self.source.metrics_window([], HISTORY_S)
                self.post_message(MetricsHistory(history))
                delay, attempt = first, 0
                async for rnd in self.source.stream_metrics():
                    self.post_message(MetricsReceived(rnd))
                raise stream_ended(self.source.target, "metrics")
            except AgentError as e:
                attempt += 1
                self.post_message(ConnectionLost(str(e), delay, attempt))
                await asyncio.sleep(delay)
                delay = min(delay * 2, longest)

    @work(exclusive=True, group="events")
    async def _events_stream(self) -> None:
        """Follow the kernel event stream until it or the agent goes away."""
        try:
            async for ev in self.source.stream_events():
                self.post_message(EventsReceived((ev,)))
        except AgentError as e:
            self.post_message(PartUnavailable("events", str(e)))

    def _poll(self, name: str, fetch: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``fetch`` unless the previous one is still running (no pile-up when slow)."""
        if name in self._in_flight:
            return
        self._in_flight.add(name)

        async def run() -> None:
            try:
                await fetch()
            finally:
                self._in_flight.discard(name)

        self.run_worker(run(), group=f"poll-{name}")

    async def _fetch_status(self) -> None:
        with contextlib.suppress(AgentError):  # the connection loop reports a lost agent
            self.post_message(StatusUpdated(await self.source.status()))

    async def _fetch_processes(self) -> None:
        try:
            table = await self.source.processes(self.process_limit, self.state.job_id)
        except AgentError as e:
            if not e.kind.disconnected:  # a lost agent: the connection loop says so
                self.post_message(PartUnavailable("processes", str(e)))
            return
        self.post_message(ProcessesUpdated(table))

    async def _fetch_trainers(self) -> None:
        try:
            trainers = await self.source.trainers()
        except AgentError as e:
            if not e.kind.disconnected:
                self.post_message(PartUnavailable("trainers", str(e)))
            return
        self.post_message(TrainersUpdated(trainers))

    async def _fetch_detection(self) -> None:
        try:
            events = await self.source.detection_events(self.state.job_id)
        except AgentError as e:
            if not e.kind.disconnected:
                self.post_message(PartUnavailable("detection", str(e)))
            return
        self.post_message(DetectionUpdated(events))

    @work(exclusive=True, group="trace")
    async def _follow_trace(self, request: TraceSpec) -> None:
        """Send a trace request and follow it until every process is done."""
        try:
            start = await self.source.start_trace(request)
            self.post_message(TraceUpdated(TraceProgress(start)))
            if not start.triggered:
                return
            async for status in self.source.watch_trace(start.trace_id):
                self.post_message(TraceUpdated(TraceProgress(start, status)))
                if status.done:
                    return
        except AgentError as e:
            self.post_message(TraceFailed(str(e)))

    # -- message handlers ------------------------------------------------------------------

    def on_connected(self, msg: Connected) -> None:
        """The agent answered: note a restart, take its units, start the event stream."""
        conn = self.state.connection
        started = msg.status.started_unix_seconds
        previous = conn.agent_started_ts
        restarted = bool(previous) and started != previous
        if restarted:
            conn.message = f"reconnected: the agent restarted at {fmt_clock(started)}"
        elif not conn.connected and conn.reconnects:
            conn.message = "reconnected"
        else:
            conn.message = ""
        if conn.message:
            self._notice_until = self.clock() + NOTICE_S
        conn.connected = True
        conn.reconnects += 1
        conn.agent_started_ts = started
        self.state.status = msg.status
        self.state.metrics.set_specs(msg.specs)
        self.state.events_state.set_ok()
        self._events_stream()
        self._poll_all()
        self.render_views()

    def on_connection_lost(self, msg: ConnectionLost) -> None:
        """Say why the agent is unreachable and when the next attempt is."""
        conn = self.state.connection
        conn.connected = False
        conn.message = f"{msg.reason} · retrying in {msg.retry_in_s:.1f}s (attempt {msg.attempt})"
        self._notice_until = 0.0
        self.render_views()

    def on_metrics_history(self, msg: MetricsHistory) -> None:
        """Seed the sparklines."""
        self.state.metrics.apply_window(msg.series)

    def on_metrics_received(self, msg: MetricsReceived) -> None:
        """Take one round (rendered on the next tick)."""
        self.state.metrics.apply_round(msg.round)

    def on_status_updated(self, msg: StatusUpdated) -> None:
        """Take the newest status."""
        self.state.status = msg.status

    def on_processes_updated(self, msg: ProcessesUpdated) -> None:
        """Take the newest process table and show it if it is on screen."""
        self.state.processes = msg.table
        self.state.processes_state.set_ok()
        if self.active_tab == "processes" or isinstance(self._top_screen(), ProcessScreen):
            self.render_views()

    def on_trainers_updated(self, msg: TrainersUpdated) -> None:
        """Take the newest trainer list."""
        self.state.trainers = msg.trainers
        self.state.trainers_state.set_ok()
        if self.active_tab == "trainers":
            self.render_views()

    def on_detection_updated(self, msg: DetectionUpdated) -> None:
        """Take the newest detection events and show them if they are on screen."""
        self.state.detection = msg.events
        self.state.detection_state.set_ok()
        if self.active_tab in ("trainers", "detection"):
            self.render_views()

    def on_events_received(self, msg: EventsReceived) -> None:
        """Append events (rendered on the next tick)."""
        self.state.events.add(msg.events)

    def on_part_unavailable(self, msg: PartUnavailable) -> None:
        """Mark a part of the API as not served; its panel shows the reason."""
        part = {
            "processes": self.state.processes_state,
            "trainers": self.state.trainers_state,
            "events": self.state.events_state,
            "detection": self.state.detection_state,
        }[msg.part]
        part.set_unavailable(msg.reason)
        if msg.part == "processes":
            self.state.processes = None
        self.render_views()

    def on_open_trace_form(self, msg: OpenTraceForm) -> None:
        """Open the trace form, prefilled."""
        self.push_screen(TraceScreen(msg.pids, msg.job_id))

    def on_open_process(self, msg: OpenProcess) -> None:
        """Open a process's details."""
        self.push_screen(ProcessScreen(msg.pid))
        self._poll("processes", self._fetch_processes)

    def on_trace_submitted(self, msg: TraceSubmitted) -> None:
        """Send the request and follow it."""
        self._follow_trace(msg.request)

    def on_trace_updated(self, msg: TraceUpdated) -> None:
        """Show a trace's progress in the form (if open) and in the Trainers tab."""
        self.state.last_trace = msg.progress
        screen = self._top_screen()
        if isinstance(screen, TraceScreen):
            screen.show_status(msg.progress)
        self.render_views()

    def on_trace_failed(self, msg: TraceFailed) -> None:
        """Say why a trace request failed, where the user is looking."""
        screen = self._top_screen()
        if isinstance(screen, TraceScreen):
            screen.show_error(msg.reason)
        else:
            self.notify(msg.reason, title="trace failed", severity="error", timeout=10)

    async def on_unmount(self) -> None:
        """Release the data source."""
        await self.source.close()


def run_top(
    target: str | None,
    job_id: str | None = None,
    *,
    replay: Path | None = None,
    speed: float = 1.0,
    pod: str = "",
) -> int:
    """Run the UI until the user quits; the `bpfdyno top` command.

    Args:
        target: the agent (a Unix socket path or ``host:port``); None means the default
            (``$BPFDYNO_TARGET`` or the standard socket).
        job_id: show only this SLURM job's processes and trainers.
        replay: replay this recording instead of connecting (demos).
        speed: replay speed.
        pod: show only this Kubernetes pod's processes and trainers (not in a replay).

    Returns:
        The process exit status: 0 after a normal quit, 2 for an unreadable recording.
    """
    from bpfdyno.client.connection import default_target

    source: DataSource
    if replay is not None:
        try:
            source = RecordedDataSource.from_file(replay, speed=speed)
        except RecordingError as e:
            print(f"bpfdyno top: {e}", file=sys.stderr)
            return 2
    else:
        source = AgentDataSource(target or default_target(), pod=pod)
    result = TopApp(source, job_id=job_id or "").run()
    return result if isinstance(result, int) else 0
