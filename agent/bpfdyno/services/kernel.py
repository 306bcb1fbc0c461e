"""The transport-free façade over the kernel's view: processes, connections, events.

The gRPC servicer (`bpfdyno.server.kernel`) and any other front end translate to these
calls. Domain errors are `bpfdyno.core.errors`: `InvalidArgument` (the caller asked for
something malformed) and `Unavailable` (the data source is not running here).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from bpfdyno.core.errors import InvalidArgument, Unavailable
from bpfdyno.core.events import FlightRecorder, KernelEvent, Subscription
from bpfdyno.sources.net.decode import TcpConnection
from bpfdyno.sources.procs.table import (
    SORT_KEYS,
    ProcessRow,
    ProcessSnapshot,
    ProcessTable,
    sort_rows,
)

#: Keys accepted in a ListProcesses filter term ``key=value``.
FILTER_KEYS = ("pid", "user", "comm", "job", "container", "cgroup")
MAX_STREAM_KINDS = 64


class ConnectionSource(Protocol):
    """Where connections come from (the net collector)."""

    def connections(self) -> list[TcpConnection]: ...


@dataclass(frozen=True, slots=True)
class EventsPage:
    """The answer to `KernelService.get_events`."""

    events: list[KernelEvent]
    evicted_age: int
    evicted_memory: int
    oldest_ts_ns: int


class KernelService:
    """Queries against the process table, the net collector and the flight recorder.

    Args:
        recorder: the daemon's flight recorder.
        table: the process table (refreshed elsewhere, by `ProcsCollector`); None if the
            ``procs`` collector is disabled.
        net: the net collector; None if it is disabled.
    """

    def __init__(
        self,
        recorder: FlightRecorder,
        table: ProcessTable | None = None,
        net: ConnectionSource | None = None,
    ) -> None:
        self._recorder = recorder
        self._table = table
        self._net = net

    def list_processes(
        self, sort_by: str = "", limit: int = 0, filter: str = ""
    ) -> ProcessSnapshot:
        """The latest process table, filtered, sorted and cut to ``limit`` rows.

        Raises:
            InvalidArgument: unknown sort key, malformed filter, negative limit.
            Unavailable: no process table, or it has not been built yet.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must be 0 (all) or positive, got {limit}")
        key = sort_by or "activity"
        if key not in SORT_KEYS:
            raise InvalidArgument(
                f"unknown sort key {sort_by!r}; use one of: {', '.join(sorted(SORT_KEYS))}"
            )
        match = parse_filter(filter)
        if self._table is None:
            raise Unavailable(
                "the process table is disabled; enable [collectors.procs] in the config"
            )
        snap = self._table.snapshot
        if snap.ts == 0:
            raise Unavailable("the process table has not been built yet; retry in a second")
        rows = sort_rows([r for r in snap.rows if match(r)], key)
        if limit:
            rows = rows[:limit]
        return replace(snap, rows=tuple(rows))

    def list_connections(self, pid: int = 0, state: str = "") -> list[TcpConnection]:
        """Tracked TCP connections, optionally of one process and/or in one state.

        Raises:
            InvalidArgument: negative pid.
            Unavailable: the net collector is disabled or not running.
        """
        if pid < 0:
            raise InvalidArgument(f"pid must be 0 (all) or positive, got {pid}")
        if self._net is None:
            raise Unavailable("the net collector is disabled; enable [collectors.net]")
        try:
            conns = self._net.connections()
        except RuntimeError as e:
            raise Unavailable(str(e)) from e
        want_state = state.upper()
        return [
            c
            for c in conns
            if (not pid or c.pid == pid) and (not want_state or c.state == want_state)
        ]

    def get_events(
        self, since_ns: int = 0, kinds: Sequence[str] = (), limit: int = 0
    ) -> EventsPage:
        """Events held by the flight recorder, oldest first (the newest ``limit`` if set).

        Raises:
            InvalidArgument: negative ``since_ns`` or ``limit``.
        """
        if since_ns < 0:
            raise InvalidArgument(f"since_ns must be 0 or an epoch time in ns, got {since_ns}")
        if limit < 0:
            raise InvalidArgument(f"limit must be 0 (all) or positive, got {limit}")
        events = self._recorder.since(since_ns, set(kinds) or None)
        if limit:
            events = events[-limit:]
        st = self._recorder.stats()
        return EventsPage(events, st.evicted_age, st.evicted_memory, st.oldest_ts_ns)

    def stream_events(self, kinds: Collection[str] = (), queue_size: int = 1024) -> Subscription:
        """Subscribe to new events (call on the event loop; close the subscription after).

        Raises:
            InvalidArgument: too many kinds.
        """
        if len(kinds) > MAX_STREAM_KINDS:
            raise InvalidArgument(f"at most {MAX_STREAM_KINDS} kinds, got {len(kinds)}")
        return self._recorder.subscribe(set(kinds) or None, queue_size)


def parse_filter(text: str) -> Callable[[ProcessRow], bool]:
    """Compile a ListProcesses filter (see kernel.proto) into a row predicate.

    Raises:
        InvalidArgument: unknown key, empty value, or a non-numeric pid.
    """
    terms: list[tuple[str, str]] = []
    for term in text.split():
        key, sep, value = term.partition("=")
        if not sep:
            terms.append(("word", term.lower()))
            continue
        if key not in FILTER_KEYS:
            raise InvalidArgument(
                f"unknown filter key {key!r} in {term!r}; use {', '.join(FILTER_KEYS)} "
                "(key=value) or a bare word"
            )
        if not value:
            raise InvalidArgument(f"filter term {term!r} has no value; write {key}=VALUE")
        if key == "pid" and not value.isdigit():
            raise InvalidArgument(f"pid must be a number in {term!r}")
        terms.append((key, value))

    def match(row: ProcessRow) -> bool:
        return all(_term_matches(row, key, value) for key, value in terms)

    return match


def _term_matches(r: ProcessRow, key: str, value: str) -> bool:
    if key == "word":
        return value in r.comm.lower() or value in r.cmdline.lower()
    if key == "pid":
        return r.pid == int(value)
    if key == "user":
        return r.user == value or str(r.uid) == value
    if key == "comm":
        return r.comm == value
    if key == "job":
        return r.slurm_job_id == value
    if key == "container":
        return bool(r.container_id) and r.container_id.startswith(value)
    return value in r.cgroup  # cgroup
