"""Collective times of this node's ranks from NCCL's profiler plugin (`CollectiveSource`).

The plugin's receiver (`bpfdyno.sources.nccl_profiler`) keeps each trainer's cumulative time
in collectives and its latest completed collectives with the moment its CPU reached each
(its arrival). A collective completes on every rank of its communicator at nearly the same
moment, so what a rank adds to its peers' time is how much later than the first rank it
arrived. That is counted here for the ranks on this node: a collective (communicator id,
sequence number) is counted once every local rank of that communicator has completed it,
each rank's lateness being its arrival minus the earliest local arrival. A rank alone on its
node in a communicator is never late here (its peers are on other nodes: the job-wide
comparison of the detection covers them through its other signals).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from bpfdyno.detection.signals import CollectiveTimes
from bpfdyno.sources.nccl_profiler.receiver import NcclRankAggregate

#: Collectives already counted, per communicator: kept while their seq can still be seen.
_COUNTED_PER_COMM = 4096


class NcclCollectiveTimes:
    """`CollectiveSource` over the receiver's snapshots (``snapshot`` is its method)."""

    def __init__(self, snapshot: Callable[[], dict[int, NcclRankAggregate]]) -> None:
        self._snapshot = snapshot
        self._late_ns: dict[int, int] = defaultdict(int)
        self._counted: dict[int, set[int]] = defaultdict(set)
        self._last_read: tuple[float, ...] = ()
        self._aggregates: dict[int, NcclRankAggregate] = {}

    def collective_times(self, pid: int) -> CollectiveTimes | None:
        self._refresh()
        agg = self._aggregates.get(pid)
        if agg is None:
            return None
        return CollectiveTimes(
            in_collective_ns=agg.time_in_collectives_ns, late_ns=self._late_ns[pid]
        )

    def _refresh(self) -> None:
        aggregates = self._snapshot()
        stamp = tuple(sorted(a.updated_monotonic_s for a in aggregates.values()))
        if stamp == self._last_read and aggregates.keys() == self._aggregates.keys():
            return
        self._last_read, self._aggregates = stamp, aggregates
        for pid, late in lateness(aggregates, self._counted).items():
            self._late_ns[pid] += late
        for comm, seqs in self._counted.items():
            if len(seqs) > _COUNTED_PER_COMM:
                self._counted[comm] = set(sorted(seqs)[-_COUNTED_PER_COMM // 2 :])
        for pid in [p for p in self._late_ns if p not in aggregates]:
            del self._late_ns[pid]


def lateness(
    aggregates: dict[int, NcclRankAggregate], counted: dict[int, set[int]]
) -> dict[int, int]:
    """Each pid's lateness (ns) over the collectives not yet in ``counted``, which it updates.

    A collective is counted once every local rank of its communicator completed it (its
    sequence number at most each one's last completed): until then a rank that has not
    arrived yet would be missing from the comparison.
    """
    done_upto: dict[int, dict[int, int]] = defaultdict(dict)  # comm -> pid -> last seq done
    for pid, agg in aggregates.items():
        for c_agg in agg.comms:
            done_upto[c_agg.comm_id][pid] = c_agg.last_seq_completed
    arrivals: dict[tuple[int, int], dict[int, int]] = defaultdict(dict)
    for pid, agg in aggregates.items():
        for c in agg.recent:
            arrivals[(c.comm_id, c.seq)][pid] = c.start_realtime_ns
    out: dict[int, int] = defaultdict(int)
    for (comm_id, seq), by_pid in arrivals.items():
        ranks = done_upto.get(comm_id, {})
        if len(ranks) < 2 or seq in counted[comm_id]:
            continue
        if any(last < seq for last in ranks.values()) or by_pid.keys() != ranks.keys():
            continue  # not every local rank has completed it (or one's record was lost)
        counted[comm_id].add(seq)
        first = min(by_pid.values())
        for pid, start in by_pid.items():
            out[pid] += start - first
    return dict(out)
