"""The transport-free façade over the daemon's state: what gRPC and the CLI ask for.

RPC layers translate requests to these calls and domain objects to messages; nothing here
knows about gRPC. Domain errors are `bpfdyno.core.errors` (here `InvalidArgument`); each
transport maps them to its own status codes.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Protocol

from bpfdyno.core.budget import REQUESTED, reader
from bpfdyno.core.catalog import Catalog
from bpfdyno.core.connections import PEER_LIMIT, ConnectionLimits
from bpfdyno.core.demand import ReadDemand
from bpfdyno.core.errors import InvalidArgument, Unavailable
from bpfdyno.core.identity import Requester
from bpfdyno.core.metrics import MetricSpec, Round
from bpfdyno.core.status import PartStatus
from bpfdyno.core.store import (
    MetricStore,
    Point,
    RoundPublisher,
    SeriesView,
    SharedResults,
    name_filter,
)
from bpfdyno.rpc.agent import AgentStatus, CollectorState, CollectorStatus
from bpfdyno.sources.percpu import PER_CPU_READS
from bpfdyno.version import __version__

#: Longest window a single query may ask for (the store keeps less anyway).
#: The label of per-CPU series.
PER_CPU_LABEL = "cpu"
#: The longest a read waits for the round that makes its per-CPU series fresh.
FRESH_WAIT_S = 5.0
MAX_WINDOW_S = 7 * 24 * 3600.0
DEFAULT_WINDOW_S = 300.0
#: Most metric-name patterns one request may hold (the catalog has a few hundred names; a
#: client that wants more asks for everything, or for a prefix).
MAX_NAME_PATTERNS = 256
#: Longest metric-name pattern.
MAX_PATTERN_LEN = 200
#: Rules a refused request names.
PATTERNS_RULE = "metric_pattern_limit"
STREAMS_PER_USER_RULE = "stream_limit_per_user"
STREAMS_RULE = "stream_limit"


@dataclass(frozen=True, slots=True)
class Snapshot:
    ts: float
    collector: str
    series: list[SeriesView]


class DaemonState(Protocol):
    """What the agent service reads of the running daemon (`bpfdyno.app.daemon.Daemon`)."""

    started_ts: float
    started_monotonic: float
    store: MetricStore
    publisher: RoundPublisher
    #: Every metric the daemon can emit (the assembly hands it over).
    catalog: Catalog
    #: Who reads: each read that returns data is noted (it sets the collection cadence).
    demand: ReadDemand

    @property
    def config_source(self) -> str: ...

    def statuses(self) -> list[PartStatus]: ...

    def collector_intervals(self) -> dict[str, float]: ...


def host_uptime_s(proc_root: str = "/proc") -> float:
    """Seconds since boot from /proc/uptime; NaN if unreadable."""
    try:
        with open(os.path.join(proc_root, "uptime"), encoding="ascii") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return float("nan")


class AgentService:
    """Status and metrics queries against one running daemon.

    Args:
        daemon: the running daemon.
        catalog: the metrics ``ListMetricSpecs`` declares; None: the daemon's.
    """

    def __init__(
        self,
        daemon: DaemonState,
        catalog: Catalog | None = None,
        streams: ConnectionLimits | None = None,
    ) -> None:
        self._daemon = daemon
        self._catalog = catalog if catalog is not None else daemon.catalog
        #: StreamMetrics calls open, in all and per user.
        self.streams = streams if streams is not None else ConnectionLimits(256, 8)
        # Every stream subscriber with the same name filter gets the same Snapshot object.
        self._round_snapshots: SharedResults[tuple[str, ...], Snapshot | None] = SharedResults()

    def status(self) -> AgentStatus:
        d = self._daemon
        return AgentStatus(
            version=__version__,
            hostname=socket.gethostname(),
            kernel_release=os.uname().release,
            agent_uptime_seconds=time.monotonic() - d.started_monotonic,
            host_uptime_seconds=host_uptime_s(),
            pid=os.getpid(),
            config_source=d.config_source,
            started_unix_seconds=d.started_ts,
            collectors=tuple(map(collector_status, d.statuses())),
        )

    def metric_specs(self) -> list[MetricSpec]:
        return list(self._catalog)

    def snapshot(self, names: Sequence[str] = (), who: str = "in-process") -> Snapshot:
        """Latest value of every matching series still being updated (the work is
        ``who``'s: `bpfdyno.core.budget.RequestedWork`)."""
        _check_names(names)
        REQUESTED.check(who)
        now = time.time()
        # A series not updated for 3 of its longest plausible intervals has gone away (a NIC
        # removed, a process exited); leave it out of "latest".
        horizon = now - max(3 * self._longest_interval(), 10.0)
        with REQUESTED.work((who,)):
            series = self._daemon.store.latest(names, newer_than=horizon)
        if any(PER_CPU_LABEL in v.spec.labels for v in series):
            PER_CPU_READS.note()  # reported every round while read
        return Snapshot(now, "", series)

    async def freshen(self, who: str) -> None:
        """``who`` reads: note it (the normal cadence), and return once every collector's
        latest round is no older than one normal round (a round is run first for those idle
        while nobody read: the rounds of a whole slow interval, summed, cost one read)."""
        REQUESTED.check(who)
        await self._daemon.demand.read(who, FRESH_WAIT_S)

    async def fresh_snapshot(self, names: Sequence[str] = (), who: str = "in-process") -> Snapshot:
        """`snapshot` of rounds no older than one normal round (`freshen`), its per-CPU series
        too.

        On a node with more CPUs than ``[daemon] per_cpu_series_max`` those are reported only
        every few rounds while nobody reads them; a read that finds them older waits for the
        next round of their collectors (at most two intervals or `FRESH_WAIT_S`), which reports them
        again, and so does every round while they are read (`PER_CPU_READS`).
        """
        _check_names(names)
        await self.freshen(who)
        q = self._daemon.publisher.subscribe()
        try:
            snap = self.snapshot(names, who)
            intervals = self._daemon.collector_intervals()
            stale = _stale_per_cpu(snap, intervals)
            if not stale:
                return snap
            loop = asyncio.get_running_loop()
            # Normally the next round comes within an interval; a loaded machine's may be late.
            deadline = loop.time() + max(2 * max(intervals[c] for c in stale), FRESH_WAIT_S)
            while stale:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    rnd = await asyncio.wait_for(q.get(), left)
                except TimeoutError:
                    break
                stale.discard(rnd.collector)
        finally:
            self._daemon.publisher.unsubscribe(q)
        return self.snapshot(names, who)

    def window(
        self, names: Sequence[str], start: float, end: float, who: str = "in-process"
    ) -> list[SeriesView]:
        _check_names(names)
        REQUESTED.check(who)
        now = time.time()
        if end == 0:
            end = now
        if start == 0:
            start = end - DEFAULT_WINDOW_S
        if start > end:
            raise InvalidArgument(
                f"window start {start} is after its end {end}; give start < end (epoch seconds)"
            )
        if end - start > MAX_WINDOW_S:
            raise InvalidArgument(f"window longer than {MAX_WINDOW_S:.0f} s; ask for less")
        with REQUESTED.work((who,)):
            return self._daemon.store.window(start, end, names)

    async def stream(
        self,
        names: Sequence[str] = (),
        collectors: Sequence[str] = (),
        requester: Requester | None = None,
    ) -> AsyncIterator[Snapshot]:
        """Yield each collection round (filtered) as it happens, until the caller stops.

        Raises:
            InvalidArgument: a bad pattern or collector name.
            Unavailable: the requester's streams, or all streams, are at their limit.
        """
        _check_names(names)
        known = set(self._daemon.collector_intervals())
        unknown = [c for c in collectors if c not in known]
        if unknown:
            raise InvalidArgument(
                f"unknown collector(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        who = requester if requester is not None else Requester(None, "in-process", "unknown")
        reader_name = reader(who.uid, who.peer)
        peer = self.streams.peer_of(who)
        refused = self.streams.admit(peer, privileged=who.uid == 0)
        if refused == PEER_LIMIT:
            raise Unavailable(
                f"{peer} already has {self.streams.max_per_peer} metric streams open (the "
                "most one user may); close one (each `metrics --watch` or `top` holds one) "
                "or ask the operator to raise grpc.max_streams_per_user",
                STREAMS_PER_USER_RULE,
            )
        if refused:
            raise Unavailable(
                f"the agent already serves {self.streams.max_total} metric streams (its "
                "limit, grpc.max_streams); retry later",
                STREAMS_RULE,
            )
        # An open stream is a reader: the normal cadence while it is open.
        self._daemon.demand.stream_opened(reader_name)
        try:
            async for snap in self._stream(names, collectors):
                yield snap
        finally:
            self._daemon.demand.stream_closed(reader_name)
            self.streams.release(peer)

    async def _stream(
        self, names: Sequence[str], collectors: Sequence[str]
    ) -> AsyncIterator[Snapshot]:
        # A stream whose names take in per-CPU series reads them: every round while open.
        wanted = name_filter(names)
        per_cpu = any(PER_CPU_LABEL in s.labels and wanted.matches(s.name) for s in self._catalog)
        if per_cpu:
            PER_CPU_READS.note()
        q = self._daemon.publisher.subscribe()
        try:
            while True:
                rnd = await q.get()
                if per_cpu:
                    PER_CPU_READS.note()
                if collectors and rnd.collector not in collectors:
                    continue
                snap = self._round_snapshots.get(
                    rnd, tuple(names), partial(_round_snapshot, rnd, names)
                )
                if snap is not None:
                    yield snap
        finally:
            self._daemon.publisher.unsubscribe(q)

    def _longest_interval(self) -> float:
        return max(self._daemon.collector_intervals().values(), default=1.0)


def _stale_per_cpu(snap: Snapshot, intervals: dict[str, float]) -> set[str]:
    """The collectors whose per-CPU series in ``snap`` are older than one round."""
    stale = set()
    for v in snap.series:
        interval = intervals.get(v.spec.source)
        if PER_CPU_LABEL not in v.spec.labels or interval is None or not v.points:
            continue
        # A series reported every round is at most one interval old (and a little late).
        if v.points[-1].ts < snap.ts - 1.5 * interval:
            stale.add(v.spec.source)
    return stale


def collector_status(p: PartStatus) -> CollectorStatus:
    """A part's status in the API's words."""
    return CollectorStatus(
        name=p.name,
        state=CollectorState[p.state.name],
        reason=p.reason,
        interval_seconds=p.interval_s,
        collections=p.collections,
        errors=p.errors,
        last_duration_seconds=p.last_duration_s,
        last_success_unix_seconds=p.last_success_ts,
    )


def _check_names(names: Sequence[str]) -> None:
    if len(names) > MAX_NAME_PATTERNS:
        raise InvalidArgument(
            f"{len(names)} metric name patterns in one request; at most {MAX_NAME_PATTERNS}: "
            "ask for prefixes ending in '*' (e.g. 'sched_*'), or for every metric with none",
            PATTERNS_RULE,
        )
    for n in names:
        if len(n) > MAX_PATTERN_LEN:
            raise InvalidArgument(
                f"a metric name pattern of {len(n)} characters; at most {MAX_PATTERN_LEN}: "
                "use a metric name or a prefix ending in '*'",
                PATTERNS_RULE,
            )
        if not n or any(c.isspace() for c in n):
            raise InvalidArgument(
                f"bad metric name pattern {n!r}: use a metric name or a prefix ending in '*'"
            )


def _round_snapshot(rnd: Round, names: Sequence[str]) -> Snapshot | None:
    """The round's available values whose names match, or None when none does."""
    wanted = name_filter(names)
    series = [
        SeriesView(s.spec, s.labels, (Point(rnd.ts, s.value),))
        for s in rnd.samples
        if s.value == s.value and wanted.matches(s.spec.name)  # NaN: not available
    ]
    return Snapshot(rnd.ts, rnd.collector, series) if series else None
