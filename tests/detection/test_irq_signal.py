"""The interrupt share of a rank, piece by piece with known inputs: each CPU's share of an
interval from the interrupt collector's cumulative books, where a process's threads ran from
their stat files, the weighted share, and the share on the wire between agents."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from bpfdyno.detection.irq_signal import (
    FROM_TICKS,
    TICK_NS,
    CpuInterruptShares,
    interrupt_ns,
    last_cpu,
    placement,
    rank_share,
    stat_interrupt_ns,
)
from bpfdyno.detection.signals import RankSignals, from_record, to_record
from bpfdyno.rpc.detection import RankSignal
from bpfdyno.rpc.wire import from_pb, to_pb
from bpfdyno.sources.irq.collector import SOFTIRQS, CpuInterrupts


def books(hard_ns: int, net_rx_ns: int, timer_ns: int = 0) -> CpuInterrupts:
    """One CPU's cumulative books: handler time, NET_RX and TIMER softirq time."""
    soft = [0] * len(SOFTIRQS)
    soft[SOFTIRQS.index("NET_RX")] = net_rx_ns
    soft[SOFTIRQS.index("TIMER")] = timer_ns
    return CpuInterrupts(tuple(soft), (0,) * len(SOFTIRQS), hard_ns, 0)


class Readings:
    """The collector's answers to successive readings (None: not known, as while the budget
    holds its programs detached), each read at the next clock time."""

    def __init__(self, answers: list[Mapping[int, CpuInterrupts] | None], times: list[float]):
        self._answers: Iterator[Mapping[int, CpuInterrupts] | None] = iter(answers)
        self._times = iter(times)

    def cpu_interrupt_times(self) -> Mapping[int, CpuInterrupts] | None:
        return next(self._answers)

    def clock(self) -> float:
        return next(self._times)


def test_a_cpu_s_share_is_its_handler_and_softirq_time_over_the_interval() -> None:
    assert interrupt_ns(books(1_000, 20_000, 300)) == 21_300
    r = Readings(
        [
            {0: books(1_000_000, 10_000_000), 1: books(0, 0)},
            # Over 2 s: CPU 0 0.1 s more in handlers and 0.3 s in NET_RX, 0.05 s in TIMER;
            # CPU 1 1.2 s in NET_RX; CPU 2 is new (no base).
            {
                0: books(101_000_000, 310_000_000, 50_000_000),
                1: books(0, 1_200_000_000),
                2: books(5, 5),
            },
        ],
        [10.0, 12.0],
    )
    shares = CpuInterruptShares(r, r.clock)
    assert shares.sample() is None  # the base
    assert shares.sample() == {0: pytest.approx(0.225), 1: pytest.approx(0.6)}
    assert shares.error == ""


def test_shares_are_not_known_while_the_collector_gives_nothing_and_restart_after() -> None:
    r = Readings(
        [{0: books(0, 0)}, None, {0: books(0, 500_000_000)}, {0: books(0, 700_000_000)}],
        [1.0, 3.0, 4.0, 6.0],
    )
    shares = CpuInterruptShares(r, r.clock)  # no tick-counted books to fall back on
    assert shares.sample() is None
    assert shares.sample() is None
    assert shares.error == ("the irq collector's softirq and interrupt-handler times are not known")
    # The counts may have stood still meanwhile: the first reading after is a new base, not
    # 0.5 s over the 3 s since the one before.
    assert shares.sample() is None
    assert shares.error == ""
    assert shares.sample() == {0: pytest.approx(0.1)}


def test_while_the_collector_gives_nothing_the_kernel_s_tick_counted_books_estimate_it() -> None:
    """The budget detached the interrupt programs (as a storm of interrupts may make it do):
    each CPU's share comes from /proc/stat's irq and softirq time meanwhile, said to be an
    estimate, and from the collector's books again once they have a new base."""
    r = Readings(
        [{0: books(0, 0), 1: books(0, 0)}, None, {0: books(0, 5)}, {0: books(0, 100_000_005)}],
        [10.0, 12.0, 14.0, 16.0],
    )
    ticks = iter(
        [
            {0: 0, 1: 0},
            {0: 600_000_000, 1: 20_000_000},  # 2 s: 0.3 and 0.01 of them in interrupts
            {0: 1_000_000_000, 1: 40_000_000},  # and 0.2: the collector's base, not its share
            {0: 1_130_000_000, 1: 60_000_000},  # not used: the collector's books are back
        ]
    )
    shares = CpuInterruptShares(r, r.clock, lambda: next(ticks))
    assert shares.sample() is None  # the base
    assert shares.sample() == {0: pytest.approx(0.3), 1: pytest.approx(0.01)}
    assert (shares.error, shares.estimated) == ("", FROM_TICKS)
    assert shares.sample() == {0: pytest.approx(0.2), 1: pytest.approx(0.01)}
    assert shares.estimated == FROM_TICKS
    assert shares.sample() == {0: pytest.approx(0.05)}  # exact again (CPU 1: no books)
    assert shares.estimated == ""


def test_the_tick_counted_books_are_proc_stat_s_irq_and_softirq_times(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(
        "cpu  10 0 20 300 4 5 60 0 0 0\n"
        "cpu0 5 0 10 150 2 2 40 0 0 0\n"
        "cpu1 5 0 10 150 2 3 20 0 0 0\n"
        "ctxt 1\nbtime 2\nprocesses 3\nprocs_running 1\nprocs_blocked 0\n"
    )
    assert stat_interrupt_ns(proc) == {0: 42 * TICK_NS, 1: 23 * TICK_NS}
    assert stat_interrupt_ns(tmp_path / "none" / "proc") is None


def stat_line(tid: int, comm: str, cpu: int) -> str:
    """A task's stat line with ``cpu`` in field 39 (processor)."""
    rest = ["S"] + [str(i) for i in range(4, 39)] + [str(cpu)] + ["0"] * 13
    return f"{tid} ({comm}) {' '.join(rest)}\n"


def task_dir(tmp_path: Path, cpus: dict[int, int]) -> str:
    for tid, cpu in cpus.items():
        d = tmp_path / str(tid)
        d.mkdir()
        # A comm with ") " in it: the fields start after the last ')'.
        (d / "stat").write_text(stat_line(tid, "pt) main 3", cpu))
    return str(tmp_path)


def test_last_cpu_is_field_39_of_the_thread_s_stat(tmp_path: Path) -> None:
    tasks = task_dir(tmp_path, {100: 7})
    assert last_cpu(tasks, "100") == 7
    assert last_cpu(tasks, "101") is None  # gone


def test_threads_weigh_their_on_cpu_time_at_the_cpu_they_last_ran_on(tmp_path: Path) -> None:
    tasks = task_dir(tmp_path, {100: 1, 101: 1, 102: 0, 103: 0, 104: 3})
    before = {"100": 1_000, "101": 5_000, "102": 0, "103": 900, "104": 50}
    after = {
        "100": 301_000,  # 0.3 ms on CPU 1
        "101": 105_000,  # 0.1 ms on CPU 1
        "102": 200_000,  # 0.2 ms on CPU 0
        "103": 900,  # did not run: its CPU 0 weighs nothing for it
        "104": 50,  # did not run either
        "105": 10_000,  # new in the interval, no base: from its next one
    }
    assert placement(tasks, "100", before, after) == {1: 400_000.0, 0: 200_000.0}


def test_a_process_none_of_whose_threads_ran_weighs_its_main_thread_s_cpu(
    tmp_path: Path,
) -> None:
    tasks = task_dir(tmp_path, {100: 1, 101: 0})
    same = {"100": 5, "101": 7}
    assert placement(tasks, "100", same, same) == {1: 1.0}


def test_the_rank_s_share_is_its_cpus_shares_weighted_by_where_it_ran() -> None:
    # 0.3 ms on CPU 0 (10 % interrupts), 0.1 ms on CPU 1 (50 %): (0.03 + 0.05) / 0.4 = 0.2.
    assert rank_share({0: 3e5, 1: 1e5}, {0: 0.1, 1: 0.5}) == (pytest.approx(0.2), 0)
    # A CPU without a share (came online in the interval) is left out of the weights.
    assert rank_share({0: 3e5, 5: 1e9}, {0: 0.1, 1: 0.5}) == (pytest.approx(0.1), 0)
    # Ties: the lowest CPU is the one it ran on most.
    assert rank_share({3: 1.0, 2: 1.0}, {2: 0.0, 3: 0.4}) == (pytest.approx(0.2), 2)
    share, cpu = rank_share({4: 1.0}, {0: 0.1})
    assert math.isnan(share) and cpu == -1


def signal(interrupt_s: float, interrupt_cpu: int) -> RankSignals:
    return RankSignals(
        job_id="7",
        rank=2,
        pid=1002,
        end_mono=0.0,
        interval_s=5.0,
        oncpu_s=1.0,
        runq_wait_s=0.1,
        main_waiting_s=4.0,
        throttled_s=0.0,
        io_bytes=1,
        interrupt_s=interrupt_s,
        interrupt_cpu=interrupt_cpu,
    )


def test_the_share_travels_between_agents_and_unknown_stays_unknown() -> None:
    record = to_record(signal(2.1, 1), "node-a", 100.0)
    assert (record.interrupt_seconds, record.interrupt_cpu) == (2.1, 1)
    back = from_record(from_pb(RankSignal, to_pb(record)))
    assert (back.interrupt_s, back.interrupt_cpu) == (2.1, 1)
    assert back.interrupt_share == pytest.approx(0.42)
    # CPU 0 is a CPU, not "unset".
    zero = from_record(from_pb(RankSignal, to_pb(to_record(signal(0.0, 0), "node-a", 1.0))))
    assert (zero.interrupt_s, zero.interrupt_cpu) == (0.0, 0)
    unknown = to_record(signal(float("nan"), -1), "node-a", 100.0)
    assert (unknown.interrupt_seconds, unknown.interrupt_cpu) == (None, None)
    back = from_record(from_pb(RankSignal, to_pb(unknown)))
    assert math.isnan(back.interrupt_share) and back.interrupt_cpu == -1


def test_a_thread_pinned_to_one_cpu_is_placed_there_without_its_stat(tmp_path: Path) -> None:
    # Thread 100 pinned to CPU 5 (its stat says 1: never read), 101 may run on two (its stat
    # says where it last ran), 102 is gone between the reads (its stat says 0).
    tasks = task_dir(tmp_path, {100: 1, 101: 3, 102: 0})
    pinned = {100: {5}, 101: {2, 3}}

    def affinity(tid: int) -> set[int]:
        if tid not in pinned:
            raise ProcessLookupError(tid)
        return pinned[tid]

    before = {"100": 0, "101": 0, "102": 0}
    after = {"100": 300, "101": 200, "102": 100}
    assert placement(tasks, "100", before, after, affinity) == {5: 300.0, 3: 200.0, 0: 100.0}


def test_the_threads_that_ran_least_are_left_out_past_95_percent(tmp_path: Path) -> None:
    # 1000 ns in all: the main thread's 900 and thread 101's 60 cover 96 %; thread 102's 40
    # (a pool thread's wakeup, on CPU 3) is not placed, nor its stat read.
    tasks = task_dir(tmp_path, {100: 0, 101: 1, 102: 3})
    before = {"100": 0, "101": 0, "102": 0}
    after = {"100": 900, "101": 60, "102": 40}
    assert placement(tasks, "100", before, after) == {0: 900.0, 1: 60.0}
    # Asked to cover all of it, it is placed too.
    assert placement(tasks, "100", before, after, cover=1.0) == {0: 900.0, 1: 60.0, 3: 40.0}
