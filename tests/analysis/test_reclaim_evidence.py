"""A thread's time in direct memory reclaim (the sched track's "memory reclaim" slices) is
memory, not its own work: the evidence takes it out of the run-up's time on a CPU, less the
off-CPU slices inside it, and the verdict says it beside the limit's other costs.

Files with known times, as the capture writes them (tests/tracing/test_capture_reclaim.py
records real ones)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_wake_after_disk import STEPS, evidence, rank_file, sched

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import MemoryCgroup, RankEvidence

RECLAIM_US = 30_000.0  # in reclaim before each collective...
INSIDE_US = 10_000.0  # ... of which off-CPU in D (waiting for writeback)


def trace(tmp_path: Path, rank: int, late_us: float, world: int = 4) -> str:
    """A rank's file (`rank_file`): with ``late_us``, before each collective a reclaim of
    `RECLAIM_US` with `INSIDE_US` asleep in D inside it, and asleep 50 ms a step (the
    others 100 ms)."""

    def before(at: float) -> list[dict[str, Any]]:
        # Asleep 100 ms of each step; the late rank 50 ms, working the rest longer.
        out = [
            sched(at - 190_000, 50_000.0 if late_us else 100_000.0,
                  "blocked: sleep (clock_nanosleep)",
                  {"state": "S", "cause": "sleep", "syscall": "clock_nanosleep"})
        ]  # fmt: skip
        if late_us:
            start = at - 40_000
            out += [
                sched(start, RECLAIM_US, "memory reclaim", {"cause": "memory reclaim"}),
                sched(start + 5_000, INSIDE_US, "blocked: disk/uninterruptible",
                      {"state": "D", "cause": "disk/uninterruptible", "syscall": "pread64"}),
            ]  # fmt: skip
        return out

    return rank_file(tmp_path / f"r{rank}.json", rank, world, late_us, before)


def test_reclaim_is_taken_out_of_the_run_up_s_work_less_its_off_cpu_time(tmp_path: Path) -> None:
    late = evidence(trace(tmp_path, 1, late_us=50_000.0))
    healthy = evidence(trace(tmp_path, 0, late_us=0.0))
    for mine, theirs in zip(late.collectives[1:], healthy.collectives[1:], strict=True):
        before = {t.cause: t.seconds for t in mine.before}
        # The run-up is 200 ms: 50 asleep, 10 in D inside the reclaim, 20 reclaiming on
        # its CPU; the rest (120 ms) its own work.
        assert before == {
            "sleep": pytest.approx(0.050),
            "disk": pytest.approx(INSIDE_US / 1e6),
            "memory": pytest.approx((RECLAIM_US - INSIDE_US) / 1e6),
            "on_cpu": pytest.approx(0.120),
        }
        assert {t.cause for t in theirs.before} == {"sleep", "on_cpu"}


def test_the_verdict_says_the_timed_reclaim_beside_the_limit(tmp_path: Path) -> None:
    """Rank 1, 50 ms late to each collective under its own limit: its D waits (10 ms), its
    reclaim on its CPU (20 ms) and its 20 ms more work than the others (reading pages back)
    are the limit's."""
    ranks = [evidence(trace(tmp_path, r, 50_000.0 if r == 1 else 0.0)) for r in range(4)]
    worked = extra_work(ranks)
    ranks[1] = replace(
        ranks[1], memory_cgroups=(MemoryCgroup("/job/rank1", 16 << 20, 900, 4000, 0, 0.0),)
    )
    v = compare(ranks)
    [f] = v.stragglers
    assert (f.rank, f.kind) == (1, "late")
    assert [c.cause for c in f.causes] == ["memory"]
    assert f.causes[0].seconds == pytest.approx(STEPS * 0.050)  # all it lost
    assert f.causes[0].detail == (
        "cgroup /job/rank1 at its 16.0 MiB limit 900 times: 4000 pages read again after "
        f"reclaim, 0 major faults; 100.0 ms of it reclaiming pages on its CPU, "
        f"{worked * 1000:.1f} ms more on its CPU (reading pages back)"
    )


def extra_work(ranks: list[RankEvidence]) -> float:
    """Rank 1's time on a CPU beyond rank 0's (every other rank's the same), over its
    collectives."""

    def on_cpu(ev: RankEvidence) -> list[float]:
        return [next(t.seconds for t in c.before if t.cause == "on_cpu") for c in ev.collectives]

    return sum(a - b for a, b in zip(on_cpu(ranks[1]), on_cpu(ranks[0]), strict=True))


def test_reclaim_without_a_limit_of_its_own_is_named_memory_alone(tmp_path: Path) -> None:
    """The node short of memory (no limit of the rank's own): its reclaim is memory, its
    extra work stays its own."""
    ranks = [evidence(trace(tmp_path, r, 50_000.0 if r == 1 else 0.0)) for r in range(4)]
    [f] = compare(ranks).stragglers
    causes = {c.cause: (round(c.seconds, 6), c.detail) for c in f.causes}
    assert causes["memory"] == (pytest.approx(0.1), "reclaiming pages on its CPU 100.0 ms")
    assert causes["on_cpu"][0] == pytest.approx(min(STEPS * 0.050, extra_work(ranks)))
