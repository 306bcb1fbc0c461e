"""CPU-quota throttling of traced processes: their cgroups' CFS bandwidth statistics.

A process under a CPU quota (``cpu.max`` in cgroup v2, ``cpu.cfs_quota_us`` in v1: what a
Kubernetes CPU limit sets) that uses its quota early in a period is taken off the CPU until
the next period starts, while still runnable: on the scheduler track its threads look
preempted, for up to a period (87-89 ms of a 100 ms period is the signature), and the task
that ran next looks like the one it waited for. The kernel counts it per cgroup: periods,
periods throttled, time throttled. `CpuQuotaReader` reads those counters of the cgroup a
process is in and of each of its ancestors that has a quota (a pod-level limit throttles the
containers under it, but counts only in the pod's cgroup), as `CpuQuotaSample` records of the
sched track; the capture manager reads them at the start, while it drains the ring buffers,
and at the end, so the trace holds what the window added.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.tracing.capture.records import CpuQuotaSample


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """Where a controller is mounted, and which cgroup version it is."""

    mountpoint: Path
    root: str  # the mount's root within the hierarchy ("/" normally)
    v2: bool


class CpuQuotaReader:
    """Reads the CFS quota counters of a process's cgroups (v2, or v1's cpu controller).

    Args:
        proc_root: ``/proc`` (a fixture tree in tests).
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._proc = proc_root
        self._hierarchy: Hierarchy | None = None
        self._looked_up = False

    def cgroup_of(self, pid: int) -> str | None:
        """The process's cgroup in the cpu controller's hierarchy, or None."""
        h = self._cpu_hierarchy()
        return cgroup_path(self._proc, pid, h, "cpu") if h is not None else None

    def sample(self, pid: int) -> list[CpuQuotaSample]:
        """The counters of each cgroup of ``pid`` (its own and its ancestors') that has a
        quota, nearest first; empty when none has one or the process is gone."""
        h = self._cpu_hierarchy()
        path = self.cgroup_of(pid)
        if h is None or path is None:
            return []
        out = []
        now = time.monotonic_ns()
        rel = path.removeprefix(h.root.rstrip("/")) if h.root != "/" else path
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts), 0, -1):
            cg = "/" + "/".join(parts[:depth])
            s = _read(h, h.mountpoint.joinpath(*parts[:depth]), cg, now)
            if s is not None:
                out.append(s)
        return out

    def _cpu_hierarchy(self) -> Hierarchy | None:
        if not self._looked_up:  # the mounts do not change while the agent runs
            self._hierarchy = find_hierarchy(self._proc / "self" / "mountinfo", "cpu")
            self._looked_up = True
        return self._hierarchy


def cgroup_path(proc: Path, pid: int, h: Hierarchy, controller: str) -> str | None:
    """The process's cgroup in ``h`` (the hierarchy of ``controller``), or None."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if (h.v2 and controllers == "") or (not h.v2 and controller in controllers.split(",")):
            return path
    return None


def find_hierarchy(mountinfo: Path, controller: str) -> Hierarchy | None:
    """The cgroup v1 mount with ``controller``, else the v2 mount if it has it."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    v2: Hierarchy | None = None
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        root, mountpoint = fields[3], Path(fields[4].replace("\\040", " "))
        fstype, options = fields[sep + 1], fields[sep + 3].split(",")
        if fstype == "cgroup" and controller in options:
            return Hierarchy(mountpoint, root, v2=False)
        if fstype == "cgroup2" and v2 is None:
            try:
                controllers = (mountpoint / "cgroup.controllers").read_text().split()
            except OSError:
                controllers = []
            if controller in controllers:
                v2 = Hierarchy(mountpoint, root, v2=True)
    return v2


def _read(h: Hierarchy, d: Path, cgroup: str, now: int) -> CpuQuotaSample | None:
    """A cgroup's sample, or None when it has no quota (or is gone)."""
    try:
        if h.v2:
            quota_text, period_text = (d / "cpu.max").read_text().split()
            if quota_text == "max":
                return None
            quota, period = int(quota_text), int(period_text)
        else:
            quota = int((d / "cpu.cfs_quota_us").read_text())
            period = int((d / "cpu.cfs_period_us").read_text())
            if quota < 0:
                return None
        stat = dict(
            (k, int(v))
            for k, v in (line.split() for line in (d / "cpu.stat").read_text().splitlines())
        )
    except (OSError, ValueError):
        return None
    throttled = stat.get("throttled_usec", 0) * 1000 if h.v2 else stat.get("throttled_time", 0)
    return CpuQuotaSample(
        ts_ns=now,
        cgroup=cgroup,
        quota_us=quota,
        period_us=period,
        periods=stat.get("nr_periods", 0),
        throttled_periods=stat.get("nr_throttled", 0),
        throttled_ns=throttled,
    )
