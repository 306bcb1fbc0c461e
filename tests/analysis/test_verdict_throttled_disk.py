"""A rank that reads a little from a throttled disk each step, on a CPU it shares with other
ranks of the job, is named for its disk — not for its waits for that CPU.

The shape of the matrix's 1 MiB a step at 20 MB/s (tests/bench/bench_verdict_matrix.py,
class ``disk-20``), from its kept files: the rank slept 2.5 ms a step on the disk (the
throttle let most of each read through at once), ran 0.6 ms longer, and waited 18 ms a step
for its CPU against the others' 9 ms, a third of that for its own gloo threads (busy taking
in the other ranks' data when it reached each collective late) and the job's other ranks;
it arrived 4.5 ms after the others at every collective: 9 % of the compared time. The
verdict said "waiting for a CPU" first, held by its own gloo thread. The waits for the
job's own threads are the reads' (`_shared_cpu`), and uninterruptible disk waits no healthy
rank has name it under `MIN_SHARE` (`EVIDENCED_MIN_SHARE`).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_verdict_kernel_causes import RANKS, collective, rank

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import CauseTime, MemoryCgroup, RankEvidence

N = 20
STEP_MS = 50.0
LATE_MS = 4.5
SLOW = 1  # the rank that reads, pid 101
OTHERS = {"sleep": 0.030, "on_cpu": 0.0014, "cpu_wait": 0.009}
#: Who held the others' CPUs in each run-up: another job's process, mostly.
OTHERS_HELD = {"python (pid 9000)": 0.0055, "gloo_tcp_loop (pid 100)": 0.002}


def job(disk_s: float, slow_held: dict[str, float], late_ms: float = LATE_MS) -> list[RankEvidence]:
    """4 ranks (pids 100-103), `N` all-reduces `STEP_MS` apart, each ending 10 ms after the
    others' arrival; rank `SLOW` arrives ``late_ms`` late to each, its run-up: ``disk_s`` on
    the disk, 0.6 ms more on a CPU and 18 ms waiting for it, held by ``slow_held``."""
    out = []
    for r in range(RANKS):
        late = r == SLOW
        before = (
            {"sleep": 0.030, "on_cpu": 0.002, "cpu_wait": 0.018, "disk": disk_s} if late else OTHERS
        )
        held = slow_held if late else OTHERS_HELD
        cs = [
            replace(
                collective(i, i * STEP_MS + (late_ms if late else 0.0), i * STEP_MS + 10, before),
                holders=tuple(CauseTime(h, s) for h, s in held.items()),
            )
            for i in range(N)
        ]
        out.append(rank(r, cs))
    return out


#: The slow rank's waits for a CPU per run-up, as in the kept run: its own gloo thread 5.6
#: ms, another job's process 9 ms, rank 0 1 ms.
SLOW_HELD = {
    "gloo_tcp_loop (pid 101)": 0.0056,
    "python (pid 9000)": 0.009,
    "python (pid 100)": 0.001,
}


def test_a_rank_late_for_a_little_disk_on_a_shared_cpu_is_named_for_its_disk() -> None:
    v = compare(job(0.0025, SLOW_HELD))
    [f] = v.stragglers
    lost = N * LATE_MS / 1000
    assert (f.rank, f.kind) == (SLOW, "late")
    assert f.seconds == pytest.approx(lost)
    assert f.share == pytest.approx(lost / (((N - 1) * STEP_MS + 10) / 1000))
    assert f.share < 0.1  # under MIN_SHARE: named on the kernel's evidence
    # The waits for its own thread and rank 0 (6.6 of 15.6 ms held) moved to the disk: of
    # the 9 ms excess a run-up, 3.81 ms; the rest, held by the other job, stays a wait.
    moved = 0.009 * 6.6 / 15.6 * N
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("disk", pytest.approx(lost)),
        ("cpu_wait", pytest.approx(min(lost, 0.009 * N - moved))),
        ("on_cpu", pytest.approx(0.0006 * N)),
    ]
    assert f.causes[0].detail == (
        f"waited {moved * 1e3:.1f} ms for the CPU held by its own threads and rank 0"
    )
    assert f.causes[1].detail.startswith("the CPU was held by python (pid 9000) 100%")


def test_a_rank_late_for_its_disk_by_less_is_not_named() -> None:
    """The same run-ups, 1.5 ms late to each collective: 3 % of the compared time, under
    the disk's bar (6 %): no straggler."""
    v = compare(job(0.0025, SLOW_HELD, late_ms=1.5))
    assert v.stragglers == ()
    assert v.within_noise


def test_a_rank_late_for_reads_under_its_own_memory_limit_is_named_for_memory() -> None:
    """The same run-ups, the rank's own memory cgroup at its limit rereading pages (memory
    pressure: its disk waits are the limit's, and so is its 0.6 ms a run-up more on a CPU:
    reclaim runs on its own CPU): named for memory at 9 % as well."""
    cgroup = MemoryCgroup("/job/rank1", 32 << 20, 1450, 8600, 4, 0.0)
    job_ = job(0.0025, SLOW_HELD)
    job_[SLOW] = replace(job_[SLOW], memory_cgroups=(cgroup,))
    [f] = compare(job_).stragglers
    assert (f.rank, f.kind) == (SLOW, "late")
    assert [c.cause for c in f.causes] == ["memory", "cpu_wait"]
    assert f.causes[0].seconds == pytest.approx(N * LATE_MS / 1000)
    assert f.causes[0].detail.endswith(
        "; 12.0 ms of it on its CPU (reclaim and reading pages back)"
    )


def test_the_disk_comes_first_when_it_and_the_waits_each_explain_all_it_lost() -> None:
    """Its waits for a CPU held mostly by another job's process (12.6 of 15.6 ms a run-up):
    180 ms more than the others', 145 ms once those for its own thread are the disk's; its
    disk waits 60 ms and those 35 ms: each over the 90 ms it lost. The disk, which no other
    rank waited for, comes first; the waits every rank has come second."""
    held = {"gloo_tcp_loop (pid 101)": 0.003, "python (pid 9000)": 0.0126}
    [f] = compare(job(0.003, held)).stragglers
    lost = N * LATE_MS / 1000
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("disk", pytest.approx(lost)),
        ("cpu_wait", pytest.approx(lost)),
        ("on_cpu", pytest.approx(0.0006 * N)),
    ]
    moved = 0.009 * N * 3 / 15.6
    assert 0.003 * N + moved < 0.009 * N - moved  # the waits' excess is the larger


def test_waits_for_the_job_s_own_threads_are_no_evidence_of_a_cause_outside_it() -> None:
    """Late 4.5 ms to each collective (9 %), nothing but 9 ms more waits for a CPU a run-up
    (no work of its own, no disk): held 53 % by its own gloo thread and rank 0, the rest by
    another job's process (a healthy windows-apart run's shape), it is not named; held 80 %
    by that process, it is (waits for a CPU held outside the job, from 6 %)."""

    def late(held: dict[str, float]) -> list[RankEvidence]:
        out = job(0.0, held)
        out[SLOW] = replace(
            out[SLOW],
            collectives=tuple(
                replace(c, before=tuple(b for b in c.before if b.cause != "on_cpu"))
                for c in out[SLOW].collectives
            ),
        )
        return out

    mostly_job = {
        "gloo_tcp_loop (pid 101)": 0.0066,
        "python (pid 100)": 0.0016,
        "x (pid 9000)": 0.0073,
    }
    assert compare(late(mostly_job)).stragglers == ()
    mostly_outside = {"gloo_tcp_loop (pid 101)": 0.0031, "x (pid 9000)": 0.0124}
    [f] = compare(late(mostly_outside)).stragglers
    assert (f.rank, f.causes[0].cause) == (SLOW, "cpu_wait")
