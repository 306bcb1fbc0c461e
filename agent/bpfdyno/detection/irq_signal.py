"""Per-rank interrupt time: the share of its CPUs' time the kernel spent in interrupts.

An interrupt storm on one rank's CPU (a NIC queue's vectors pinned there, a flood of packets
whose softirqs run there) takes that CPU from the rank without the rank asking for anything:
softirqs run on the way out of an interrupt in whatever task was on the CPU, and the rest in
that CPU's ``ksoftirqd``. So the rank's own counters say little on their own (with
``CONFIG_IRQ_TIME_ACCOUNTING`` off the interrupted time is even charged to it as its own CPU
time). What says it is the interrupt collector's per-CPU books (`bpfdyno.sources.irq`: the
time in every softirq and device interrupt handler, from the ``irq:*`` raw tracepoints),
read once per interval, and *where the rank's threads ran*:

- **Per CPU** the share of the interval it spent in hard and soft interrupts
  (`CpuInterruptShares`).
- **Per rank**, those shares weighted by where its threads ran in the interval
  (`rank_share`): each thread that ran weighs its on-CPU time in the interval (from the
  ``schedstat`` the signal reads anyway), at the CPU it last ran on: the one CPU it may run
  on when it is pinned to one (``sched_getaffinity``, a sixteenth of the cost of a read),
  else ``/proc/<pid>/task/<tid>/stat``'s ``processor``, read only for the threads that ran
  most (those that make up 95 % of the rank's CPU time in the interval, `PLACED_SHARE`).
  A rank that did not run at all weighs its main thread's CPU. Why this and not a per-CPU
  account of each thread's time: the kernel keeps no such account without a program on
  every context switch, and ranks are pinned to their CPUs (or to a NUMA node's) by every
  launcher that cares about speed, so the last CPU is where the time was spent; a thread
  that moved in the interval is counted at its last CPU only.

Without the interrupt collector's BPF part (BPF not loadable, its programs detached by the
overhead budget, which an interrupt storm itself may make it do) each CPU's share comes from
``/proc/stat``'s ``irq`` and ``softirq`` times instead, read at every reading anyway as the
base for such a time: an estimate (the kernel counts them by the tick unless it accounts
interrupt time, ``CONFIG_IRQ_TIME_ACCOUNTING``; over a 5 s interval at 250 ticks a second a
share is off by about a hundredth), said in `CpuInterruptShares.estimated` and the detection
part's status. Only when neither is known (the collector off, ``/proc/stat`` unreadable) is
the share not known: NaN, never 0.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Protocol

from bpfdyno.core.pidfs import read_small
from bpfdyno.sources.host.procfs import ProcfsError, read_stat
from bpfdyno.sources.irq.collector import CpuInterrupts

NAN = float("nan")


class InterruptTimes(Protocol):
    """The interrupt collector's per-CPU books (`IrqCollector.cpu_interrupt_times`)."""

    def cpu_interrupt_times(self) -> Mapping[int, CpuInterrupts] | None:
        """Online CPU -> its cumulative interrupt time now; None while not known."""
        ...


def interrupt_ns(c: CpuInterrupts) -> int:
    """A CPU's total time in device interrupt handlers and softirqs."""
    return c.hardirq_ns + sum(c.softirq_ns)


#: ``/proc/stat``'s unit of time (USER_HZ), in ns.
TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def stat_interrupt_ns(proc_root: Path) -> dict[int, int] | None:
    """CPU -> its cumulative hard and soft interrupt time from ``<proc_root>/stat`` (ns, in
    whole ticks); None when it cannot be read."""
    try:
        stat = read_stat(proc_root.parent)
    except ProcfsError:
        return None
    return {cpu: (t.irq + t.softirq) * TICK_NS for cpu, t in stat.cpus.items()}


#: Why a share is an estimate while the interrupt collector's books are not known.
FROM_TICKS = (
    "from /proc/stat's irq and softirq ticks: the irq collector's softirq and "
    "interrupt-handler times are not known"
)


class CpuInterruptShares:
    """Per CPU, the share of the time between two readings it spent in interrupts.

    Args:
        source: the interrupt collector.
        clock: monotonic seconds, taken right after each reading.
        ticks: each CPU's cumulative interrupt ns from the kernel's own tick-counted books
            (`stat_interrupt_ns`), for the intervals the collector's books do not cover;
            None: none.
    """

    def __init__(
        self,
        source: InterruptTimes,
        clock: Callable[[], float] = time.monotonic,
        ticks: Callable[[], Mapping[int, int] | None] | None = None,
    ):
        self._source = source
        self._clock = clock
        self._ticks = ticks
        #: (when, the collector's books or None, the tick-counted ones or None)
        self._last: tuple[float, dict[int, int] | None, Mapping[int, int] | None] | None = None
        #: Why there are no shares ("" while they are known).
        self.error = ""
        #: Why the last shares are estimates ("" while they are the collector's own).
        self.estimated = ""

    def sample(self) -> dict[int, float] | None:
        """CPU -> its share of the interval since the last call spent in interrupts (0 to 1);
        None on the first call and while neither source gives anything."""
        times = self._source.cpu_interrupt_times()
        ticks = self._ticks() if self._ticks is not None else None
        now = self._clock()
        # The collector's counts may stand still while it gives nothing: its first reading
        # after is a new base, the interval before it goes to the ticks.
        books = {cpu: interrupt_ns(c) for cpu, c in times.items()} if times is not None else None
        last, self._last = self._last, (now, books, ticks)
        if books is None and ticks is None:
            self.error = "the irq collector's softirq and interrupt-handler times are not known"
            self.estimated = ""
            return None
        self.error = ""
        if last is None or now <= last[0]:
            return None
        before: Mapping[int, int]
        after: Mapping[int, int]
        if books is not None and last[1] is not None:
            self.estimated, before, after = "", last[1], books
        elif ticks is not None and last[2] is not None:
            self.estimated, before, after = FROM_TICKS, last[2], ticks
        else:
            return None  # a source's first reading: its base
        interval_ns = (now - last[0]) * 1e9
        return {
            # A CPU that came online since the last reading has no base: left out.
            cpu: min(1.0, max(0, ns - before[cpu]) / interval_ns)
            for cpu, ns in after.items()
            if cpu in before
        }


def last_cpu(task_dir: str, tid: str) -> int | None:
    """The CPU a thread last ran on (``processor``, field 39 of its stat), None when gone."""
    raw = read_small(f"{task_dir}/{tid}/stat")
    if raw is None:
        return None
    # comm may hold spaces and ')': the fields start after the last ')'.
    fields = raw[raw.rfind(b")") + 2 :].split()
    if len(fields) > 36 and fields[36].isdigit():
        return int(fields[36])
    return None


def only_cpu(affinity: Callable[[int], Collection[int]], tid: str) -> int | None:
    """The CPU a thread is pinned to, None when it may run on several (or is gone)."""
    try:
        cpus = affinity(int(tid))
    except OSError:
        return None
    return next(iter(cpus)) if len(cpus) == 1 else None


#: The share of a process's on-CPU time in an interval that its threads placed must cover,
#: most-running first: the threads that ran least (a pool thread's wakeup) are left out, and
#: with them their stat reads; the weighted share is then off by at most this remainder's
#: weight times the difference between two CPUs' shares.
PLACED_SHARE = 0.95


def placement(
    task_dir: str,
    main_tid: str,
    before: Mapping[str, int],
    after: Mapping[str, int],
    affinity: Callable[[int], Collection[int]] | None = None,
    cover: float = PLACED_SHARE,
) -> dict[int, float]:
    """CPU -> the on-CPU ns the process's threads ran there in the interval, each thread's at
    the CPU it last ran on; ``before`` and ``after`` are each thread's cumulative on-CPU ns.
    Threads are placed most-running first until they cover ``cover`` of the process's
    on-CPU time in the interval. A process none of whose threads ran weighs its main thread's
    CPU (1). With ``affinity`` (``os.sched_getaffinity``, for the live /proc), a thread
    pinned to one CPU is placed there without reading its stat."""
    ran = sorted(
        # A thread new in the interval has no base: from its next one.
        ((ns - before.get(tid, ns), tid) for tid, ns in after.items()),
        reverse=True,
    )
    ran = [(t, tid) for t, tid in ran if t > 0]
    enough = cover * sum(t for t, _ in ran)
    weights: dict[int, float] = {}
    placed = 0
    for t, tid in ran:
        if placed >= enough:
            break
        cpu = only_cpu(affinity, tid) if affinity is not None else None
        if cpu is None:
            cpu = last_cpu(task_dir, tid)
        if cpu is not None:
            weights[cpu] = weights.get(cpu, 0.0) + t
        placed += t
    if not weights:
        cpu = last_cpu(task_dir, main_tid)
        if cpu is not None:
            weights[cpu] = 1.0
    return weights


def rank_share(weights: Mapping[int, float], shares: Mapping[int, float]) -> tuple[float, int]:
    """(the CPUs' interrupt shares weighted by where the rank ran, the CPU it ran on most);
    (NaN, -1) when none of its CPUs has a share."""
    known = {cpu: w for cpu, w in weights.items() if w > 0 and cpu in shares}
    total = sum(known.values())
    if total <= 0:
        return NAN, -1
    share = sum(w * shares[cpu] for cpu, w in known.items()) / total
    return (share if math.isfinite(share) else NAN), max(sorted(known), key=known.__getitem__)
