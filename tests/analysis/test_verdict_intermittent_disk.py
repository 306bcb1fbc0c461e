"""A rank held back by its disk in some steps only is named, for the disk.

A disk throttled for a rank's cgroup (``io.max``) lets a step's reads through at once while
its budget lasts and holds the next step's back: the rank is late to some collectives
only, and the consistency rule (late in 60 % of them) called it jitter although it kept the
others waiting 15-24 % of the time (the matrix's 20 MB/s runs), in uninterruptible disk
waits. Waits no healthy rank has for long name it; the same lateness
made of waits for a CPU, or late in too few collectives, stays jitter.
"""

from __future__ import annotations

import pytest
from test_verdict_kernel_causes import RANKS, STEP, collective, rank

from bpfdyno.analysis import verdict
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence

N = 20
LATE_MS = 60.0


def job(late_in: set[int], cause: str, late_ms: float = LATE_MS) -> list[RankEvidence]:
    """4 ranks, `N` collectives `STEP` ms apart, each ending 80 ms after its start; rank 3
    arrives ``late_ms`` late to the collectives ``late_in``, having waited that long for
    ``cause`` in their run-ups; every rank sleeps 100 ms of each run-up."""
    out = []
    for r in range(RANKS):
        cs = []
        for i in range(N):
            late = late_ms if r == 3 and i in late_in else 0.0
            before = {"sleep": 0.1, **({cause: late / 1000} if late else {})}
            cs.append(collective(i, i * STEP + late, i * STEP + 80 + late_ms, before))
        out.append(rank(r, cs))
    return out


def test_a_rank_late_for_its_disk_in_half_the_steps_is_named() -> None:
    v = compare(job(set(range(0, N, 2)), "disk"))
    [f] = v.stragglers
    assert (f.rank, f.kind) == (3, "late")
    assert f.seconds == pytest.approx(N / 2 * LATE_MS / 1000)
    assert [(c.cause, c.seconds) for c in f.causes] == [("disk", pytest.approx(0.6))]
    # Late in 10 of 20: under the consistency rule's 60 %, over the intermittent floor.
    assert verdict.MIN_INTERMITTENT_FRACTION <= 0.5 < verdict.MIN_LATE_FRACTION


def test_the_same_lateness_waiting_for_a_cpu_is_jitter() -> None:
    v = compare(job(set(range(0, N, 2)), "cpu_wait"))
    assert v.stragglers == ()
    assert v.within_noise


def test_a_rank_late_for_its_disk_in_too_few_steps_is_not_named() -> None:
    """Late in 3 of 20 collectives (15 %), for 200 ms of disk each: a few long stalls."""
    v = compare(job({2, 9, 15}, "disk", late_ms=200.0))
    assert v.stragglers == ()
