"""The transport-free façade over the kernel's view: processes, connections, events.

The gRPC servicer (`bpfdyno.server.kernel`) and any other front end translate to these
calls. Domain errors are `bpfdyno.core.errors`: `InvalidArgument` (the caller asked for
something malformed) and `Unavailable` (the data source is not running here).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from bpfdyno.core.budget import REQUESTED
from bpfdyno.core.demand import ReadDemand
from bpfdyno.core.errors import InvalidArgument, Unavailable
from bpfdyno.core.events import FlightRecorder, KernelEvent, Subscription
from bpfdyno.core.identity import Requester
from bpfdyno.core.procview import ProcView, proc_view
from bpfdyno.core.workers import DaemonExecutor
from bpfdyno.rpc.processes import QueryError, filter_rows, parse_filter, sort_key, sort_rows
from bpfdyno.sources.net.decode import TcpConnection
from bpfdyno.sources.procs.table import ProcessSnapshot, ProcessTable


@contextlib.contextmanager
def _streaming(demand: ReadDemand, who: str) -> Iterator[None]:
    demand.stream_opened(who)
    try:
        yield
    finally:
        demand.stream_closed(who)


MAX_STREAM_KINDS = 64
#: Longest a reader waits for the process table to be updated for it.
REFRESH_TIMEOUT_S = 10.0


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
        fresh_within_s: float = 1.0,
        view: Callable[[], ProcView] = proc_view,
        demand: ReadDemand | None = None,
    ) -> None:
        self._recorder = recorder
        self._demand = demand if demand is not None else ReadDemand()
        self._table = table
        self._net = net
        self._fresh_within_s = fresh_within_s
        self._view = view
        # Updating the table reads /proc (another process's command line can block on its
        # memory map lock): never on the event loop.
        self._refresher = DaemonExecutor("procs-read")

    async def list_processes(
        self,
        sort_by: str = "",
        limit: int = 0,
        filter: str = "",
        who: str = "in-process",
        requester: Requester | None = None,
    ) -> ProcessSnapshot:
        """The process table as of at most one round ago (``fresh_within_s``), filtered,
        sorted and cut to ``limit`` rows: updated first when its last update is older.

        With ``hidepid`` on /proc (`bpfdyno.core.procview`), a requester other than root
        (or the exempt group) gets only her own processes, as /proc shows her.

        Raises:
            InvalidArgument: unknown sort key, malformed filter, negative limit.
            Unavailable: no process table, or it could not be updated in time, or ``who``
                (``uid N``) had the agent spend their share of requested work.
        """
        if limit < 0:
            raise InvalidArgument(f"limit must be 0 (all) or positive, got {limit}")
        # The filter and the sort key are checked before the table: a malformed request is
        # reported as such even where the table is off.
        try:
            key = sort_key(sort_by).name
            flt = parse_filter(filter)
        except QueryError as e:
            raise InvalidArgument(str(e)) from None
        if self._table is None:
            raise Unavailable(
                "the process table is disabled; enable [collectors.procs] in the config"
            )
        REQUESTED.check(who)
        self._demand.note(who)  # the table keeps its own freshness: no wait for rounds here
        snap = await self._fresh(self._table, who)
        if snap.ts == 0:
            raise Unavailable("the process table has not been built yet; retry in a second")
        with REQUESTED.work((who,)):
            rows = sort_rows(filter_rows(snap.rows, flt), key)
        uid = requester.uid if requester is not None else None
        if requester is not None and not self._view().sees_all(uid):
            rows = [r for r in rows if uid is not None and r.uid == uid]
        if limit:
            rows = rows[:limit]
        return replace(snap, rows=tuple(rows))

    async def _fresh(self, table: ProcessTable, who: str) -> ProcessSnapshot:
        age = table.age_s()
        if age is not None and age <= self._fresh_within_s:
            with REQUESTED.work((who,)):  # its rows may be built now
                return table.read(who)  # the rounds keep it fresh while someone reads

        def refresh() -> ProcessSnapshot:
            with REQUESTED.work((who,)):
                return table.fresh_snapshot(self._fresh_within_s, who)

        loop = asyncio.get_running_loop()
        call = loop.run_in_executor(self._refresher, refresh)
        try:
            return await asyncio.wait_for(asyncio.shield(call), REFRESH_TIMEOUT_S)
        except TimeoutError:
            raise Unavailable(
                f"the process table could not be updated within {REFRESH_TIMEOUT_S:g} s (a "
                "read of /proc is blocked); retry, and see `bpfdyno status` for the procs "
                "collector"
            ) from None

    async def freshen(self, who: str) -> None:
        """``who`` reads what the rounds bring (kernel events): note it, and return once
        the rounds are no older than one normal round (`bpfdyno.core.demand.ReadDemand`)."""
        REQUESTED.check(who)
        await self._demand.read(who, REFRESH_TIMEOUT_S / 2)

    def streaming(self, who: str) -> contextlib.AbstractContextManager[None]:
        """While an event stream of ``who`` is open: a reader, the normal cadence."""
        return _streaming(self._demand, who)

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
