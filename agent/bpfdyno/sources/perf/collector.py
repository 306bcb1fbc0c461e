"""Per-CPU perf counters: hardware (``pmu``) and software (``perf_sw``) collectors.

Two collectors, because their availability differs: many VMs expose no hardware PMU
(perf_event_open of cpu-cycles fails with ENOENT), yet the kernel's software counters work
everywhere. ``pmu`` is then unavailable with the reason and a fix, while ``perf_sw`` keeps
reporting. Both count system-wide per CPU (no BPF needed: the kernel keeps the counts) and
report per-interval deltas, never totals since start.

Hardware: cycles, instructions and cache misses in one group per CPU, so instructions per
cycle (IPC) and MIPS come from the same time slices; counts are scaled when the kernel
multiplexes the group. Software: page faults (all and major), context switches, CPU
migrations and cpu-clock. (task-clock is not exported: system-wide it equals cpu-clock.)

A system-wide context-switch counter makes the kernel do work on every context switch
(about 2 % of a pinned context-switch benchmark here, see docs/performance.md). The
scheduler collector counts switches per CPU anyway, so while it runs ``perf_sw`` takes the
counts from it (``switch_counts``) and opens its own counter only while that source has
nothing to give (not wired, not started yet, unavailable).
"""

from __future__ import annotations

import errno
import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.percpu import PerCpuCadence
from bpfdyno.sources.perf.metrics import (
    CACHE_MISSES,
    CPU_CLOCK,
    CTX_SWITCHES,
    CYCLES,
    IPC,
    MAJOR_FAULTS,
    MIGRATIONS,
    MIPS,
    PAGE_FAULTS,
)
from bpfdyno.sources.perf.perf_event import (
    PERF_TYPE_HARDWARE,
    PERF_TYPE_SOFTWARE,
    CounterGroup,
    GroupReading,
    Opener,
    PerfCounter,
    online_cpus,
    perf_event_open,
    scaled_delta,
)

HW_COUNTERS = (
    PerfCounter("cycles", PERF_TYPE_HARDWARE, 0),  # PERF_COUNT_HW_CPU_CYCLES
    PerfCounter("instructions", PERF_TYPE_HARDWARE, 1),  # PERF_COUNT_HW_INSTRUCTIONS
    PerfCounter("cache_misses", PERF_TYPE_HARDWARE, 3),  # PERF_COUNT_HW_CACHE_MISSES
)
SW_COUNTERS = (
    PerfCounter("cpu_clock", PERF_TYPE_SOFTWARE, 0),  # PERF_COUNT_SW_CPU_CLOCK (ns)
    PerfCounter("page_faults", PERF_TYPE_SOFTWARE, 2),  # PERF_COUNT_SW_PAGE_FAULTS
    PerfCounter("cpu_migrations", PERF_TYPE_SOFTWARE, 4),  # PERF_COUNT_SW_CPU_MIGRATIONS
    PerfCounter("major_faults", PERF_TYPE_SOFTWARE, 6),  # PERF_COUNT_SW_PAGE_FAULTS_MAJ
)
CONTEXT_SWITCHES = PerfCounter("context_switches", PERF_TYPE_SOFTWARE, 3)

#: Per-CPU context switches since some fixed point, or None while that source has none.
SwitchCounts = Callable[[], Mapping[int, int] | None]


class _PerCpuCounters(Collector):
    """Opens one counter group per online CPU and turns read deltas into samples."""

    counters: tuple[PerfCounter, ...] = ()
    optional: Collection[str] = ()
    grouped = True
    may_block = False  # read(2) of perf counters

    def __init__(
        self,
        opener: Opener = perf_event_open,
        cpus: Sequence[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        per_cpu_every: int = 1,
    ) -> None:
        self._opener = opener
        self._cpus = cpus
        self._clock = clock
        #: Which rounds read the counters (`bpfdyno.sources.percpu`).
        self.per_cpu = PerCpuCadence(per_cpu_every)
        self._groups: list[CounterGroup] = []
        self._prev: tuple[float, list[GroupReading]] | None = None

    def start(self) -> None:
        """Open the counters on every online CPU.

        Raises:
            CollectorUnavailable: the kernel refused; the reason says why and what to do.
        """
        cpus = list(self._cpus) if self._cpus is not None else online_cpus()
        try:
            for cpu in cpus:
                self._groups.append(
                    CounterGroup(cpu, self.counters, self.optional, self._opener, self.grouped)
                )
        except OSError as e:
            self.close()
            raise CollectorUnavailable(self._unavailable_reason(e), self._absent(e)) from e
        self._prev = (self._clock(), [g.read() for g in self._groups])
        self.per_cpu.due()  # that read was this round's: the first report comes `every` later

    def collect(self) -> Sequence[Sample]:
        """Read every group; rates over the time since the previous read.

        On a node with many CPUs only every few rounds (`per_cpu_every`): nothing is read
        in between, and the next rates cover the longer interval.
        """
        if self._prev is None:
            raise RuntimeError(f"the {self.name} collector is not started (or was closed)")
        if not self.per_cpu.due():
            return []
        now, readings = self._clock(), [g.read() for g in self._groups]
        (then, before), self._prev = self._prev, (now, readings)
        dt = now - then
        if dt <= 0:
            return []
        extra = self._extra_deltas()
        out: list[Sample] = []
        for group, b, a in zip(self._groups, before, readings, strict=True):
            deltas = {c.name: scaled_delta(b, a, c.name) for c in self.counters}
            deltas.update(extra.get(group.cpu, {}))
            out += self._samples(str(group.cpu), deltas, dt)
        return out + self._host_samples(before, readings, dt)

    def _extra_deltas(self) -> dict[int, dict[str, float]]:
        """Counts since the previous collect that come from elsewhere, by CPU and name."""
        return {}

    def close(self) -> None:
        """Close every counter (idempotent)."""
        for g in self._groups:
            g.close()
        self._groups = []
        self._prev = None

    def _samples(self, cpu: str, deltas: dict[str, float], dt: float) -> list[Sample]:
        raise NotImplementedError

    def _host_samples(
        self, before: list[GroupReading], after: list[GroupReading], dt: float
    ) -> list[Sample]:
        return []

    def _absent(self, e: OSError) -> bool:
        """Whether ``e`` means the counters do not exist here (normal), not a fault."""
        return False

    def _unavailable_reason(self, e: OSError) -> str:
        name = self.counters[0].name
        code = errno.errorcode.get(e.errno or 0, str(e.errno))
        if e.errno in (errno.EACCES, errno.EPERM):
            return (
                f"perf_event_open({name}) refused ({code}); run as root, grant CAP_PERFMON, "
                "or set kernel.perf_event_paranoid to 0 or lower"
            )
        return f"perf_event_open({name}) failed with {code} ({e.strerror}); check dmesg"


class PmuCollector(_PerCpuCounters):
    """Hardware counters: IPC, MIPS, cycles and cache misses per CPU."""

    name = "pmu"
    counters = HW_COUNTERS
    optional = ("cache_misses",)

    def _absent(self, e: OSError) -> bool:
        return e.errno in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV)  # no PMU (a VM)

    def _unavailable_reason(self, e: OSError) -> str:
        if self._absent(e):
            code = errno.errorcode.get(e.errno or 0, str(e.errno))
            return (
                f"no hardware PMU: perf_event_open(cycles) failed with {code}; this machine "
                "(often a VM) exposes no hardware counters; enable the virtual PMU (e.g. "
                "KVM/QEMU -cpu host,pmu=on) or run on bare metal. Software counters are in "
                "the perf_sw collector."
            )
        return super()._unavailable_reason(e)

    def _samples(self, cpu: str, deltas: dict[str, float], dt: float) -> list[Sample]:
        labels = {"cpu": cpu}
        cycles, instructions = deltas["cycles"], deltas["instructions"]
        return [
            sample(IPC, instructions / cycles if cycles > 0 else math.nan, labels),
            sample(MIPS, instructions / dt / 1e6, labels),
            sample(CYCLES, cycles / dt, labels),
            sample(CACHE_MISSES, deltas["cache_misses"] / dt, labels),
        ]

    def _host_samples(
        self, before: list[GroupReading], after: list[GroupReading], dt: float
    ) -> list[Sample]:
        cycles = instructions = 0.0
        for b, a in zip(before, after, strict=True):
            c, i = scaled_delta(b, a, "cycles"), scaled_delta(b, a, "instructions")
            if not (math.isnan(c) or math.isnan(i)):
                cycles, instructions = cycles + c, instructions + i
        labels = {"cpu": "all"}
        return [
            sample(IPC, instructions / cycles if cycles > 0 else math.nan, labels),
            sample(MIPS, instructions / dt / 1e6, labels),
        ]


class PerfSwCollector(_PerCpuCounters):
    """Software counters: page faults, context switches, migrations, cpu-clock per CPU.

    Args:
        opener: the perf_event_open syscall (replaceable in tests).
        cpus: CPUs to count on (default: the online ones).
        clock: monotonic seconds.
        switch_counts: per-CPU context switches from another source (the sched
            collector's `cpu_switch_counts`); while it returns None, a perf counter of this
            collector counts them.
        switch_estimate: how that source estimated them ("" while they are exact; the sched
            collector's `switch_estimate`): the series is labelled with it.
        per_cpu_every: read and report every this many rounds (`bpfdyno.sources.percpu`).
    """

    name = "perf_sw"
    counters = SW_COUNTERS
    optional = ("major_faults",)
    grouped = False  # never multiplexed; and a cpu-clock-led group's members never count

    def __init__(
        self,
        opener: Opener = perf_event_open,
        cpus: Sequence[int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        switch_counts: SwitchCounts | None = None,
        switch_estimate: Callable[[], str] | None = None,
        per_cpu_every: int = 1,
    ) -> None:
        super().__init__(opener, cpus, clock, per_cpu_every)
        self._switch_counts = switch_counts
        self._switch_estimate = switch_estimate
        self._estimate = ""
        self._own_switches: list[CounterGroup] = []
        self._prev_switches: dict[int, int] | None = None

    def start(self) -> None:
        """Open the counters on every online CPU (context switches too, unless sourced).

        Raises:
            CollectorUnavailable: the kernel refused; the reason says why and what to do.
        """
        super().start()
        if self._switch_counts is None:
            try:
                self._prev_switches = self._read_own_switches()
            except OSError as e:
                self.close()
                raise CollectorUnavailable(self._unavailable_reason(e)) from e

    def close(self) -> None:
        """Close every counter (idempotent)."""
        self._close_own_switches()
        super().close()

    def _extra_deltas(self) -> dict[int, dict[str, float]]:
        counts = self._switch_counts() if self._switch_counts is not None else None
        if counts is not None:
            self._close_own_switches()
            self._estimate = self._switch_estimate() if self._switch_estimate else ""
        else:
            counts = self._read_own_switches()
            self._estimate = ""
        prev, self._prev_switches = self._prev_switches, dict(counts)
        if prev is None:  # a new source: rates from the next collect on
            return {g.cpu: {CONTEXT_SWITCHES.name: math.nan} for g in self._groups}
        return {
            cpu: {CONTEXT_SWITCHES.name: _counter_delta(prev.get(cpu), n)}
            for cpu, n in counts.items()
        }

    def _read_own_switches(self) -> dict[int, int]:
        if not self._own_switches:
            self._prev_switches = None
            for g in self._groups:
                self._own_switches.append(
                    CounterGroup(g.cpu, (CONTEXT_SWITCHES,), (), self._opener, grouped=False)
                )
        return {g.cpu: g.read().values[CONTEXT_SWITCHES.name] for g in self._own_switches}

    def _close_own_switches(self) -> None:
        if self._own_switches:
            for g in self._own_switches:
                g.close()
            self._own_switches = []
            self._prev_switches = None

    def _samples(self, cpu: str, deltas: dict[str, float], dt: float) -> list[Sample]:
        labels = {"cpu": cpu}
        return [
            sample(PAGE_FAULTS, deltas["page_faults"] / dt, labels),
            sample(MAJOR_FAULTS, deltas["major_faults"] / dt, labels),
            sample(CTX_SWITCHES, deltas[CONTEXT_SWITCHES.name] / dt, labels, self._estimate),
            sample(MIGRATIONS, deltas["cpu_migrations"] / dt, labels),
            sample(CPU_CLOCK, deltas["cpu_clock"] / 1e9 / dt, labels),
        ]


def _counter_delta(before: int | None, after: int) -> float:
    """``after - before`` of a cumulative count; NaN without a before or after a restart."""
    return float(after - before) if before is not None and after >= before else math.nan
