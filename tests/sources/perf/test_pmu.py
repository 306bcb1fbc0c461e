"""Per-CPU perf counters: the real software counters, and the hardware path.

This machine kind has no hardware PMU, so the real hardware collector must be unavailable
with its reason. The hardware arithmetic (group reads, multiplex scaling, IPC, MIPS) is
exercised through the one thing that cannot exist here, the syscall: the opener hands out
pipes that carry exactly the bytes a perf group read returns.
"""

from __future__ import annotations

import errno
import math
import mmap
import os
import struct
import time
from collections.abc import Iterator

import pytest

from bpfdyno.core.metrics import Sample
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.perf.collector import PerfSwCollector, PmuCollector
from bpfdyno.sources.perf.perf_event import (
    PERF_FLAG_FD_CLOEXEC,
    READ_FORMAT,
    PerfEventAttr,
    online_cpus,
    perf_event_open,
)

pytestmark = pytest.mark.root


def _by(samples: list[Sample] | tuple[Sample, ...], name: str) -> dict[str, float]:
    return {dict(s.labels)["cpu"]: s.value for s in samples if s.spec.name == name}


def _hardware_pmu_present() -> bool:
    attr = PerfEventAttr(type=0, size=112, config=0, read_format=READ_FORMAT)
    try:
        os.close(perf_event_open(attr, -1, 0, -1, PERF_FLAG_FD_CLOEXEC))
    except OSError:
        return False
    return True


def test_hardware_collector_on_this_machine() -> None:
    pmu = PmuCollector()
    if _hardware_pmu_present():
        pmu.start()
        time.sleep(0.1)
        assert _by(list(pmu.collect()), "pmu_instructions_per_cycle")["all"] > 0
        pmu.close()
        return
    with pytest.raises(CollectorUnavailable) as err:
        pmu.start()
    assert str(err.value).startswith(
        "no hardware PMU: perf_event_open(cycles) failed with ENOENT; this machine (often a "
        "VM) exposes no hardware counters; enable the virtual PMU"
    )
    assert "perf_sw collector" in str(err.value)


def test_software_counters_see_touched_pages() -> None:
    ticks = iter([100.0, 101.0])  # one "second" between the two reads: rates == counts
    sw = PerfSwCollector(clock=lambda: next(ticks))
    sw.start()
    try:
        pages = 2000
        region = mmap.mmap(-1, pages * mmap.PAGESIZE)
        region.madvise(mmap.MADV_NOHUGEPAGE)  # one fault per page, not per huge page
        for i in range(pages):
            region[i * mmap.PAGESIZE] = 1
        # Sleeping switches this thread out and back in: context switches in the window
        # however quiet the machine is.
        for _ in range(5):
            time.sleep(0.002)
        samples = list(sw.collect())
        region.close()
    finally:
        sw.close()
    faults = _by(samples, "perf_page_faults_per_second")
    assert set(faults) == {str(c) for c in online_cpus()}
    assert sum(faults.values()) >= pages
    assert sum(_by(samples, "perf_context_switches_per_second").values()) > 0
    assert all(v >= 0 for v in _by(samples, "perf_major_page_faults_per_second").values())


def test_software_cpu_clock_runs_at_wall_speed() -> None:
    sw = PerfSwCollector()
    sw.start()
    time.sleep(0.3)
    samples = list(sw.collect())
    sw.close()
    clock = _by(samples, "perf_cpu_clock_seconds_per_second")
    assert all(0.9 < v < 1.1 for v in clock.values())
    with pytest.raises(RuntimeError, match="not started"):
        sw.collect()


class RecordingOpener:
    """The real perf_event_open, remembering the (config, cpu, fd) of every counter opened."""

    def __init__(self) -> None:
        self.opened: list[tuple[int, int, int]] = []

    def __call__(self, attr: PerfEventAttr, pid: int, cpu: int, group: int, flags: int) -> int:
        fd = perf_event_open(attr, pid, cpu, group, flags)
        self.opened.append((int(attr.config), cpu, fd))
        return fd

    def open_switch_counters(self) -> list[int]:
        """fds of context-switch counters (PERF_COUNT_SW_CONTEXT_SWITCHES) still open."""
        out = []
        for config, _, fd in self.opened:
            if config == 3:
                try:
                    os.fstat(fd)
                    out.append(fd)
                except OSError:
                    pass
        return out


def test_software_switches_from_another_source_open_no_counter_of_their_own() -> None:
    # The sched collector counts switches per CPU already: perf_sw takes its counts (here
    # known numbers) and makes the kernel count nothing more on each switch.
    cpus = online_cpus()
    counts = iter([{c: 1000 * (c + 1) for c in cpus}, {c: 1000 * (c + 1) + 50 + c for c in cpus}])
    ticks = iter([100.0, 102.0])  # two seconds between the reads
    opener = RecordingOpener()
    sw = PerfSwCollector(opener, clock=lambda: next(ticks), switch_counts=lambda: next(counts))
    sw.start()
    try:
        first = _by(list(sw.collect()), "perf_context_switches_per_second")
    finally:
        sw.close()
    assert opener.opened and not [o for o in opener.opened if o[0] == 3]
    assert set(first) == {str(c) for c in cpus}
    assert all(math.isnan(v) for v in first.values())  # the source's first counts: no rate
    sw2_counts = iter([{c: 10 for c in cpus}, {c: 110 + c for c in cpus}])
    ticks2 = iter([0.0, 1.0, 3.0])
    sw2 = PerfSwCollector(
        opener, clock=lambda: next(ticks2), switch_counts=lambda: next(sw2_counts)
    )
    sw2.start()
    try:
        sw2.collect()
        rates = _by(list(sw2.collect()), "perf_context_switches_per_second")
    finally:
        sw2.close()
    assert rates == {str(c): (100 + c) / 2 for c in cpus}


def test_software_switches_fall_back_to_a_counter_while_the_source_has_none() -> None:
    cpus = online_cpus()
    source: dict[int, int] | None = None
    opener = RecordingOpener()
    sw = PerfSwCollector(opener, switch_counts=lambda: source)
    sw.start()
    try:
        assert opener.open_switch_counters() == []  # nothing yet: the source may start
        sw.collect()  # the source has nothing: a counter of its own, from now on
        assert len(opener.open_switch_counters()) == len(cpus)
        for _ in range(5):
            time.sleep(0.002)  # switches on this CPU
        own = _by(list(sw.collect()), "perf_context_switches_per_second")
        assert sum(own.values()) > 0
        source = {c: 7 for c in cpus}  # the source started: its counter is closed
        sw.collect()
        assert opener.open_switch_counters() == []
        source = {c: 9 for c in cpus}
        time.sleep(0.01)
        rates = _by(list(sw.collect()), "perf_context_switches_per_second")
    finally:
        sw.close()
    assert all(v > 0 for v in rates.values())


def _group_read(enabled: int, running: int, *values: int) -> bytes:
    return struct.pack(f"<{3 + len(values)}Q", len(values), enabled, running, *values)


class FakePmuSyscall:
    """perf_event_open for a PMU that is not there: group leaders are pipes preloaded with
    the reads the kernel would return, members are /dev/null."""

    def __init__(self, reads: dict[int, list[bytes]], missing: tuple[int, ...] = ()) -> None:
        self.reads = reads
        self.missing = missing
        self.calls: list[tuple[int, int, int, int, int, int]] = []
        self.fds: list[int] = []

    def __call__(self, attr: PerfEventAttr, pid: int, cpu: int, group: int, flags: int) -> int:
        self.calls.append((attr.type, attr.config, attr.read_format, pid, cpu, group))
        if attr.config in self.missing:
            raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
        if group == -1:
            r, w = os.pipe()
            os.write(w, b"".join(self.reads[cpu]))
            os.close(w)
            fd = r
        else:
            fd = os.open(os.devnull, os.O_RDONLY)
        self.fds.append(fd)
        return fd

    def open_fds(self) -> list[int]:
        out = []
        for fd in self.fds:
            try:
                os.fstat(fd)
                out.append(fd)
            except OSError:
                pass
        return out


@pytest.fixture()
def ticks() -> Iterator[float]:
    return iter([10.0, 12.0])  # two seconds between the reads


def test_hardware_arithmetic_with_multiplexing(ticks: Iterator[float]) -> None:
    fake = FakePmuSyscall(
        {
            # CPU 0 ran its group all the time; CPU 1 only half the interval (multiplexed).
            0: [
                _group_read(10**9, 10**9, 1_000, 2_000, 10),
                _group_read(3 * 10**9, 3 * 10**9, 1_000 + 4 * 10**9, 2_000 + 6 * 10**9, 4_010),
            ],
            1: [
                _group_read(10**9, 10**9, 0, 0, 0),
                _group_read(3 * 10**9, 2 * 10**9, 10**9, 3 * 10**9, 500),
            ],
        }
    )
    pmu = PmuCollector(opener=fake, cpus=[0, 1], clock=lambda: next(ticks))
    pmu.start()
    samples = list(pmu.collect())
    assert _by(samples, "pmu_instructions_per_cycle") == {"0": 1.5, "1": 3.0, "all": 12 / 6}
    # CPU 1's counts scale by enabled/running = 2: 2e9 cycles, 6e9 instructions, 1000 misses.
    assert _by(samples, "pmu_million_instructions_per_second") == {
        "0": 3000.0,
        "1": 3000.0,
        "all": 6000.0,
    }
    assert _by(samples, "pmu_cycles_per_second") == {"0": 2e9, "1": 1e9}
    assert _by(samples, "pmu_cache_misses_per_second") == {"0": 2000.0, "1": 500.0}
    # One group per CPU: the leader (cycles) first, members attached to it, system-wide.
    leaders = [c for c in fake.calls if c[5] == -1]
    assert [(c[0], c[1], c[3], c[4]) for c in leaders] == [(0, 0, -1, 0), (0, 0, -1, 1)]
    assert {c[2] for c in fake.calls} == {READ_FORMAT}
    assert len(fake.calls) == 6
    pmu.close()
    assert fake.open_fds() == []


def test_hardware_without_cache_misses_still_reports_ipc(ticks: Iterator[float]) -> None:
    fake = FakePmuSyscall(
        {0: [_group_read(0, 0, 0, 0), _group_read(10**9, 10**9, 10**9, 2 * 10**9)]},
        missing=(3,),
    )
    pmu = PmuCollector(opener=fake, cpus=[0], clock=lambda: next(ticks))
    pmu.start()
    samples = list(pmu.collect())
    pmu.close()
    assert _by(samples, "pmu_instructions_per_cycle")["0"] == 2.0
    misses = _by(samples, "pmu_cache_misses_per_second")["0"]
    assert misses != misses  # NaN: not available, never 0


def test_counter_that_never_ran_is_nan_not_zero(ticks: Iterator[float]) -> None:
    fake = FakePmuSyscall({0: [_group_read(10**9, 0, 0, 0, 0), _group_read(2 * 10**9, 0, 0, 0, 0)]})
    pmu = PmuCollector(opener=fake, cpus=[0], clock=lambda: next(ticks))
    pmu.start()
    samples = list(pmu.collect())
    pmu.close()
    values = [s.value for s in samples if dict(s.labels)["cpu"] == "0"]
    assert values and all(v != v for v in values)


def test_refused_counters_name_the_fix() -> None:
    def refuse(attr: PerfEventAttr, pid: int, cpu: int, group: int, flags: int) -> int:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES))

    for collector in (PmuCollector(opener=refuse), PerfSwCollector(opener=refuse)):
        with pytest.raises(CollectorUnavailable, match=r"refused \(EACCES\); run as root"):
            collector.start()


def test_per_cpu_counters_are_read_every_few_rounds_on_a_big_node() -> None:
    # Every third round (a node past [daemon] per_cpu_series_max): nothing is read in
    # between, and the rates cover the whole time since the last read.
    ticks = iter([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    sw = PerfSwCollector(clock=lambda: next(ticks), per_cpu_every=3)
    sw.start()
    try:
        rounds = [sw.collect() for _ in range(6)]
    finally:
        sw.close()
    assert [bool(r) for r in rounds] == [False, False, True, False, False, True]
    clock_s = _by(list(rounds[2]), "perf_cpu_clock_seconds_per_second")
    assert set(clock_s) == {str(c) for c in online_cpus()}
