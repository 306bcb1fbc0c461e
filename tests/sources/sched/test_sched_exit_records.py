"""How the scheduler collector merges a walk of live threads with the exit records drained
after it, in user space, on records in the kernel's layout (`TASK_RECORD`).

The exit program leaves no mark on an exiting thread, so a thread between its exit record
and its removal from the task list is still walked: these tests give the collector such
walks and records directly (the kernel window is microseconds wide; the BPF tests in
test_sched_bpf.py run the programs themselves).
"""

from __future__ import annotations

from bpfdyno.sources.sched.collector import TASK_RECORD, SchedCollector, exit_ring_pages

TGID = 4242
COMM = b"trainer".ljust(16, b"\0")


def rec(tid: int, start: int, oncpu: int) -> bytes:
    """One thread's books: on-CPU ``oncpu`` ns, nothing else, started at ``start``."""
    return TASK_RECORD.pack(tid, TGID, oncpu, 0, 0, 0, 0, start, COMM)


def oncpu_after(c: SchedCollector, walk: list[bytes], exited: list[bytes]) -> tuple[int, int]:
    """(on-CPU ns, threads) of the process after a walk and the drain that followed it."""
    c._refresh_processes(b"".join(walk), b"".join(exited), (), 1.0)
    p = c._procs[TGID]
    return p.oncpu_ns, p.threads


def test_a_thread_walked_after_its_exit_was_drained_is_not_counted_twice() -> None:
    c = SchedCollector()
    leader = rec(TGID, 1, 1_000)
    # Round 1: the walk sees the leader and thread 7; thread 7 exits after the walk.
    assert oncpu_after(c, [leader, rec(7, 50, 300)], [rec(7, 50, 400)]) == (1_400, 1)
    # Round 2: thread 7 is still on the task list (its exit not complete): not live again.
    assert oncpu_after(c, [leader, rec(7, 50, 400)], []) == (1_400, 1)
    # Round 3: still there, a round later.
    assert oncpu_after(c, [leader, rec(7, 50, 400)], []) == (1_400, 1)
    # Round 4: gone; the record is forgotten once a walk no longer finds its thread.
    assert oncpu_after(c, [leader], []) == (1_400, 1)
    assert len(c._recorded) == 0


def test_a_record_drained_in_a_round_without_a_walk_still_drops_the_next_walks_books() -> None:
    c = SchedCollector()
    leader = rec(TGID, 1, 1_000)
    assert oncpu_after(c, [leader], []) == (1_000, 1)
    # A round without a walk drains thread 9's exit ...
    c._record_exits(rec(9, 60, 250), ())
    # ... and the next walk still finds thread 9: counted once, from its record.
    assert oncpu_after(c, [leader, rec(9, 60, 250)], []) == (1_250, 1)


def test_a_reused_tid_is_another_thread() -> None:
    c = SchedCollector()
    leader = rec(TGID, 1, 1_000)
    assert oncpu_after(c, [leader, rec(7, 50, 300)], [rec(7, 50, 400)]) == (1_400, 1)
    # Thread 7 is gone; a new thread got tid 7 (another start time): it is live.
    assert oncpu_after(c, [leader, rec(7, 90, 20)], []) == (1_420, 2)
    # It exits after the next walk: both threads 7 counted, each once.
    assert oncpu_after(c, [leader, rec(7, 90, 30)], [rec(7, 90, 35)]) == (1_435, 1)


def test_the_exit_ring_holds_max_exits_records_in_a_power_of_two_of_pages() -> None:
    record = TASK_RECORD.size + 8  # the kernel's 8-byte header before each record
    for max_exits in (1, 2, 51, 52, 123, 65_536):
        pages = exit_ring_pages(max_exits)
        assert pages & (pages - 1) == 0
        assert pages * 4096 // record >= max_exits
        assert pages == 1 or (pages // 2) * 4096 // record < max_exits
    assert exit_ring_pages(65_536) == 2048  # 8 MiB
