"""Pure parsers for the host-wide files of procfs and sysfs, over any root directory.

psutil cannot read from a root other than ``/``, so the host collector reads these files
itself: tests point it at a fixture tree, a container deployment at the host's ``/proc``
mounted elsewhere. Every function reads one source and returns typed, cumulative values
exactly as the kernel reports them (no rates, no policy beyond what each docstring says).

Any problem with a file — missing, unreadable, truncated or in an unexpected format — raises
`ProcfsError` naming the file, so the caller can skip that source and say which one failed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

#: /proc/diskstats counts sectors of 512 bytes whatever the device's real sector size.
DISKSTATS_SECTOR_BYTES = 512


class ProcfsError(Exception):
    """A procfs/sysfs source could not be read or parsed.

    Attributes:
        path: the file (or directory) that failed, under the configured root.
    """

    def __init__(self, path: Path, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """Cumulative time one CPU (or all together) spent in each state, in USER_HZ ticks.

    ``guest`` and ``guest_nice`` are not kept: the kernel already includes them in ``user``
    and ``nice``, so adding them would count guest time twice.
    """

    user: int
    nice: int
    system: int
    idle: int
    iowait: int
    irq: int
    softirq: int
    steal: int

    @property
    def total(self) -> int:
        """All accounted ticks, the denominator of every CPU ratio."""
        return (
            self.user
            + self.nice
            + self.system
            + self.idle
            + self.iowait
            + self.irq
            + self.softirq
            + self.steal
        )


@dataclass(frozen=True, slots=True)
class Stat:
    """The parts of ``/proc/stat`` the host collector uses.

    Attributes:
        cpu_total: the ``cpu`` line (sum over online CPUs).
        cpus: the ``cpuN`` lines by CPU number; offline CPUs have no line.
        context_switches: ``ctxt``, context switches since boot.
        forks: ``processes``, processes and threads created since boot.
        procs_running: tasks (threads) runnable right now.
        procs_blocked: tasks blocked on I/O right now.
        boot_time: ``btime``, boot time in epoch seconds.
    """

    cpu_total: CpuTimes
    cpus: Mapping[int, CpuTimes]
    context_switches: int
    forks: int
    procs_running: int
    procs_blocked: int
    boot_time: int


@dataclass(frozen=True, slots=True)
class MemInfo:
    """The fields of ``/proc/meminfo`` the host collector uses, converted to bytes."""

    total_bytes: int
    free_bytes: int
    available_bytes: int
    buffers_bytes: int
    cached_bytes: int  # "Cached": page cache including tmpfs/shmem
    sreclaimable_bytes: int  # reclaimable slab (dentries, inodes)
    swap_total_bytes: int
    swap_free_bytes: int


@dataclass(frozen=True, slots=True)
class LoadAvg:
    """``/proc/loadavg``: load averages, runnable and total tasks, last pid."""

    load1: float
    load5: float
    load15: float
    runnable: int
    threads: int  # every task the kernel schedules (nr_threads), kernel threads included
    last_pid: int


@dataclass(frozen=True, slots=True)
class DiskStats:
    """Cumulative I/O counters of one whole block device from ``/proc/diskstats``."""

    name: str
    reads: int  # reads completed
    sectors_read: int  # 512-byte sectors
    writes: int  # writes completed
    sectors_written: int  # 512-byte sectors
    io_ticks_ms: int  # milliseconds with I/O in flight (a 32-bit counter: it wraps)


@dataclass(frozen=True, slots=True)
class NetDev:
    """Cumulative counters of one network interface from ``/proc/net/dev``."""

    name: str
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_drops: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_drops: int


@dataclass(frozen=True, slots=True)
class Uptime:
    """``/proc/uptime``: seconds since boot, and idle seconds summed over CPUs."""

    seconds: float
    idle_seconds: float


@lru_cache(maxsize=64)
def _joined(root: Path, rel: str) -> Path:
    return root / rel


def _read(root: Path, rel: str) -> tuple[Path, str]:
    # Read every second: no Path arithmetic and no text wrapper per read.
    path = _joined(root, rel)
    try:
        with open(path, "rb") as f:
            return path, f.read().decode("ascii", "replace")
    except OSError as e:
        raise ProcfsError(
            path, f"cannot read it ({e.strerror}); is procfs mounted there and readable?"
        ) from e


def _ints(path: Path, lineno: int, fields: list[str]) -> list[int]:
    try:
        return [int(f) for f in fields]
    except ValueError:
        raise ProcfsError(
            path,
            f"line {lineno}: expected integers, got {' '.join(fields)!r}; "
            "the file is not in the Linux format this version understands",
        ) from None


def _first_int(path: Path, lineno: int, rest: str) -> int:
    """The first field of ``rest`` as an integer (an empty ``rest`` is malformed too)."""
    return _ints(path, lineno, rest.split()[:1] or [""])[0]


def _cpu_times(path: Path, lineno: int, fields: list[str]) -> CpuTimes:
    # Kernels >= 2.6.11 print at least user..steal; guest fields come after and are ignored.
    if len(fields) < 8:
        raise ProcfsError(path, f"line {lineno}: a cpu line needs 8 time fields, got {len(fields)}")
    v = _ints(path, lineno, fields[:8])
    return CpuTimes(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])


def read_stat(root: Path, per_cpu: bool = True) -> Stat:
    """Parse ``<root>/proc/stat``.

    Args:
        root: where ``proc/`` is.
        per_cpu: parse each CPU's line too (False: ``cpus`` is empty, the rest as usual).

    Raises:
        ProcfsError: unreadable, or a required line (cpu, ctxt, processes, procs_running,
            procs_blocked, btime) is missing or malformed.
    """
    path, text = _read(root, "proc/stat")
    total: CpuTimes | None = None
    cpus: dict[int, CpuTimes] = {}
    scalars: dict[str, int] = {}
    wanted = ("ctxt", "processes", "procs_running", "procs_blocked", "btime")
    for lineno, line in enumerate(text.splitlines(), start=1):
        key, _, rest = line.partition(" ")
        if key == "cpu":
            total = _cpu_times(path, lineno, rest.split())
        elif key.startswith("cpu") and key[3:].isdigit():
            if per_cpu:
                cpus[int(key[3:])] = _cpu_times(path, lineno, rest.split())
        elif key in wanted:
            scalars[key] = _first_int(path, lineno, rest)
    missing = ([] if total is not None else ["cpu"]) + [k for k in wanted if k not in scalars]
    if total is None or missing:
        raise ProcfsError(path, f"no {', '.join(missing)} line; the file looks truncated")
    return Stat(
        cpu_total=total,
        cpus=cpus,
        context_switches=scalars["ctxt"],
        forks=scalars["processes"],
        procs_running=scalars["procs_running"],
        procs_blocked=scalars["procs_blocked"],
        boot_time=scalars["btime"],
    )


_MEMINFO_KEYS = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "SReclaimable",
    "SwapTotal",
    "SwapFree",
)


def read_meminfo(root: Path) -> MemInfo:
    """Parse ``<root>/proc/meminfo`` (values in kB there, in bytes here).

    Raises:
        ProcfsError: unreadable, or one of the fields used is missing or malformed
            (MemAvailable needs Linux >= 3.14).
    """
    path, text = _read(root, "proc/meminfo")
    kib: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        key, _, rest = line.partition(":")
        if key in _MEMINFO_KEYS:
            kib[key] = _first_int(path, lineno, rest)
    missing = [k for k in _MEMINFO_KEYS if k not in kib]
    if missing:
        raise ProcfsError(path, f"no {', '.join(missing)} field; the file looks truncated")
    b = {k: v * 1024 for k, v in kib.items()}
    return MemInfo(
        total_bytes=b["MemTotal"],
        free_bytes=b["MemFree"],
        available_bytes=b["MemAvailable"],
        buffers_bytes=b["Buffers"],
        cached_bytes=b["Cached"],
        sreclaimable_bytes=b["SReclaimable"],
        swap_total_bytes=b["SwapTotal"],
        swap_free_bytes=b["SwapFree"],
    )


def read_loadavg(root: Path) -> LoadAvg:
    """Parse ``<root>/proc/loadavg`` (``0.26 0.13 0.05 3/99 5701``).

    Raises:
        ProcfsError: unreadable or not five well-formed fields.
    """
    path, text = _read(root, "proc/loadavg")
    fields = text.split()
    running, slash, threads = fields[3].partition("/") if len(fields) == 5 else ("", "", "")
    try:
        if not slash:
            raise ValueError
        return LoadAvg(
            float(fields[0]),
            float(fields[1]),
            float(fields[2]),
            int(running),
            int(threads),
            int(fields[4]),
        )
    except ValueError:
        raise ProcfsError(
            path, f"expected 'L1 L5 L15 RUNNABLE/THREADS LASTPID', got {text.strip()!r}"
        ) from None


def read_uptime(root: Path) -> Uptime:
    """Parse ``<root>/proc/uptime``.

    Raises:
        ProcfsError: unreadable or not two numbers.
    """
    path, text = _read(root, "proc/uptime")
    fields = text.split()
    try:
        if len(fields) != 2:
            raise ValueError
        return Uptime(float(fields[0]), float(fields[1]))
    except ValueError:
        raise ProcfsError(path, f"expected 'UPTIME IDLE' seconds, got {text.strip()!r}") from None


def _whole_disks(root: Path) -> set[str]:
    """Names of whole block devices: the entries of ``sys/block`` (partitions are not)."""
    path = root / "sys/block"
    try:
        # sysfs spells the "/" of names such as "cciss/c0d0" as "!".
        return {name.replace("!", "/") for name in os.listdir(path)}
    except OSError as e:
        raise ProcfsError(
            path,
            f"cannot list it ({e.strerror}); mount sysfs there so whole disks can be told "
            "from partitions",
        ) from e


def read_diskstats(root: Path) -> dict[str, DiskStats]:
    """Parse ``<root>/proc/diskstats``, keeping whole devices that have done I/O.

    Partitions are left out (their I/O is already in their disk's counters): a device is
    whole when ``<root>/sys/block/<name>`` exists. A device that has never completed a read
    or a write since boot (unused loop, ram and zram devices, an empty drive) is left out
    too: it would only add flat zero series; it shows up once it does I/O.

    Raises:
        ProcfsError: a file is unreadable or a line has fewer than the 14 fields every
            kernel since 2.6 prints.
    """
    whole = _whole_disks(root)
    path, text = _read(root, "proc/diskstats")
    out: dict[str, DiskStats] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 14:
            raise ProcfsError(
                path, f"line {lineno}: expected at least 14 fields, got {len(fields)}"
            )
        name = fields[2]
        if name not in whole:
            continue
        v = _ints(path, lineno, fields[3:14])
        # v: reads, reads merged, sectors read, ms reading, writes, writes merged,
        #    sectors written, ms writing, I/Os in flight, io_ticks ms, weighted ms
        if v[0] == 0 and v[4] == 0:
            continue
        out[name] = DiskStats(name, v[0], v[2], v[4], v[6], v[9])
    return out


def read_net_dev(root: Path) -> dict[str, NetDev]:
    """Parse ``<root>/proc/net/dev`` (interfaces of the reader's network namespace).

    Raises:
        ProcfsError: unreadable, or an interface line without its 16 counters.
    """
    path, text = _read(root, "proc/net/dev")
    out: dict[str, NetDev] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if "|" in line or not line.strip():
            continue  # the two header lines
        # Interface names cannot contain ":" (the kernel rejects them), so split at the first.
        name, colon, rest = line.partition(":")
        fields = rest.split()
        if not colon or len(fields) < 16:
            raise ProcfsError(
                path, f"line {lineno}: expected 'NAME: 16 counters', got {line.strip()!r}"
            )
        v = _ints(path, lineno, fields[:16])
        # v: rx bytes packets errs drop fifo frame compressed multicast, then tx bytes
        #    packets errs drop fifo colls carrier compressed
        name = name.strip()
        out[name] = NetDev(name, v[0], v[1], v[2], v[3], v[8], v[9], v[10], v[11])
    return out


def count_processes(root: Path) -> int:
    """Count processes (thread groups, kernel threads included) as ``<root>/proc/<pid>`` dirs.

    procfs lists only thread-group leaders at its top level, so one directory listing gives
    the process count without opening any per-process file. The thread count comes from
    `LoadAvg.threads` instead, which is the kernel's own counter (summing ``Threads:`` over
    every ``status`` file would cost one open per process and race with exits).

    Raises:
        ProcfsError: ``<root>/proc`` cannot be listed.
    """
    path = root / "proc"
    try:
        # Names only: procfs has nothing but process directories under numeric names, and
        # a DirEntry per name costs 3x as much (this runs every round).
        return sum(1 for name in os.listdir(path) if name.isdigit())
    except OSError as e:
        raise ProcfsError(path, f"cannot list it ({e.strerror}); is procfs mounted there?") from e
