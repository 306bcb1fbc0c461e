"""Pure derived data for the UI: metric history, a process's history, event log, app state.

Nothing here does I/O or touches a widget, so every rule is testable with hand-made records.
The app owns one `TopState`; messages from the data workers update it and the refresh tick
renders the visible view from it. Processes are sorted and filtered with the agent's own
rules and words (`bpfdyno.rpc.processes`), so ``bpfdyno ps`` and the UI agree.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bpfdyno.rpc.agent import AgentStatus, MetricSpec, MetricsSnapshot, Series
from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import ProcessList
from bpfdyno.rpc.traces import TraceStart, TraceStatus, Trainer, words
from bpfdyno.tui.fmt import fmt_value, unit_from_name

NAN = float("nan")
#: Label pairs of one series, sorted by name.
Labels = tuple[tuple[str, str], ...]


#: The label the agent adds to a series while its value is an estimate (the overhead budget
#: sampled its source); the view keeps such points in the series itself, marked.
ESTIMATE_LABEL = "estimate"
#: What precedes a value shown from an estimate.
ESTIMATE_MARK = "~"


def _norm(labels: Iterable[tuple[str, str]]) -> Labels:
    # Label order differs between producers; lookups should not care.
    return tuple(sorted(labels))


class MetricsModel:
    """Latest value and a short history of every series the agent streams.

    Args:
        history_points: points kept per series (the sparklines' width at most).
        stale_after_s: a series whose last point is older than this, relative to the newest
            round seen, counts as gone (a removed NIC, a lost GPU).
        max_series: most series kept; beyond it new series are ignored, so a runaway label
            cannot grow memory without bound.
    """

    def __init__(
        self, history_points: int = 120, stale_after_s: float = 10.0, max_series: int = 20_000
    ) -> None:
        self.history_points = history_points
        self.stale_after_s = stale_after_s
        self.max_series = max_series
        self.specs: dict[str, MetricSpec] = {}
        self.now = 0.0
        self._series: dict[str, dict[Labels, deque[tuple[float, float]]]] = {}
        #: (name, labels) of the series whose newest point is an estimate.
        self._estimated: set[tuple[str, Labels]] = set()
        self._count = 0

    def set_specs(self, specs: Iterable[MetricSpec]) -> None:
        """Replace the metric declarations (units) with the agent's."""
        self.specs = {s.name: s for s in specs}

    def unit(self, name: str) -> str:
        """The unit of a metric from its spec, else guessed from its name."""
        spec = self.specs.get(name)
        return spec.unit if spec is not None and spec.unit else unit_from_name(name)

    def show(self, name: str, labels: Iterable[tuple[str, str]] = ()) -> str:
        """The newest value of a series as text, in the unit its spec declares; marked
        `ESTIMATE_MARK` while it is an estimate."""
        text = fmt_value(self.latest(name, labels), self.unit(name))
        if self.estimated(name, labels) and not math.isnan(self.latest(name, labels)):
            return ESTIMATE_MARK + text
        return text

    def estimated(self, name: str, labels: Iterable[tuple[str, str]] = ()) -> bool:
        """Whether the newest value of the series is an estimate."""
        return (name, _norm(labels)) in self._estimated

    def clear(self) -> None:
        """Forget every series (after reconnecting to a restarted agent)."""
        self._series.clear()
        self._estimated.clear()
        self._count = 0
        self.now = 0.0

    def _append(self, name: str, labels: Labels, ts: float, value: float, estimate: bool) -> None:
        by_labels = self._series.get(name)
        if by_labels is None:
            by_labels = self._series[name] = {}
        points = by_labels.get(labels)
        if points is None:
            if self._count >= self.max_series:
                return
            points = by_labels[labels] = deque(maxlen=self.history_points)
            self._count += 1
        if points and ts <= points[-1][0]:
            if ts < points[0][0] or any(t == ts for t, _ in points):
                return  # a window overlapping the stream: keep each timestamp once
            # A window's estimated stretch comes as a series of its own, after the exact
            # one: its points go between the exact ones.
            ordered = sorted([*points, (ts, value)])
            points.clear()
            points.extend(ordered)
            return
        points.append((ts, value))
        if estimate:
            self._estimated.add((name, labels))
        else:
            self._estimated.discard((name, labels))

    def apply_window(self, series: Iterable[Series]) -> None:
        """Add the points of each series (a window query's, or a streamed round's), older
        points first. A series the agent labels as an estimate is kept as the same series
        without that label (its newest value then shows as one)."""
        for s in series:
            pairs = [(k, v) for k, v in s.labels if k != ESTIMATE_LABEL]
            estimate = len(pairs) < len(s.labels)
            labels = _norm(pairs)
            for ts, value in s.points:
                if not math.isnan(value):
                    self._append(s.name, labels, ts, value, estimate)
                    self.now = max(self.now, ts)

    def apply_round(self, rnd: MetricsSnapshot) -> None:
        """Add one streamed collection round (one point per series)."""
        self.apply_window(rnd.series)
        self.now = max(self.now, rnd.unix_seconds)

    def _fresh(self, points: deque[tuple[float, float]]) -> bool:
        return bool(points) and points[-1][0] >= self.now - self.stale_after_s

    def latest(self, name: str, labels: Iterable[tuple[str, str]] = ()) -> float:
        """The newest value of the series, NaN if absent or stale."""
        points = self._series.get(name, {}).get(_norm(labels))
        if points is None or not self._fresh(points):
            return NAN
        return points[-1][1]

    def history(self, name: str, labels: Iterable[tuple[str, str]] = ()) -> list[float]:
        """The kept values of the series, oldest first (empty if absent)."""
        points = self._series.get(name, {}).get(_norm(labels))
        return [v for _, v in points] if points else []

    def series(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        """Fresh series of ``name`` whose labels include ``match``: (labels, latest value)."""
        out = []
        for labels, points in self._series.get(name, {}).items():
            if not self._fresh(points):
                continue
            d = dict(labels)
            if all(d.get(k) == v for k, v in match.items()):
                out.append((d, points[-1][1]))
        return out

    def label_values(self, name: str, label: str) -> list[str]:
        """Distinct values of ``label`` among the fresh series of ``name``, naturally sorted."""
        values = {d[label] for d, _ in self.series(name) if label in d}
        return sorted(values, key=natural_key)

    def names(self, prefix: str = "") -> list[str]:
        """Metric names with at least one series, optionally by prefix."""
        return sorted(n for n in self._series if n.startswith(prefix))


def natural_key(text: str) -> tuple[int, int | str]:
    """Sort key putting numbers in numeric order before words: 0, 2, 10, total."""
    return (0, int(text)) if text.isdigit() else (1, text)


# -- processes ---------------------------------------------------------------------------


class ProcessHistory:
    """A few values of one process over successive tables, for the detail view."""

    def __init__(self, pid: int, points: int = 120) -> None:
        self.pid = pid
        self.cpu: deque[float] = deque(maxlen=points)
        self.rss: deque[float] = deque(maxlen=points)
        self.net: deque[float] = deque(maxlen=points)
        self._last_ts = 0.0

    def add(self, table: ProcessList) -> None:
        """Record the process's values from ``table`` (NaN when it is not in it)."""
        if table.unix_seconds <= self._last_ts:
            return
        self._last_ts = table.unix_seconds
        row = next((r for r in table.processes if r.pid == self.pid), None)
        if row is None:
            self.cpu.append(NAN)
            self.rss.append(NAN)
            self.net.append(NAN)
            return
        self.cpu.append(row.cpu_ratio)
        self.rss.append(float(row.rss_bytes))
        self.net.append(row.tcp_tx_bytes_per_second + row.tcp_rx_bytes_per_second)


# -- events ------------------------------------------------------------------------------


class EventLog:
    """The newest kernel events, newest last, plus a count per kind since connecting."""

    def __init__(self, maxlen: int = 1000) -> None:
        self.events: deque[KernelEvent] = deque(maxlen=maxlen)
        self.counts: Counter[str] = Counter()
        self.generation = 0

    def add(self, events: Iterable[KernelEvent]) -> None:
        """Append events (in arrival order)."""
        for ev in events:
            self.events.append(ev)
            self.counts[ev.kind] += 1
        self.generation += 1

    def clear(self) -> None:
        """Forget everything."""
        self.events.clear()
        self.counts.clear()
        self.generation += 1

    def newest_first(self, kinds: Sequence[str] = ()) -> list[KernelEvent]:
        """Events by time, newest first, optionally only of ``kinds`` (prefixes work).

        Sorted by timestamp, not arrival: collectors deliver in batches, so a network event
        can arrive after a scheduler event that happened later.
        """
        out = sorted(self.events, key=lambda e: e.unix_ns, reverse=True)
        if kinds:
            return [e for e in out if any(e.kind.startswith(k) for k in kinds)]
        return out


# -- a trace request ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TraceLine:
    """One process of a trace as the UI lists it.

    Attributes:
        pid: the process.
        state: its state in words (``timed out``), or why it was not triggered (``busy``,
            ``over limit``, ``not matched``).
        path: the file it writes ("" for one not triggered).
        size_bytes: the written file's size; None until written.
        message: why it is in this state.
        kernel_tracks: its kernel tracks in words ("" when none were asked for).
    """

    pid: int
    state: str
    path: str = ""
    size_bytes: int | None = None
    message: str = ""
    kernel_tracks: str = ""


@dataclass(frozen=True, slots=True)
class TraceProgress:
    """A trace request as the UI follows it: what ``StartTrace`` answered, then the newest
    state the agent reported."""

    start: TraceStart
    status: TraceStatus | None = None

    @property
    def finished(self) -> bool:
        """Nothing will change any more (every process ended, or none was triggered)."""
        return self.status.done if self.status is not None else not self.start.triggered

    @property
    def state(self) -> str:
        """``started``, ``nothing traced``, then ``running``, ``done``, ``partly done``,
        ``failed``."""
        if self.status is not None:
            return self.status.outcome
        return "started" if self.start.triggered else "nothing traced"

    @property
    def message(self) -> str:
        """Counts, in words ("2 written, 1 in progress"), or why nothing was traced."""
        return self.status.summary() if self.status is not None else self.start.summary()

    def lines(self) -> list[TraceLine]:
        """Each triggered process, then the ones that were not, and why.

        Every registered trainer is listed with why it did not match only when nothing was
        triggered, so the user can correct the request.
        """
        start = self.start
        if self.status is not None:
            out = [
                TraceLine(
                    p.pid,
                    words(p.state),
                    p.output_path,
                    p.size_bytes if p.size_bytes >= 0 else None,
                    p.reason,
                    p.kernel_tracks.describe(),
                )
                for p in self.status.processes
            ]
        else:
            out = [TraceLine(p.pid, "pending", p.output_path) for p in start.triggered]
        skipped = [("busy", start.busy), ("over limit", start.over_limit)]
        if not start.triggered:
            skipped.append(("not matched", start.not_matched))
        for state, items in skipped:
            out += [TraceLine(p.pid, state, message=p.reason) for p in items]
        return out


# -- the whole state -----------------------------------------------------------------------


@dataclass
class Availability:
    """Whether a part of the agent's API answered, and if not, why."""

    ok: bool = False
    reason: str = "not asked yet"

    def set_ok(self) -> None:
        """Mark the part as answering."""
        self.ok, self.reason = True, ""

    def set_unavailable(self, reason: str) -> None:
        """Mark the part as not answering, with the reason shown in its panel."""
        self.ok, self.reason = False, reason


@dataclass
class Connection:
    """The link to the agent as the status bar shows it."""

    target: str
    connected: bool = False
    message: str = "connecting..."
    reconnects: int = 0
    agent_started_ts: float = 0.0


@dataclass
class TopState:
    """Everything the views render, updated only on the app's loop."""

    connection: Connection
    job_id: str = ""
    metrics: MetricsModel = field(default_factory=MetricsModel)
    status: AgentStatus | None = None
    processes: ProcessList | None = None
    processes_state: Availability = field(default_factory=Availability)
    trainers: tuple[Trainer, ...] = ()
    trainers_state: Availability = field(default_factory=Availability)
    events: EventLog = field(default_factory=EventLog)
    events_state: Availability = field(default_factory=Availability)
    #: The detection events the agent holds, oldest first.
    detection: tuple[DetectionEvent, ...] = ()
    detection_state: Availability = field(default_factory=Availability)
    last_trace: TraceProgress | None = None
