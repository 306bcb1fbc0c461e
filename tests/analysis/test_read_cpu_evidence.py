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
from test_wake_after_disk import STEPS, evidence, rank_file, sched

from bpfdyno.analysis.verdict import compare

READS = 10  # file reads before each collective...
READ_US = 3_000.0  # ... each asleep this long on the disk...
SYSTEM_US = 4_000  # ... after this much system CPU time on its CPU (a tick at 250 Hz)
LATE_US = 80_000.0


def trace(tmp_path: Path, rank: int, late: bool, system_us: int = SYSTEM_US, world: int = 4) -> str:
    """A rank's file: the others asleep 100 ms a step; with ``late``, asleep 20 ms and
    reading `READS` times from the disk, each read's sleep carrying ``system_us`` of system
    time before it, and the sleep's 2 ms more (a futex wait, not a read)."""

    def before(at: float) -> list[dict[str, Any]]:
        if not late:
            return [
                sched(at - 190_000, 100_000.0, "blocked: sleep (clock_nanosleep)",
                      {"state": "S", "cause": "sleep", "syscall": "clock_nanosleep"})
            ]  # fmt: skip
        out = [
            sched(at - 190_000, 20_000.0, "blocked: lock (futex)",
                  {"state": "S", "cause": "lock", "syscall": "futex", "system_us": 2_000})
        ]  # fmt: skip
        for k in range(READS):
            out.append(
                sched(at - 120_000 + k * 10_000, READ_US, "blocked: disk/uninterruptible",
                      {"state": "D", "cause": "disk/uninterruptible", "syscall": "pread64",
                       "system_us": system_us})
            )  # fmt: skip
        return out

    return rank_file(tmp_path / f"r{rank}.json", rank, world, LATE_US if late else 0.0, before)


def test_system_time_before_a_disk_sleep_counts_with_the_disk(tmp_path: Path) -> None:
    ev = evidence(trace(tmp_path, 1, late=True))
    for c in ev.collectives[1:]:  # each a whole 200 ms run-up
        before = {t.cause: (t.seconds, t.detail) for t in c.before}
        # Asleep 30 ms on the disk and 40 ms in the reads on its CPU: 70 ms the disk's; the
        # futex wait's 2 ms of system time before it stays its work: 200 - 20 - 70 = 110.
        assert before == {
            "disk": (pytest.approx((READS * READ_US + READS * SYSTEM_US) / 1e6), "pread64"),
            "lock": (pytest.approx(0.020), "futex"),
            "on_cpu": (pytest.approx(0.110), ""),
        }


def test_the_reads_time_on_a_cpu_is_never_more_than_the_run_up_s(tmp_path: Path) -> None:
    """Ticks are whole: short runs can be charged more than they ran. 10 reads charged
    20 ms each (200 ms) in a run-up with 150 ms on a CPU count 150 ms, no more."""
    ev = evidence(trace(tmp_path, 1, late=True, system_us=20_000))
    for c in ev.collectives[1:]:
        before = {t.cause: t.seconds for t in c.before}
        assert before == {"disk": pytest.approx(0.180), "lock": pytest.approx(0.020)}


def test_a_rank_refilling_evicted_pages_is_named_for_the_disk_first(tmp_path: Path) -> None:
    """Rank 2 is 80 ms late to each collective: 30 ms more asleep on the disk and 50 ms
    more on its CPU than the others, 40 ms of it in the reads. Without counting that with
    the disk, its own work (50 ms) came first and the disk (30 ms) second."""
    ranks = [evidence(trace(tmp_path, r, late=r == 2)) for r in range(4)]
    v = compare(ranks)
    [f] = v.stragglers
    assert (f.rank, f.kind) == (2, "late")
    # Each run-up (the first one's too: it starts at the window, before the reads) has
    # 70 ms the disk's, 20 ms of lock waits the others do not have, and 110 ms on a CPU
    # against their 100 ms: 10 ms more of its own work.
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("disk", round(STEPS * 0.070, 6)),
        ("lock", round(STEPS * 0.020, 6)),
        ("on_cpu", round(STEPS * 0.010, 6)),
    ]
