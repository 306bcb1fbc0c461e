"""A rank throttled by its CPU quota in some steps only is named, for its quota.

From a run of the verdict matrix (2026-11-29, quota class at 5 ms per 100 ms on rank 2, the
rank with a CPU of its own): the rank's cgroup was throttled in 44 of 47 periods (2.12 s),
and it kept the others waiting 985 ms, 21 % of the 4.68 s compared, every step of the job
81.7 ms against 39-42 ms healthy — yet the verdict said "no straggler": the rank was late to
28 of 60 collectives, under the consistency rule's 60 %. A 100 ms quota period against a
~80 ms step runs out in some steps and not in others, as a throttled disk's allowance does:
its lateness comes in some steps only. A throttled quota is evidence no healthy rank has
(the cgroup's own counters), so it names a rank late in only some collectives, as disk waits
do (`INTERMITTENT_CAUSES`); the same lateness made of waits for a CPU without a throttled
quota stays jitter.
"""

from __future__ import annotations

import pytest
from test_verdict_kernel_causes import RANKS, collective, rank

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import CpuQuota, RankEvidence

N = 60
STEP_MS = 78.0
LATE_MS = 35.2  # 985 ms over its 28 late collectives
LATE_IN = {i for i in range(N) if i % 15 in (0, 2, 4, 6, 8, 10, 12)}  # 28 of 60
QUOTA = CpuQuota("/bds26293-r2", 5000, 100_000, 47, 44, 2.12)


def job(quota: CpuQuota | None) -> list[RankEvidence]:
    """Rank 2 arrives `LATE_MS` late to the collectives `LATE_IN`, runnable (held off its
    CPU) that long in their run-ups; every rank sleeps 30 ms of each run-up."""
    out = []
    for r in range(RANKS):
        cs = []
        for i in range(N):
            late = LATE_MS if r == 2 and i in LATE_IN else 0.0
            before = {"sleep": 0.030, "cpu_wait": 0.001 + late / 1000}
            cs.append(collective(i, i * STEP_MS + late, i * STEP_MS + 12 + LATE_MS, before))
        out.append(rank(r, cs, cpu_quotas=(quota,) if quota and r == 2 else ()))
    return out


def test_a_rank_throttled_by_its_quota_in_some_steps_is_named() -> None:
    v = compare(job(QUOTA))
    [f] = v.stragglers
    assert (f.rank, f.kind) == (2, "late")
    assert f.seconds == pytest.approx(28 * LATE_MS / 1000)
    assert f.causes[0].cause == "cpu_quota"
    assert f.causes[0].seconds == pytest.approx(28 * LATE_MS / 1000)
    assert f.causes[0].detail == (
        "cgroup /bds26293-r2: 44 periods of 47 throttled, 2.12 s; quota 5 ms per 100 ms"
    )
    [t] = [t for t in v.ranks if t.rank == 2]
    assert t.held_seconds / v.compared_seconds == pytest.approx(0.21, abs=0.01)


@pytest.mark.parametrize("quota", [None, CpuQuota("/bds26293-r2", 5000, 100_000, 47, 0, 0.0)])
def test_the_same_lateness_without_throttling_is_jitter(quota: CpuQuota | None) -> None:
    v = compare(job(quota))
    assert v.stragglers == () and v.within_noise
