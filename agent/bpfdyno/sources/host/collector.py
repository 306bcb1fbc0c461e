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
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from bpfdyno.core.metrics import REGISTRY, MetricKind, MetricSpec, Sample, sample
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.host import procfs
from bpfdyno.sources.host.procfs import CpuTimes, DiskStats, NetDev, ProcfsError

log = logging.getLogger(__name__)

_GAUGE, _RATE, _RATIO = MetricKind.GAUGE, MetricKind.RATE, MetricKind.RATIO


def _declare(
    name: str, kind: MetricKind, unit: str, help: str, labels: tuple[str, ...] = ()
) -> MetricSpec:
    return REGISTRY.declare(name, kind, unit, help, labels, source="host")


# --- CPU (/proc/stat) ---------------------------------------------------------------------
_CPU_STATE_HELP = {
    "user": "in user mode (guest time included)",
    "nice": "in user mode at a positive nice value (guest nice time included)",
    "system": "in kernel mode",
    "idle": "idle with no I/O outstanding",
    "iowait": "idle while waiting for I/O",
    "irq": "servicing hardware interrupts",
    "softirq": "servicing soft interrupts",
    "steal": "waiting for the hypervisor to run it (stolen by other guests)",
}
#: One ratio spec per /proc/stat CPU state, in the order of `CpuTimes`' fields.
CPU_STATE_RATIOS: tuple[MetricSpec, ...] = tuple(
    _declare(
        f"cpu_{state}_ratio",
        _RATIO,
        "ratio",
        f"Share (0..1) of the CPU time accounted in the interval that was spent {what}, "
        'per core and for cpu="total", from the tick deltas of /proc/stat.',
        ("cpu",),
    )
    for state, what in _CPU_STATE_HELP.items()
)
CPU_UTILIZATION = _declare(
    "cpu_utilization_ratio",
    _RATIO,
    "ratio",
    "Share (0..1) of the CPU time accounted in the interval that was busy (1 - idle - iowait), "
    'per core and for cpu="total", from the tick deltas of /proc/stat.',
    ("cpu",),
)
CONTEXT_SWITCHES = _declare(
    "context_switches_per_second",
    _RATE,
    "1/s",
    "Context switches per second on all CPUs over the interval, from ctxt in /proc/stat.",
)
FORKS = _declare(
    "forks_per_second",
    _RATE,
    "1/s",
    "Processes and threads created per second over the interval, from processes in /proc/stat.",
)
PROCS_RUNNING = _declare(
    "procs_running",
    _GAUGE,
    "tasks",
    "Number of runnable tasks (threads) at the time of reading, from procs_running in /proc/stat.",
)
PROCS_BLOCKED = _declare(
    "procs_blocked",
    _GAUGE,
    "tasks",
    "Number of tasks (threads) blocked waiting for I/O at the time of reading, from "
    "procs_blocked in /proc/stat.",
)

# --- Memory (/proc/meminfo) ---------------------------------------------------------------
MEMORY_TOTAL = _declare(
    "memory_total_bytes", _GAUGE, "bytes", "Usable RAM in bytes, from MemTotal in /proc/meminfo."
)
MEMORY_USED = _declare(
    "memory_used_bytes",
    _GAUGE,
    "bytes",
    "RAM in use in bytes, MemTotal - MemAvailable from /proc/meminfo (what cannot be "
    "reclaimed without swapping).",
)
MEMORY_AVAILABLE = _declare(
    "memory_available_bytes",
    _GAUGE,
    "bytes",
    "RAM in bytes the kernel estimates is available for new work without swapping, from "
    "MemAvailable in /proc/meminfo.",
)
MEMORY_FREE = _declare(
    "memory_free_bytes",
    _GAUGE,
    "bytes",
    "RAM in bytes not used for anything, from MemFree in /proc/meminfo.",
)
MEMORY_CACHED = _declare(
    "memory_cached_bytes",
    _GAUGE,
    "bytes",
    "Page cache plus reclaimable slab in bytes, Cached + SReclaimable from /proc/meminfo.",
)
MEMORY_BUFFERS = _declare(
    "memory_buffers_bytes",
    _GAUGE,
    "bytes",
    "Block device buffers in bytes, from Buffers in /proc/meminfo.",
)
SWAP_TOTAL = _declare(
    "swap_total_bytes", _GAUGE, "bytes", "Swap space in bytes, from SwapTotal in /proc/meminfo."
)
SWAP_USED = _declare(
    "swap_used_bytes",
    _GAUGE,
    "bytes",
    "Swap space in use in bytes, SwapTotal - SwapFree from /proc/meminfo.",
)

# --- Load, tasks, uptime (/proc/loadavg, /proc, /proc/uptime) ------------------------------
LOAD_1M, LOAD_5M, LOAD_15M = (
    _declare(
        f"load_average_{span}",
        _GAUGE,
        "tasks",
        f"Average number of runnable plus uninterruptible tasks over the last {what}, from "
        f"the {field} field of /proc/loadavg.",
    )
    for span, what, field in (
        ("1m", "minute", "1st"),
        ("5m", "5 minutes", "2nd"),
        ("15m", "15 minutes", "3rd"),
    )
)
THREADS = _declare(
    "threads_total",
    _GAUGE,
    "threads",
    "Number of threads on the host, kernel threads included, from the total after the slash "
    "in the 4th field of /proc/loadavg.",
)
PROCESSES = _declare(
    "processes_total",
    _GAUGE,
    "processes",
    "Number of processes on the host, kernel threads included, counted as the numeric "
    "directories of /proc.",
)
UPTIME = _declare(
    "uptime_seconds",
    _GAUGE,
    "seconds",
    "Seconds since the host booted, from the 1st field of /proc/uptime.",
)

# --- Disks (/proc/diskstats, /sys/block) ---------------------------------------------------
_DISK = (
    " over the interval on one whole block device (that has done I/O since boot), from "
    "/proc/diskstats."
)
_SECTOR = procfs.DISKSTATS_SECTOR_BYTES
_DISK_DEFS: tuple[tuple[str, str, str, Callable[[DiskStats], int]], ...] = (
    ("read_bytes", "bytes/s", "Bytes read (sectors x 512)", lambda d: d.sectors_read * _SECTOR),
    (
        "write_bytes",
        "bytes/s",
        "Bytes written (sectors x 512)",
        lambda d: d.sectors_written * _SECTOR,
    ),
    ("reads", "1/s", "Read operations completed", lambda d: d.reads),
    ("writes", "1/s", "Write operations completed", lambda d: d.writes),
)
#: (spec, counter) for each per-device rate.
DISK_RATES: tuple[tuple[MetricSpec, Callable[[DiskStats], int]], ...] = tuple(
    (
        _declare(f"disk_{key}_per_second", _RATE, unit, f"{what} per second{_DISK}", ("device",)),
        counter,
    )
    for key, unit, what, counter in _DISK_DEFS
)
DISK_BUSY = _declare(
    "disk_busy_ratio",
    _RATIO,
    "ratio",
    "Share (0..1) of the interval during which one whole block device had I/O in flight "
    "(io_ticks delta / interval), from /proc/diskstats.",
    ("device",),
)

# --- Network interfaces (/proc/net/dev) ------------------------------------------------------
_NET = " per second over the interval on one interface, from /proc/net/dev."
_NET_DEFS: tuple[tuple[str, str, str, Callable[[NetDev], int]], ...] = (
    ("rx_bytes", "bytes/s", "Bytes received", lambda d: d.rx_bytes),
    ("tx_bytes", "bytes/s", "Bytes sent", lambda d: d.tx_bytes),
    ("rx_packets", "1/s", "Packets received", lambda d: d.rx_packets),
    ("tx_packets", "1/s", "Packets sent", lambda d: d.tx_packets),
    ("rx_errors", "1/s", "Receive errors", lambda d: d.rx_errors),
    ("tx_errors", "1/s", "Transmit errors", lambda d: d.tx_errors),
    ("rx_drops", "1/s", "Received packets dropped", lambda d: d.rx_drops),
    ("tx_drops", "1/s", "Packets dropped on transmit", lambda d: d.tx_drops),
)
#: (spec, counter) for each per-interface rate.
NET_RATES: tuple[tuple[MetricSpec, Callable[[NetDev], int]], ...] = tuple(
    (_declare(f"net_{key}_per_second", _RATE, unit, what + _NET, ("interface",)), counter)
    for key, unit, what, counter in _NET_DEFS
)

SOURCE_UP = _declare(
    "host_source_up",
    _GAUGE,
    "boolean",
    "1 when the host collector read and parsed this source (a path under its root such as "
    "proc/stat) in its last round, 0 when that failed (a log line says why).",
    ("source",),
)

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class _Timed(Generic[_T]):
    """A reading and the clock time it was taken at."""

    ts: float
    value: _T


def _rate(before: int, after: int, seconds: float) -> float | None:
    """Per-second rate of a cumulative counter; None when it went backwards (wrap or reset)."""
    return None if after < before else (after - before) / seconds


def _cpu_samples(cpu: str, old: CpuTimes, new: CpuTimes) -> list[Sample]:
    deltas = [
        max(0, n - o)
        for o, n in zip(dataclasses.astuple(old), dataclasses.astuple(new), strict=True)
    ]
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

    def __init__(self, root: Path = Path("/"), clock: Callable[[], float] = time.monotonic) -> None:
        """Create the collector.

        Args:
            root: directory holding ``proc/`` and ``sys/`` (``/`` on a host; the host's root
                mounted elsewhere in a container; a fixture tree in tests).
            clock: monotonic seconds, used to turn counter deltas into per-second rates.
        """
        self._root = root
        self._clock = clock
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
        cur = _Timed(now, procfs.read_stat(self._root))
        prev, self._stat = self._stat, cur
        stat = cur.value
        out = [
            sample(PROCS_RUNNING, stat.procs_running),
            sample(PROCS_BLOCKED, stat.procs_blocked),
        ]
        if prev is None or cur.ts <= prev.ts:
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
        for cpu, times in sorted(stat.cpus.items()):
            if cpu in old.cpus:
                out.extend(_cpu_samples(str(cpu), old.cpus[cpu], times))
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
