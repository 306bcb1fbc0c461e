"""Memory pressure on traced processes: their memory cgroups' reclaim counters.

A process whose cgroup has a memory limit below its working set (``memory.high`` or
``memory.max`` in cgroup v2, ``memory.limit_in_bytes`` in v1: what a Kubernetes memory
limit sets) reclaims its own pages each time it charges a new one at the limit: its file
pages are evicted and read again from the disk (refaults), its tasks stall in reclaim. On
the scheduler track that is uninterruptible sleep (state D) like any disk read; the kernel
says why per cgroup: how often the limit was hit (v1 ``memory.failcnt``, v2
``memory.events`` high + max), the pages read again after reclaim
(``workingset_refault_*`` of ``memory.stat``), major faults, and (v2) the time its tasks
stalled on memory (``memory.pressure``). `MemoryCgroupReader` reads those of the cgroup a
process is in and of each ancestor with a limit, as `MemoryCgroupSample` records of the
sched track; the capture manager reads them with the CPU quota counters (start, drains, end),
so the trace holds what the window added.
"""

from __future__ import annotations

import time
from pathlib import Path

from bpfdyno.tracing.capture.cpu_quota import Hierarchy, cgroup_path, find_hierarchy
from bpfdyno.tracing.capture.records import MemoryCgroupSample

#: A v1 limit at or above this is no limit (the kernel writes PAGE_COUNTER_MAX pages).
UNLIMITED = 1 << 62


class MemoryCgroupReader:
    """Reads the reclaim counters of a process's memory cgroups (v2, or v1's memory
    controller).

    Args:
        proc_root: ``/proc`` (a fixture tree in tests).
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._proc = proc_root
        self._hierarchy: Hierarchy | None = None
        self._looked_up = False

    def sample(self, pid: int) -> list[MemoryCgroupSample]:
        """The counters of each memory cgroup of ``pid`` (its own and its ancestors') that
        has a limit, nearest first; empty when none has one or the process is gone."""
        if not self._looked_up:  # the mounts do not change while the agent runs
            self._hierarchy = find_hierarchy(self._proc / "self" / "mountinfo", "memory")
            self._looked_up = True
        h = self._hierarchy
        path = cgroup_path(self._proc, pid, h, "memory") if h is not None else None
        if h is None or path is None:
            return []
        out = []
        now = time.monotonic_ns()
        rel = path.removeprefix(h.root.rstrip("/")) if h.root != "/" else path
        parts = [p for p in rel.split("/") if p]
        for depth in range(len(parts), 0, -1):
            s = _read(h, h.mountpoint.joinpath(*parts[:depth]), "/" + "/".join(parts[:depth]), now)
            if s is not None:
                out.append(s)
        return out


def _keyed(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value)
    return out


def _read(h: Hierarchy, d: Path, cgroup: str, now: int) -> MemoryCgroupSample | None:
    """A cgroup's sample, or None when it has no limit (or is gone)."""
    try:
        stat = _keyed((d / "memory.stat").read_text())
        if h.v2:
            limits = [
                int(t)
                for name in ("memory.high", "memory.max")
                if (t := (d / name).read_text().strip()) != "max"
            ]
            if not limits:
                return None
            limit = min(limits)
            events = _keyed((d / "memory.events").read_text())
            hits = events.get("high", 0) + events.get("max", 0)
            stall_us = 0
            for line in (d / "memory.pressure").read_text().splitlines():
                if line.startswith("some "):
                    stall_us = int(line.rpartition("total=")[2])
            prefix = ""
        else:
            limit = int((d / "memory.limit_in_bytes").read_text())
            if limit >= UNLIMITED:
                return None
            hits = int((d / "memory.failcnt").read_text())
            stall_us = 0  # v1 keeps no stall time
            prefix = "total_"  # v1's own counters leave its children out
    except (OSError, ValueError):
        return None
    return MemoryCgroupSample(
        ts_ns=now,
        cgroup=cgroup,
        limit_bytes=limit,
        limit_hits=hits,
        refaults=stat.get(prefix + "workingset_refault_file", 0)
        + stat.get(prefix + "workingset_refault_anon", 0),
        major_faults=stat.get(prefix + "pgmajfault", 0),
        stall_ns=stall_us * 1000,
    )
