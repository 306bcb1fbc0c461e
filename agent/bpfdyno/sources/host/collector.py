"""Host telemetry from procfs: CPU, memory, load, disks, NICs, uptime, process counts.

Rates and ratios come from the difference of two readings of the kernel's cumulative
counters, divided by the time between them on the injected monotonic clock, so the first
`collect()` returns only gauges. Choices made here:

- CPU ratios are each state's share of the ticks the CPU accounted in the interval (the sum
  of the eight states), not of wall time: ticks are sampled at USER_HZ, so dividing by wall
  time gives shares off by a few percent (and above 1); the accounted sum is what top(1)
  and psutil divide by too. A state whose counter stepped back counts as 0 (proc(5): iowait
  can decrease on tickless kernels); a CPU with nothing accounted is left out.
- A counter that went backwards (a wrap, a driver reload, a re-created interface) gives no
  rate for that series in that round — never a negative one — and the next round restarts
  from the new value. The counter widths differ (32-bit ``io_ticks``, 32-bit NIC counters
  on some drivers), so a wrap cannot be told from a reset.
- A device, interface or CPU seen for the first time has no rate until its second reading;
  one that disappears is simply no longer reported.
- ``memory_used_bytes`` is MemTotal - MemAvailable (what free(1) from procps-ng 4 prints);
  ``memory_cached_bytes`` is Cached + SReclaimable (free(1)'s "cache").
- Each source file is read on its own. A source that fails (missing, truncated, malformed)
  is left out of that round and reported through ``host_source_up{source}`` = 0, with one
  log line when it starts failing and one when it recovers; the other sources are still
  returned. Only when every source fails does
  `collect()` raise, so the daemon counts the error and shows the collector degraded.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from bpfdyno.core.metrics import MetricSpec, Sample, sample
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.host import procfs
from bpfdyno.sources.host.metrics import (
    CONTEXT_SWITCHES,
    CPU_STATE_RATIOS,
    CPU_UTILIZATION,
    DISK_BUSY,
    DISK_RATES,
    FORKS,
    LOAD_1M,
    LOAD_5M,
    LOAD_15M,
    MEMORY_AVAILABLE,
    MEMORY_BUFFERS,
    MEMORY_CACHED,
    MEMORY_FREE,
    MEMORY_TOTAL,
    MEMORY_USED,
    NET_RATES,
    PROCESSES,
    PROCS_BLOCKED,
    PROCS_RUNNING,
    SOURCE_UP,
    SWAP_TOTAL,
    SWAP_USED,
    THREADS,
    UPTIME,
)
from bpfdyno.sources.host.procfs import CpuTimes, DiskStats, NetDev, ProcfsError
from bpfdyno.sources.percpu import PerCpuCadence

log = logging.getLogger(__name__)


_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Timed(Generic[_T]):
    """A reading and the clock time it was taken at."""

    ts: float
    value: _T


def _rate(before: int, after: int, seconds: float) -> float | None:
    """Per-second rate of a cumulative counter; None when it went backwards (wrap or reset)."""
    return None if after < before else (after - before) / seconds


#: The eight fields of a CpuTimes, in order.
_CPU_FIELDS = operator.attrgetter(*(f.name for f in dataclasses.fields(CpuTimes)))


def _cpu_samples(cpu: str, old: CpuTimes, new: CpuTimes) -> list[Sample]:
    deltas = [max(0, n - o) for o, n in zip(_CPU_FIELDS(old), _CPU_FIELDS(new), strict=True)]
    total = sum(deltas)
    if total == 0:
        return []
    labels = {"cpu": cpu}
    out = [
        sample(spec, d / total, labels) for spec, d in zip(CPU_STATE_RATIOS, deltas, strict=True)
    ]
    idle, iowait = deltas[3], deltas[4]  # in the order of CpuTimes' fields
    out.append(sample(CPU_UTILIZATION, (total - idle - iowait) / total, labels))
    return out


class HostCollector(Collector):
    """Host-wide CPU, memory, load, disk, network, uptime and task metrics from procfs."""

    name = "host"
    may_block = False  # procfs and sysfs counters of the host

    def __init__(
        self,
        root: Path = Path("/"),
        clock: Callable[[], float] = time.monotonic,
        per_cpu_every: int = 1,
    ) -> None:
        """Create the collector.

        Args:
            root: directory holding ``proc/`` and ``sys/`` (``/`` on a host; the host's root
                mounted elsewhere in a container; a fixture tree in tests).
            clock: monotonic seconds, used to turn counter deltas into per-second rates.
            per_cpu_every: report the per-CPU ratios every this many rounds
                (`bpfdyno.sources.percpu`); the totals come every round.
        """
        self._root = root
        self._clock = clock
        self._per_cpu = PerCpuCadence(per_cpu_every)
        self._cpus: _Timed[Mapping[int, procfs.CpuTimes]] | None = None
        self._stat: _Timed[procfs.Stat] | None = None
        self._disks: _Timed[dict[str, DiskStats]] | None = None
        self._nets: _Timed[dict[str, NetDev]] | None = None
        self._failing: set[str] = set()  # sources whose failure was logged
        self._parts: tuple[tuple[str, Callable[[float], list[Sample]]], ...] = (
            ("proc/stat", self._collect_stat),
            ("proc/meminfo", self._collect_meminfo),
            ("proc/loadavg", self._collect_loadavg),
            ("proc/uptime", self._collect_uptime),
            ("proc", self._collect_processes),
            ("proc/diskstats", self._collect_disks),
            ("proc/net/dev", self._collect_nets),
        )

    def start(self) -> None:
        """Check that procfs is readable under the root.

        Raises:
            CollectorUnavailable: ``<root>/proc/stat`` cannot be read.
        """
        try:
            procfs.read_stat(self._root)
        except ProcfsError as e:
            raise CollectorUnavailable(
                f"host metrics need procfs: {e} (mount it with 'mount -t proc proc "
                f"{self._root / 'proc'}')"
            ) from e

    def collect(self) -> Sequence[Sample]:
        """Read every source once; see the module docstring for what is emitted when.

        Raises:
            ProcfsError: not a single source could be read.
        """
        now = self._clock()
        out: list[Sample] = []
        errors: list[ProcfsError] = []
        for source, part in self._parts:
            try:
                out.extend(part(now))
                error = ""
            except ProcfsError as e:
                errors.append(e)
                error = str(e)
            self._note(source, error)
            out.append(sample(SOURCE_UP, 0.0 if error else 1.0, {"source": source}))
        if len(errors) == len(self._parts):
            raise ProcfsError(
                self._root / "proc", f"none of the host sources could be read; first: {errors[0]}"
            )
        return out

    def _note(self, source: str, error: str) -> None:
        """Log when a source starts failing and when it recovers, not on every round."""
        if error and source not in self._failing:
            log.warning("host metrics from %s skipped: %s", source, error)
            self._failing.add(source)
        elif not error and source in self._failing:
            log.info("host metrics from %s are back", source)
            self._failing.discard(source)

    def _collect_stat(self, now: float) -> list[Sample]:
        per_cpu = self._per_cpu.due()
        cur = _Timed(now, procfs.read_stat(self._root, per_cpu))
        prev, self._stat = self._stat, cur
        stat = cur.value
        out = [
            sample(PROCS_RUNNING, stat.procs_running),
            sample(PROCS_BLOCKED, stat.procs_blocked),
        ]
        if prev is None or cur.ts <= prev.ts:
            if per_cpu:
                self._cpus = _Timed(now, stat.cpus)  # the first per-CPU reading
            return out
        dt, old = cur.ts - prev.ts, prev.value
        for spec, before, after in (
            (CONTEXT_SWITCHES, old.context_switches, stat.context_switches),
            (FORKS, old.forks, stat.forks),
        ):
            rate = _rate(before, after, dt)
            if rate is not None:
                out.append(sample(spec, rate))
        out.extend(_cpu_samples("total", old.cpu_total, stat.cpu_total))
        if per_cpu:  # each CPU's ratios over the time since they were last reported
            since, self._cpus = self._cpus, _Timed(now, stat.cpus)
            for cpu, times in sorted(stat.cpus.items()):
                if since is not None and cpu in since.value:
                    out.extend(_cpu_samples(str(cpu), since.value[cpu], times))
        return out

    def _collect_meminfo(self, now: float) -> list[Sample]:
        m = procfs.read_meminfo(self._root)
        return [
            sample(MEMORY_TOTAL, m.total_bytes),
            sample(MEMORY_USED, m.total_bytes - m.available_bytes),
            sample(MEMORY_AVAILABLE, m.available_bytes),
            sample(MEMORY_FREE, m.free_bytes),
            sample(MEMORY_CACHED, m.cached_bytes + m.sreclaimable_bytes),
            sample(MEMORY_BUFFERS, m.buffers_bytes),
            sample(SWAP_TOTAL, m.swap_total_bytes),
            sample(SWAP_USED, m.swap_total_bytes - m.swap_free_bytes),
        ]

    def _collect_loadavg(self, now: float) -> list[Sample]:
        la = procfs.read_loadavg(self._root)
        return [
            sample(LOAD_1M, la.load1),
            sample(LOAD_5M, la.load5),
            sample(LOAD_15M, la.load15),
            sample(THREADS, la.threads),
        ]

    def _collect_uptime(self, now: float) -> list[Sample]:
        return [sample(UPTIME, procfs.read_uptime(self._root).seconds)]

    def _collect_processes(self, now: float) -> list[Sample]:
        return [sample(PROCESSES, procfs.count_processes(self._root))]

    def _collect_disks(self, now: float) -> list[Sample]:
        cur = _Timed(now, procfs.read_diskstats(self._root))
        prev, self._disks = self._disks, cur
        out = _device_rates("device", prev, cur, DISK_RATES)
        for name, new, old, dt in _pairs(prev, cur):
            busy_ms_per_s = _rate(old.io_ticks_ms, new.io_ticks_ms, dt)
            if busy_ms_per_s is not None:
                # io_ticks advances in jiffies, so it can overshoot the interval slightly.
                ratio = min(1.0, busy_ms_per_s / 1000.0)
                out.append(sample(DISK_BUSY, ratio, {"device": name}))
        return out

    def _collect_nets(self, now: float) -> list[Sample]:
        cur = _Timed(now, procfs.read_net_dev(self._root))
        prev, self._nets = self._nets, cur
        return _device_rates("interface", prev, cur, NET_RATES)


def _device_rates(
    label: str,
    prev: _Timed[dict[str, _T]] | None,
    cur: _Timed[dict[str, _T]],
    table: Sequence[tuple[MetricSpec, Callable[[_T], int]]],
) -> list[Sample]:
    """One rate per (device, counter in ``table``) for devices present in both readings."""
    out: list[Sample] = []
    for name, new, old, dt in _pairs(prev, cur):
        for spec, counter in table:
            rate = _rate(counter(old), counter(new), dt)
            if rate is not None:
                out.append(sample(spec, rate, {label: name}))
    return out


def _pairs(
    prev: _Timed[dict[str, _T]] | None, cur: _Timed[dict[str, _T]]
) -> list[tuple[str, _T, _T, float]]:
    """(name, new, old, seconds) for every device present in both readings, sorted by name."""
    if prev is None or cur.ts <= prev.ts:
        return []
    dt = cur.ts - prev.ts
    return [
        (name, new, prev.value[name], dt)
        for name, new in sorted(cur.value.items())
        if name in prev.value
    ]
