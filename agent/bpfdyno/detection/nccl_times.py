"""NCCL late arrival: how late each rank of a job reached its collectives, across its nodes.

The plugin's receiver (`bpfdyno.sources.nccl_profiler`) keeps each trainer's cumulative time
in collectives and its latest completed collectives with the moment its CPU reached each
(its arrival). `NcclCollectiveTimes` hands both to the signal sampler, which puts the
arrivals of the interval and the one before into the rank's signal (the latest
`MAX_ARRIVALS`); they travel to
the job's other agents in its `RankSignal`, moved onto the puller's clock by the peer's clock
offset (`signals.from_record`).

A collective completes on every rank of its communicator at nearly the same moment, so what a
rank adds to its peers' time is how much later than the first rank it arrived. `LateArrivals`
puts every rank's arrivals at one collective (communicator id, sequence number) side by side,
this node's and the peers' alike, and counts it once: each rank's lateness is its arrival
minus the earliest. A collective is counted when as many ranks as its communicator has
reported it, or, when some never do (their node has no agent, a peer stopped answering, the
rank's window of recent collectives no longer holds it), after `WAIT_ROUNDS` rounds over the
ranks seen (`WAIT_ROUNDS_ALONE` for a job whose peers report none of its ranks). A
collective already counted is not counted again: a peer's answer is pulled again until a
newer one replaces it.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import repeat
from operator import add, sub

from bpfdyno.detection.signals import Arrival, Arrivals, CollectiveTimes, RankSignals
from bpfdyno.sources.nccl_profiler.receiver import NcclRankAggregate

#: Rounds a collective that not every rank of its communicator reported waits after the one
#: it was first seen in before it is counted over the ranks seen: a peer's answer may be two
#: intervals old when it is read.
WAIT_ROUNDS = 3
#: ... when no peer reports ranks of the job (none configured or found, none answering):
#: one round, for this node's ranks that completed it after the sample that saw another's.
WAIT_ROUNDS_ALONE = 1
#: A collective whose ranks' arrivals span more than this is left out: no rank waits a
#: minute at a collective and then completes it (NCCL's own timeouts and the hang watch are
#: for that), so a clock or a peer is wrong, and one bad arrival would make every other rank
#: look late by its error.
MAX_SPREAD_NS = 60 * 1_000_000_000
#: Counted sequence numbers kept per communicator: a collective whose seq is below all of
#: them is as old as a counted one and is ignored.
_COUNTED_PER_COMM = 4096


log = logging.getLogger(__name__)


class NcclCollectiveTimes:
    """`CollectiveSource` over the receiver's snapshots (``snapshot`` is its method)."""

    def __init__(self, snapshot: Callable[[], dict[int, NcclRankAggregate]]) -> None:
        self._snapshot = snapshot

    def collective_times(self, pid: int) -> CollectiveTimes | None:
        agg = self._snapshot().get(pid)
        if agg is None:
            return None
        sizes = {c.comm_id: c.nranks for c in agg.comms}
        return CollectiveTimes(
            in_collective_ns=agg.time_in_collectives_ns,
            arrivals=tuple(
                Arrival(c.comm_id, c.seq, c.start_realtime_ns, sizes.get(c.comm_id, 0))
                for c in agg.recent
            ),
        )


@dataclass(slots=True)
class _Comm:
    """One communicator of a job: its arrivals not counted yet, per rank, and what was.

    Arrivals are kept in dicts per rank and handled a column at a time (``map`` over a
    collective list, set operations), not one object per arrival: at eight nodes of eight
    ranks a round brings 16384 arrivals, and per-arrival Python is most of the cost.
    """

    size: int  # ranks in it (0: not known)
    by_rank: dict[int, dict[int, int]] = field(default_factory=dict)  # rank -> seq -> arrival
    reports: dict[int, int] = field(default_factory=dict)  # seq -> ranks that reported it
    first_round: dict[int, int] = field(default_factory=dict)  # seq -> round first seen
    #: The round's new sequence numbers, one set per rank: tallied in `ready`, where the
    #: ranks that reported the same ones (the usual case) are tallied once.
    fresh: list[frozenset[int]] = field(default_factory=list)
    counted: set[int] = field(default_factory=set)
    floor: int = -1  # sequence numbers at or below this were forgotten once counted

    def add(self, rank: int, g: Arrivals, round_: int) -> None:
        mine = self.by_rank.get(rank)
        if mine is None:
            mine = self.by_rank[rank] = {}
        # Counted already (a peer's answer read again, a late duplicate) or kept already.
        fresh = frozenset(g.seqs).difference(mine, self.counted)
        if self.floor >= 0:
            fresh = frozenset(s for s in fresh if s > self.floor)
        if not fresh:
            return
        if len(fresh) == len(g.seqs):  # all new (the usual case): the columns as they are
            mine.update(zip(g.seqs, g.at_ns, strict=False))
        else:
            at = dict(zip(g.seqs, g.at_ns, strict=False))
            mine.update(zip(fresh, map(at.__getitem__, fresh), strict=True))
        self.fresh.append(fresh)

    def ready(self, round_: int, wait: int) -> list[int]:
        """The collectives to count now: every rank reported them, or they waited enough."""
        for seqs, ranks in Counter(self.fresh).items():
            self.first_round.update(dict.fromkeys(seqs.difference(self.first_round), round_))
            got = map(self.reports.get, seqs, repeat(0))
            self.reports.update(zip(seqs, map(add, got, repeat(ranks)), strict=True))
        self.fresh.clear()
        n = self.size
        first = self.first_round
        return [s for s, k in self.reports.items() if 0 < n <= k or round_ - first[s] >= wait]

    def count(self, seqs: list[int]) -> tuple[dict[int, int], list[int]]:
        """Counts ``seqs``: each rank's late ns summed over them, and those left out for a
        spread over `MAX_SPREAD_NS`. They are forgotten but for their numbers."""
        ranks = list(self.by_rank.items())
        late: dict[int, int] = defaultdict(int)
        left_out: list[int] = []
        # Reported by every rank kept: a column per rank, the earliest a column-wise min.
        everyone = [s for s in seqs if self.reports[s] == len(ranks)]
        if everyone:
            cols = [list(map(d.__getitem__, everyone)) for _, d in ranks]
            firsts = list(map(min, *cols)) if len(cols) > 1 else cols[0]
            lasts = list(map(max, *cols)) if len(cols) > 1 else cols[0]
            spreads = list(map(sub, lasts, firsts))
            if max(spreads) > MAX_SPREAD_NS:  # a rank this late: a clock is wrong
                keep = [i for i, sp in enumerate(spreads) if sp <= MAX_SPREAD_NS]
                left_out = [everyone[i] for i, sp in enumerate(spreads) if sp > MAX_SPREAD_NS]
                cols = [[c[i] for i in keep] for c in cols]
                firsts = [firsts[i] for i in keep]
            # Each rank's late time: its arrivals minus the earliest ones, summed.
            earliest = sum(firsts)
            for (rank, _), col in zip(ranks, cols, strict=True):
                late[rank] += sum(col) - earliest
        # The others (some rank never reported them): one at a time.
        for s in seqs:
            if self.reports[s] == len(ranks):
                continue
            by_rank = {r: d[s] for r, d in ranks if s in d}
            first = min(by_rank.values())
            if max(by_rank.values()) - first > MAX_SPREAD_NS:
                left_out.append(s)
                continue
            for rank, arrival in by_rank.items():
                late[rank] += arrival - first
        done = set(seqs)
        for rank, d in ranks:
            # Every rank holds all of `everyone`: one holding no more has nothing left.
            if len(d) == len(everyone) or d.keys() <= done:
                del self.by_rank[rank]
            else:
                self.by_rank[rank] = {s: d[s] for s in d.keys() - done}
        for s in seqs:
            del self.reports[s]
            del self.first_round[s]
        self.counted.update(seqs)
        if len(self.counted) > 2 * _COUNTED_PER_COMM:
            kept = sorted(self.counted)[-_COUNTED_PER_COMM:]
            self.floor = kept[0] - 1
            self.counted = set(kept)
        return late, left_out


class LateArrivals:
    """Counts each collective of a job once over every rank seen at it, this node's and the
    peers'; `apply` gives each rank with known arrivals its late time in the round."""

    def __init__(self, wait_rounds: int = WAIT_ROUNDS) -> None:
        self._wait_rounds = wait_rounds
        self._round = 0
        self._comms: dict[tuple[str, int], _Comm] = {}  # (job, communicator)
        #: Collectives left out for a spread over `MAX_SPREAD_NS` (the first one is logged).
        self.left_out = 0

    def apply(
        self, local: list[RankSignals], peers: list[RankSignals]
    ) -> tuple[list[RankSignals], list[RankSignals]]:
        """The round's signals with ``late_s`` of every rank whose arrivals are known: what
        the collectives counted in this round add up to for it (0 when none was). Only the
        peers' ranks of this node's jobs are compared (the detector uses no other)."""
        jobs = {s.job_id for s in local}
        peers_of_jobs = [s for s in peers if s.job_id in jobs]
        pulled = {s.job_id for s in peers_of_jobs if s.arrivals is not None}
        late = self.update([*local, *peers_of_jobs], pulled)

        def filled(s: RankSignals) -> RankSignals:
            if s.arrivals is None or s.job_id not in jobs:
                return s
            return replace(s, late_s=late.get((s.job_id, s.rank), 0) / 1e9)

        return [filled(s) for s in local], [filled(s) for s in peers]

    def update(
        self, ranks: Iterable[RankSignals], pulled: set[str] | None = None
    ) -> dict[tuple[str, int], int]:
        """Adds the ranks' arrivals; the late ns per (job, rank) of the collectives that are
        counted now. ``pulled``: the jobs whose peers' arrivals are read (their incomplete
        collectives wait `WAIT_ROUNDS`; others `WAIT_ROUNDS_ALONE`); None: all."""
        self._round += 1
        jobs = set()
        for s in ranks:
            jobs.add(s.job_id)
            for g in s.arrivals or ():
                comm = self._comms.get((s.job_id, g.comm_hash))
                if comm is None:
                    comm = self._comms[(s.job_id, g.comm_hash)] = _Comm(g.comm_ranks)
                comm.add(s.rank, g, self._round)
        # What is kept of jobs no rank reported in this round goes (they ended).
        self._comms = {k: c for k, c in self._comms.items() if k[0] in jobs}
        out: dict[tuple[str, int], int] = defaultdict(int)
        for (job, comm_hash), comm in self._comms.items():
            wait = self._wait_rounds if pulled is None or job in pulled else WAIT_ROUNDS_ALONE
            seqs = comm.ready(self._round, wait)
            if not seqs:
                continue
            late, left_out = comm.count(seqs)
            for rank, ns in late.items():
                out[(job, rank)] += ns
            if left_out and not self.left_out:
                log.warning(
                    "detection: job %s's ranks reached collective %d of communicator %x more "
                    "than %d s apart: left out (a node's clock or its arrivals are wrong; "
                    "check its time synchronisation)",
                    job, left_out[0], comm_hash, MAX_SPREAD_NS // 1_000_000_000,
                )  # fmt: skip
            self.left_out += len(left_out)
        return dict(out)
