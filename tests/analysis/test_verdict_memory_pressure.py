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


def job(cgroups: dict[int, tuple[MemoryCgroup, ...]], on_cpu_ms: float = 0.0) -> Verdict:
    """Rank 3 arrives `LATE_MS` late to each of `N` collectives, in D (``disk``) that long
    in each run-up less ``on_cpu_ms``, which it runs longer than the others (10 ms);
    ``cgroups``: each rank's memory cgroups with a limit."""
    out = []
    for r in range(RANKS):
        late = LATE_MS if r == 3 else 0.0
        before = {"sleep": 0.1, "on_cpu": (10 + (on_cpu_ms if late else 0.0)) / 1000}
        if late:
            before["disk"] = (late - on_cpu_ms) / 1000
        cs = [collective(i, i * STEP + late, i * STEP + 80 + LATE_MS, before) for i in range(N)]
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


def test_the_extra_time_on_a_cpu_under_its_own_limit_is_reclaim() -> None:
    """Found in a fresh-clone run of the real job (a 16 MiB limit under a rank reading a
    64 MiB file): the kernel reclaimed at the limit 226,694 times on the rank's own CPU, and
    the verdict said "on a CPU: its own work took longer 2.73 s" first, the memory limit
    1.24 s second. Reclaim at a cgroup's limit runs on the CPU of the task that charges the
    page: under the limit, 40 of its 60 ms a run-up on a CPU beyond the others' are memory."""
    v = job({3: (OWN,)}, on_cpu_ms=40.0)
    [f] = v.stragglers
    assert [(c.cause, c.seconds) for c in f.causes] == [("memory", pytest.approx(1.2))]
    assert f.causes[0].detail == (
        "cgroup /job/rank3 at its 48.0 MiB limit 1450 times: 8600 pages read again after "
        "reclaim, 4 major faults; 800.0 ms of it on its CPU (reclaim and reading pages back)"
    )


def test_with_pressure_counters_reclaim_on_the_cpu_is_at_most_the_stall() -> None:
    """A cgroup v2 limit says how long its tasks stalled on memory (reclaim and pages read
    back): 0.9 s, of which its 0.4 s of disk waits; of its 0.8 s more on a CPU, 0.5 s is
    memory, the rest its own work."""
    v2 = MemoryCgroup("/job/rank3", 48 << 20, 1450, 8600, 4, 0.9)
    [f] = job({3: (v2,)}, on_cpu_ms=40.0).stragglers
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("memory", pytest.approx(0.9)),
        ("on_cpu", pytest.approx(0.3)),
    ]
    assert f.causes[0].detail.endswith(
        ", its tasks stalled 900.0 ms; 500.0 ms of it on its CPU (reclaim and reading pages back)"
    )


def test_without_its_own_limit_hit_the_extra_time_on_a_cpu_is_its_work() -> None:
    v = job({r: (MemoryCgroup("/node", 8 << 30, 90, 400, 0, 0.0),) for r in range(RANKS)},
            on_cpu_ms=40.0)  # fmt: skip
    [f] = v.stragglers
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("on_cpu", pytest.approx(0.8)),
        ("disk", pytest.approx(0.4)),
    ]
