"""The kernel's work on a rank's CPU in the file reads it slept in is the reads' cost.

A rank whose page cache was evicted reads its samples from the disk: each read sleeps in D
for the disk and, on its CPU, fills the page cache and copies the data, which the other
ranks (finding the pages in memory) do not do. The sched track's slices carry the thread's
system CPU time since its previous slice (``system_us``); the evidence counts the system
time that came just before a disk sleep with the disk, not as the rank's own work. Before
that, a rank refilling evicted pages on a slower host was named "on a CPU: its own work
took longer" first and the disk second.

The files are the sched track as the capture writes it, with known times
(tests/tracing/test_capture_bpf.py records real ones).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_wake_after_disk import HOG, STEPS, evidence, rank_file, sched

from bpfdyno.analysis.verdict import compare

READS = 10  # file reads before each collective...
READ_US = 3_000.0  # ... each asleep this long on the disk...
SYSTEM_US = 4_000  # ... after this much system CPU time on its CPU (a tick at 250 Hz)
USER_US = 6_000  # ... and this much user time
LATE_US = 80_000.0


def trace(
    tmp_path: Path,
    rank: int,
    late: bool,
    system_us: int = SYSTEM_US,
    preempted_in: str = "",
    world: int = 4,
) -> str:
    """A rank's file: the others asleep 100 ms a step; with ``late``, asleep 20 ms on a
    futex (48 ms of user and 2 ms of system time before it: not a read) and reading `READS`
    times from the disk (pread64), each read's sleep with ``system_us`` of system and
    `USER_US` of user time before it. With ``preempted_in``, also preempted once for 1 ms
    inside that system call, after 10 ms of system time."""

    def before(at: float) -> list[dict[str, Any]]:
        if not late:
            return [
                sched(at - 190_000, 100_000.0, "blocked: sleep (clock_nanosleep)",
                      {"state": "S", "cause": "sleep", "syscall": "clock_nanosleep"})
            ]  # fmt: skip
        out = [
            sched(at - 190_000, 20_000.0, "blocked: lock (futex)",
                  {"state": "S", "cause": "lock", "syscall": "futex", "user_us": 48_000,
                   "system_us": 2_000})
        ]  # fmt: skip
        for k in range(READS):
            out.append(
                sched(at - 120_000 + k * 10_000, READ_US, "blocked: disk/uninterruptible",
                      {"state": "D", "cause": "disk/uninterruptible", "syscall": "pread64",
                       "user_us": USER_US, "system_us": system_us})
            )  # fmt: skip
        if preempted_in:
            out.append(
                sched(at - 15_000, 1_000.0, "runnable: preempted",
                      {"state": "R", "cause": "runnable", "syscall": preempted_in,
                       "user_us": 0, "system_us": 10_000, **HOG})
            )  # fmt: skip
        return out

    return rank_file(tmp_path / f"r{rank}.json", rank, world, LATE_US if late else 0.0, before)


def test_system_time_before_a_disk_sleep_counts_with_the_disk(tmp_path: Path) -> None:
    ev = evidence(trace(tmp_path, 1, late=True))
    for c in ev.collectives[1:]:  # each a whole 200 ms run-up
        before = {t.cause: (t.seconds, t.detail) for t in c.before}
        # 150 ms on a CPU, charged 150 ms of ticks: 40 ms of them system time before the
        # disk sleeps. So 30 + 40 ms the disk's; the futex wait's 2 ms of system time
        # before it stays its work: 150 - 40 = 110 ms.
        assert before == {
            "disk": (pytest.approx(READS * READ_US / 1e6), "pread64"),
            "disk_cpu": (pytest.approx(READS * SYSTEM_US / 1e6), ""),
            "lock": (pytest.approx(0.020), "futex"),
            "on_cpu": (pytest.approx(0.110), ""),
        }


def test_the_reads_share_of_the_ticks_is_their_share_of_the_time_on_a_cpu(
    tmp_path: Path,
) -> None:
    """Ticks are whole, and time stolen by the hypervisor is charged to no one: the ticks
    need not add up to the time on a CPU. Reads charged 20 ms of system time each (200 ms)
    of 310 ms of ticks, in a run-up 150 ms on a CPU: 200/310 of it is the reads'."""
    ev = evidence(trace(tmp_path, 1, late=True, system_us=20_000))
    reads = 0.150 * 200 / 310
    for c in ev.collectives[1:]:
        before = {t.cause: t.seconds for t in c.before}
        assert before == {
            "disk": pytest.approx(0.030),
            "disk_cpu": pytest.approx(reads),
            "on_cpu": pytest.approx(0.150 - reads),
            "lock": pytest.approx(0.020),
        }


@pytest.mark.parametrize(("inside", "counted"), [("pread64", True), ("write", False)])
def test_a_preemption_inside_the_reads_system_call_counts_with_them(
    tmp_path: Path, inside: str, counted: bool
) -> None:
    """Preempted inside pread64, the call its disk sleeps were in: the system time before
    it is the reads' too; inside write, it is not (and the wait is the CPU's either way)."""
    ev = evidence(trace(tmp_path, 1, late=True, preempted_in=inside))
    # 149 ms on a CPU (1 ms preempted), 160 ms of ticks: 40 ms before the disk sleeps,
    # 10 ms before the preemption.
    reads = 0.149 * (50 if counted else 40) / 160
    for c in ev.collectives[1:]:
        before = {t.cause: t.seconds for t in c.before}
        assert before == {
            "disk": pytest.approx(0.030),
            "disk_cpu": pytest.approx(reads),
            "on_cpu": pytest.approx(0.149 - reads),
            "lock": pytest.approx(0.020),
            "cpu_wait": pytest.approx(0.001),
        }


def test_a_rank_refilling_evicted_pages_is_named_for_the_disk_first(tmp_path: Path) -> None:
    """Rank 2 is 80 ms late to each collective: 30 ms more asleep on the disk and 50 ms
    more on its CPU than the others, 40 ms of it in the reads. Without counting that with
    the disk, its own work (50 ms) came first and the disk (30 ms) second."""
    ranks = [evidence(trace(tmp_path, r, late=r == 2)) for r in range(4)]
    v = compare(ranks)
    [f] = v.stragglers
    assert (f.rank, f.kind) == (2, "late")
    # Collectives 2-5 have whole run-ups: 70 ms each the disk's, 20 ms of lock waits the
    # others do not have, and 110 ms on a CPU against their 100 ms. The first starts at the
    # window, 190 ms long: 140 ms on a CPU, 40/150 of it the reads'.
    first_reads = 0.030 + 0.140 * 40 / 150
    assert [c.cause for c in f.causes] == ["disk", "lock", "on_cpu"]
    assert f.causes[0].seconds == pytest.approx((STEPS - 1) * 0.070 + first_reads)
    on_cpu = (STEPS - 1) * 0.040 + first_reads - 0.030
    assert f.causes[0].detail == f"pread64, {on_cpu * 1e3:.1f} ms of it on its CPU in the reads"
    assert f.causes[1].seconds == pytest.approx(STEPS * 0.020)
