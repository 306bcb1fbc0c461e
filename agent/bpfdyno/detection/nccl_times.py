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
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from bpfdyno.detection.signals import CollectiveTimes, RankSignals
from bpfdyno.rpc.detection import CollectiveArrival
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
                CollectiveArrival(c.comm_id, c.seq, c.start_realtime_ns, sizes.get(c.comm_id, 0))
                for c in agg.recent
            ),
        )


@dataclass(slots=True)
class _Pending:
    """One collective's arrivals so far, per rank."""

    first_round: int
    comm_ranks: int
    by_rank: dict[int, int] = field(default_factory=dict)  # rank -> arrival (unix ns)


class LateArrivals:
    """Counts each collective of a job once over every rank seen at it, this node's and the
    peers'; `apply` gives each rank with known arrivals its late time in the round."""

    def __init__(self, wait_rounds: int = WAIT_ROUNDS) -> None:
        self._wait_rounds = wait_rounds
        self._round = 0
        self._pending: dict[tuple[str, int, int], _Pending] = {}  # (job, comm, seq)
        self._counted: dict[tuple[str, int], set[int]] = defaultdict(set)  # (job, comm)
        #: Per (job, comm): sequence numbers at or below this were forgotten once counted.
        self._floor: dict[tuple[str, int], int] = {}
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
            for a in s.arrivals or ():
                self._add(s.job_id, s.rank, a)
        self._forget_jobs_but(jobs)
        out: dict[tuple[str, int], int] = defaultdict(int)
        for key, p in list(self._pending.items()):
            job, comm, seq = key
            complete = p.comm_ranks > 0 and len(p.by_rank) >= p.comm_ranks
            wait = self._wait_rounds if pulled is None or job in pulled else WAIT_ROUNDS_ALONE
            if not complete and self._round - p.first_round < wait:
                continue
            del self._pending[key]
            self._remember(job, comm, seq)
            first = min(p.by_rank.values())
            if max(p.by_rank.values()) - first > MAX_SPREAD_NS:
                if not self.left_out:
                    log.warning(
                        "detection: job %s's ranks %s reached collective %d of communicator "
                        "%x more than %d s apart: left out (a node's clock or its arrivals "
                        "are wrong; check its time synchronisation)",
                        job, sorted(p.by_rank), seq, comm, MAX_SPREAD_NS // 1_000_000_000,
                    )  # fmt: skip
                self.left_out += 1
                continue
            for rank, arrival in p.by_rank.items():
                out[(job, rank)] += arrival - first
        return dict(out)

    def _add(self, job: str, rank: int, a: CollectiveArrival) -> None:
        comm = (job, a.comm_hash)
        if a.seq <= self._floor.get(comm, -1) or a.seq in self._counted.get(comm, ()):
            return  # counted already (a peer's answer read again, a late duplicate)
        key = (job, a.comm_hash, a.seq)
        pending = self._pending.get(key)
        if pending is None:
            pending = self._pending[key] = _Pending(self._round, a.comm_ranks)
        pending.by_rank.setdefault(rank, a.arrival_unix_ns)

    def _remember(self, job: str, comm_hash: int, seq: int) -> None:
        comm = (job, comm_hash)
        seqs = self._counted[comm]
        seqs.add(seq)
        if len(seqs) > 2 * _COUNTED_PER_COMM:
            kept = sorted(seqs)[-_COUNTED_PER_COMM:]
            self._floor[comm] = kept[0] - 1
            self._counted[comm] = set(kept)

    def _forget_jobs_but(self, jobs: set[str]) -> None:
        """Drops what is kept of jobs no rank reported in this round (they ended)."""
        self._pending = {k: p for k, p in self._pending.items() if k[0] in jobs}
        for kept in (self._counted, self._floor):
            for comm in [c for c in kept if c[0] not in jobs]:
                del kept[comm]
