"""Counting perf events per CPU with ``perf_event_open(2)`` through ctypes.

Counting needs no BPF: the kernel keeps the counts, user space reads them with ``read(2)``.
Each CPU gets one event *group* (a leader and members scheduled together, so ratios such as
instructions per cycle come from the same time slices), read in one call with
``PERF_FORMAT_GROUP`` plus the enabled/running times used to scale multiplexed counts.

Software events are counted ungrouped: they are never multiplexed, and members of a group
led by cpu-clock (its own PMU) never count. The syscall is injectable (`Opener`): a machine
without a hardware PMU cannot run the hardware path, so tests substitute the syscall, and
only the syscall.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
PERF_FORMAT_GROUP = 1 << 3
PERF_FLAG_FD_CLOEXEC = 1 << 3
READ_FORMAT = PERF_FORMAT_GROUP | PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING

_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}


class PerfEventAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to ``PERF_ATTR_SIZE_VER5`` (112 bytes)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),  # disabled, inherit, pinned, ... bitfield
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("_reserved_2", ctypes.c_uint16),
    ]


#: perf_event_open(attr, pid, cpu, group_fd, flags) -> fd; raises OSError on failure.
Opener = Callable[[PerfEventAttr, int, int, int, int], int]


def perf_event_open(attr: PerfEventAttr, pid: int, cpu: int, group_fd: int, flags: int) -> int:
    """The real syscall.

    Raises:
        OSError: with the kernel's errno (ENOENT: no such event on this machine).
    """
    nr = _NR_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    fd = int(libc.syscall(nr, ctypes.byref(attr), pid, cpu, group_fd, flags))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


@dataclass(frozen=True, slots=True)
class PerfCounter:
    """One countable event: a name for metrics, and its perf type and config."""

    name: str
    type: int
    config: int


@dataclass(frozen=True, slots=True)
class GroupReading:
    """One read of a group: raw counts by event name and the group's times (ns)."""

    values: dict[str, int]
    enabled_ns: int
    running_ns: int


class CounterGroup:
    """The counters of one CPU, system-wide (all tasks), opened as one group.

    Args:
        cpu: the CPU to count on.
        counters: the leader first; it must open or the group fails.
        optional: names of members that may be missing (skipped, reported as absent).
        opener: the syscall (replaceable in tests).
        grouped: one kernel group read at once (hardware); False opens every counter on its
            own (software), read one by one.

    Raises:
        OSError: the leader or a required member could not be opened.
    """

    def __init__(
        self,
        cpu: int,
        counters: Sequence[PerfCounter],
        optional: Collection[str] = (),
        opener: Opener = perf_event_open,
        grouped: bool = True,
    ) -> None:
        self.cpu = cpu
        self._grouped = grouped
        read_format = READ_FORMAT if grouped else READ_FORMAT & ~PERF_FORMAT_GROUP
        self._fds: list[int] = []
        self.names: list[str] = []
        try:
            for i, counter in enumerate(counters):
                attr = PerfEventAttr(
                    type=counter.type,
                    size=ctypes.sizeof(PerfEventAttr),
                    config=counter.config,
                    read_format=read_format,
                )
                leader = self._fds[0] if self._fds and grouped else -1
                try:
                    fd = opener(attr, -1, cpu, leader, PERF_FLAG_FD_CLOEXEC)
                except OSError:
                    if i > 0 and counter.name in optional:
                        continue
                    raise
                self._fds.append(fd)
                self.names.append(counter.name)
        except BaseException:
            self.close()
            raise
        self._size = 8 * (3 + len(self.names)) if grouped else 24

    def read(self) -> GroupReading:
        """Read all counts of the group (at once when grouped).

        Raises:
            OSError: the read failed (e.g. the CPU went offline).
        """
        if not self._grouped:
            values: dict[str, int] = {}
            enabled = running = 0
            for name, fd in zip(self.names, self._fds, strict=True):
                data = os.read(fd, 24)
                if len(data) < 24:
                    raise OSError(errno.EIO, f"short perf read on CPU {self.cpu}")
                values[name], enabled, running = struct.unpack("<3Q", data)
            return GroupReading(values, enabled, running)
        data = os.read(self._fds[0], self._size)
        if len(data) < self._size:
            raise OSError(errno.EIO, f"short perf read on CPU {self.cpu}: {len(data)} bytes")
        nr, enabled, running, *counts = struct.unpack(f"<{3 + len(self.names)}Q", data)
        if nr != len(self.names):
            raise OSError(errno.EIO, f"perf group on CPU {self.cpu} has {nr} counters")
        return GroupReading(dict(zip(self.names, counts, strict=True)), enabled, running)

    def close(self) -> None:
        """Close every counter fd (idempotent)."""
        for fd in self._fds:
            os.close(fd)
        self._fds = []


def scaled_delta(before: GroupReading, after: GroupReading, name: str) -> float:
    """Count of ``name`` between two reads, scaled up for the time it was multiplexed out.

    Returns NaN when the counter is absent or never ran in the interval.
    """
    if name not in after.values or name not in before.values:
        return float("nan")
    running = after.running_ns - before.running_ns
    enabled = after.enabled_ns - before.enabled_ns
    if running <= 0:
        return float("nan")
    delta = after.values[name] - before.values[name]
    return delta * (enabled / running) if enabled > running else float(delta)


def online_cpus(sysfs: Path = Path("/sys/devices/system/cpu/online")) -> list[int]:
    """The online CPU numbers, from sysfs ("0-3,5" style lists)."""
    out: list[int] = []
    for part in sysfs.read_text().strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
