"""Memory pressure is named from what the kernel keeps per cgroup, not taken for the disk.

A rank whose cgroup has a memory limit below its working set reclaims its own pages at each
new charge and reads them again from the disk: on the sched track that is uninterruptible
sleep (D), as a slow disk's reads are. What tells them apart is the cgroup's counters: its
limit hit, pages read again after reclaim (refaults). The rule names ``memory`` when a
cgroup of the late rank's own shows both; a cgroup every rank of the node is in, or one that
never hit its limit, leaves the waits the disk's.
"""

from __future__ import annotations

import pytest
from test_verdict_kernel_causes import RANKS, STEP, collective, rank

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import MemoryCgroup, Verdict

N = 20
LATE_MS = 60.0
OWN = MemoryCgroup("/job/rank3", 48 << 20, 1450, 8600, 4, 0.0)


def job(cgroups: dict[int, tuple[MemoryCgroup, ...]]) -> Verdict:
    """Rank 3 arrives `LATE_MS` late to each of `N` collectives, in D (``disk``) that long
    in each run-up; ``cgroups``: each rank's memory cgroups with a limit."""
    out = []
    for r in range(RANKS):
        late = LATE_MS if r == 3 else 0.0
        cs = [
            collective(i, i * STEP + late, i * STEP + 80 + LATE_MS,
                       {"sleep": 0.1, **({"disk": late / 1000} if late else {})})
            for i in range(N)
        ]  # fmt: skip
        out.append(rank(r, cs, memory_cgroups=cgroups.get(r, ())))
    return compare(out)


def test_reclaim_at_the_rank_s_own_limit_is_memory_pressure() -> None:
    v = job({3: (OWN,)})
    [f] = v.stragglers
    assert (f.rank, f.kind) == (3, "late")
    assert [(c.cause, c.seconds, c.detail) for c in f.causes] == [
        (
            "memory",
            pytest.approx(N * LATE_MS / 1000),
            "cgroup /job/rank3 at its 48.0 MiB limit 1450 times: 8600 pages read again "
            "after reclaim, 4 major faults",
        )
    ]
    assert "memory pressure: reclaim at its cgroup's memory limit 1.20 s" in v.headline


def test_a_cgroup_every_rank_is_in_leaves_the_waits_the_disk_s() -> None:
    node = MemoryCgroup("/node", 8 << 30, 90, 400, 0, 0.0)
    v = job({r: (node,) for r in range(RANKS)})
    [f] = v.stragglers
    assert [c.cause for c in f.causes] == ["disk"]


def test_a_limit_never_hit_leaves_the_waits_the_disk_s() -> None:
    v = job({3: (MemoryCgroup("/job/rank3", 48 << 20, 0, 8600, 4, 0.0),)})
    [f] = v.stragglers
    assert [c.cause for c in f.causes] == ["disk"]
