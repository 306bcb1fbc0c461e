"""A gloo wait counted while it lasts (`wait_so_far`): the finished waits' total plus, for
each thread waiting now, the time since its wait began."""

from __future__ import annotations

import itertools

from bpfdyno.sources.gloo.waits import wait_so_far

S = 1_000_000_000  # ns


def test_no_wait_in_progress_is_the_finished_total() -> None:
    assert wait_so_far(3 * S, [], 100 * S) == 3 * S


def test_each_thread_waiting_now_adds_the_time_since_its_wait_began() -> None:
    # 2 s finished; one thread waiting since t=70 s, another since t=98.5 s; now t=100 s.
    assert wait_so_far(2 * S, [70 * S, 98 * S + S // 2], 100 * S) == 2 * S + 30 * S + 3 * S // 2


def test_a_rank_blocked_30_s_shows_a_full_interval_in_every_5_s_interval() -> None:
    # A thread enters its wait at t=1000 s and is still waiting at every reading: each 5 s
    # interval's difference is the whole 5 s, not 0 until the wait ends.
    start = 1000 * S
    readings = [wait_so_far(0, [start], start + i * 5 * S) for i in range(7)]
    assert [b - a for a, b in itertools.pairwise(readings)] == [5 * S] * 6
    # It ends at t=1032 s: the total then holds the 32 s, the last interval only its 2 s.
    assert wait_so_far(32 * S, [], 1035 * S) - readings[-1] == 2 * S


def test_a_wait_that_began_after_the_clock_was_read_counts_nothing_yet() -> None:
    assert wait_so_far(5, [200 * S], 100 * S) == 5
