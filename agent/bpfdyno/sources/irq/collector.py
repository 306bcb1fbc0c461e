"""Interrupt telemetry: ``bpf/irq.bpf.c`` for softirq and handler time, ``/proc/interrupts``.

Two parts, each working without the other:

- **BPF** (``bpf/irq.bpf.c``, four programs on the ``irq:softirq_*`` and
  ``irq:irq_handler_*`` raw tracepoints): per CPU, the time and runs of each softirq and of
  device interrupt handlers, kept in a per-CPU array that each collection reads once. The
  same array answers `cpu_interrupt_times` for the ``fabric`` track of traces.
- **/proc/interrupts**: interrupts per IRQ (named after its handlers: NIC queues, RDMA
  completion vectors, the GPU) and per (IRQ, CPU).

Rates come from the difference of two readings; the first collection returns none. A
(CPU, softirq) or (IRQ, CPU) pair is reported from its first event since the agent started,
so CPUs that never see NET_TX or an IRQ pinned elsewhere do not fill the store with zeros;
(IRQ, CPU) pairs are capped at ``[irq] max_irq_cpu_series``.

If the BPF part cannot load (no BPF, not root), the collector keeps reading /proc/interrupts
and says why the softirq time is missing (degraded); if neither part works it is unavailable.

The overhead budget's step ``irq.softirq_detached`` detaches the four programs: a storm of
small packets over loopback runs two softirqs per datagram, each paying the entry and exit
programs inside the sender's time slice. While the step is in force, and for any interval
it was in force part of, the BPF series are not known (NaN, never 0); /proc/interrupts goes
on. A trace that records interrupt times (the ``fabric`` track) keeps them whatever the
load: while one holds the programs (`hold_for_trace`), the step leaves them attached, and
what they cost meanwhile is the trace's requester's (`requested_programs`, charged by the
budget like the capture's own programs), not the agent's; when the last such trace ends the
step detaches them again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import compress
from operator import ne, sub
from pathlib import Path

from bpfdyno.core.budget import Reduction, RequestedPrograms, degraded_by
from bpfdyno.core.config import IrqSection
from bpfdyno.core.metrics import Labels, Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.maps import percpu_words
from bpfdyno.ebpf.program import BpfProgram
from bpfdyno.ebpf.reductions import DetachedFunctions
from bpfdyno.ebpf.runstats import DEFAULT_ON_S, DEFAULT_PERIOD_S
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.counters import counter_delta
from bpfdyno.sources.host.procfs import ProcfsError
from bpfdyno.sources.irq.metrics import (
    CPU_INTERRUPTS,
    CPU_SERIES_OMITTED,
    HARDIRQ_RUNS,
    HARDIRQ_TIME,
    INTERRUPTS,
    SOFTIRQ_RUNS,
    SOFTIRQ_TIME,
)
from bpfdyno.sources.irq.procfs import Interrupts, read_interrupts
from bpfdyno.sources.percpu import PerCpuCadence
from bpfdyno.sources.perf.perf_event import online_cpus

log = logging.getLogger(__name__)

#: The kernel's softirq vectors in order (the rows of /proc/softirqs; IRQ_NR_SOFTIRQS in
#: bpf/irq.h; a test checks both).
SOFTIRQS = (
    "HI",
    "TIMER",
    "NET_TX",
    "NET_RX",
    "BLOCK",
    "IRQ_POLL",
    "TASKLET",
    "SCHED",
    "HRTIMER",
    "RCU",
)
#: Word offsets in struct irq_cpu (bpf/irq.h).
_SOFT_NS, _SOFT_COUNT, _HARD_NS, _HARD_COUNT = (
    0,
    len(SOFTIRQS),
    2 * len(SOFTIRQS),
    2 * len(SOFTIRQS) + 1,
)
CPU_WORDS = 2 * len(SOFTIRQS) + 6

#: Raw tracepoint -> program, in attach order (exits first: an entry without its exit would
#: leave a start time that the exit program then takes for the next one).
PROGRAMS = (
    ("softirq_exit", "bpfdyno_softout"),
    ("irq_handler_exit", "bpfdyno_hardout"),
    ("softirq_entry", "bpfdyno_softin"),
    ("irq_handler_entry", "bpfdyno_hardin"),
)
_CPU_MAP = "bpfdyno_icpu"
#: Fields of struct irq_cpu that hold a run in progress (bpf/irq.h).
_IN_PROGRESS = ("softirq_start_ns", "hardirq_start_ns", "nested_ns")


@dataclass(frozen=True, slots=True)
class CpuInterrupts:
    """Cumulative interrupt time and runs of one CPU since the program was loaded.

    Attributes:
        softirq_ns: time in each softirq, in the order of `SOFTIRQS`.
        softirq_runs: runs of each softirq.
        hardirq_ns: time in device interrupt handlers.
        hardirq_runs: device interrupt handler runs.
    """

    softirq_ns: tuple[int, ...]
    softirq_runs: tuple[int, ...]
    hardirq_ns: int
    hardirq_runs: int


@dataclass(frozen=True, slots=True)
class _Reading:
    t: float
    cpus: dict[int, CpuInterrupts]
    attached_ns: int  # how long the programs had been attached when it was read
    at_ns: int  # time.monotonic_ns() of that
    steps_taken: int  # how often the budget's step had been taken when it was read
    reduced: bool  # whether the step was in force then


class _DetachedUnlessTraced(DetachedFunctions):
    """``irq.softirq_detached``: the programs detached, except while a trace holds them.

    The budget calls `apply` and `undo` on its thread, traces come and go on the capture's:
    one lock (the collector's) orders them, so the programs end attached exactly while the
    step is not in force or some trace holds them.
    """

    def __init__(
        self,
        program: BpfProgram,
        fns: Sequence[str],
        lock: threading.Lock,
        held: Callable[[], bool],
        **names: str,
    ) -> None:
        super().__init__(program, fns, **names)
        self._hold_lock = lock
        self._held = held
        self.taken = 0  # how often it was taken (an interval across one is not known)
        self.since = 0.0  # wall-clock time it was last taken

    def apply(self) -> None:
        with self._hold_lock:
            if not self.active:
                self.taken += 1
                self.since = time.time()
            self.active = True
            if not self._held():
                self.program.suspend(self.fns, True)

    def undo(self) -> None:
        with self._hold_lock:
            self.program.suspend(self.fns, False)
            self.active = False


class IrqCollector(Collector):
    """Softirq and interrupt-handler time per CPU (BPF), interrupts per IRQ and CPU (procfs).

    Args:
        root: directory holding ``proc/`` and ``sys/`` (a fixture tree in tests).
        max_irq_cpu_series: most (IRQ, CPU) pairs reported (``[irq] max_irq_cpu_series``).
        load_bpf: load the BPF part (False: /proc/interrupts only, e.g. for tests of it).
        stats_on_s: BPF run statistics are on for this long ...
        stats_period_s: ... once per this period (see `bpfdyno.ebpf.runstats.BpfRunStats`).
        clock: monotonic seconds.
        header_cache: where `bpfdyno.ebpf.kheaders` caches generated headers.
        per_cpu_every: read and report every this many rounds (`bpfdyno.sources.percpu`):
            every series of this collector is per CPU or per IRQ, and /proc/interrupts of a
            224-CPU node costs 2-10 ms to parse; each rate covers the longer interval.

    Raises:
        ValueError: ``max_irq_cpu_series`` below 0.
    """

    name = "irq"
    may_block = False  # a per-CPU BPF array and one procfs file

    def __init__(
        self,
        *,
        root: Path = Path("/"),
        max_irq_cpu_series: int = IrqSection.max_irq_cpu_series,
        load_bpf: bool = True,
        stats_on_s: float = DEFAULT_ON_S,
        stats_period_s: float = DEFAULT_PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        header_cache: Path | None = None,
        per_cpu_every: int = 1,
    ) -> None:
        if max_irq_cpu_series < 0:
            raise ValueError(
                f"[irq] max_irq_cpu_series must be 0 or more, got {max_irq_cpu_series}"
            )
        self._root = root
        self._max_pairs = max_irq_cpu_series
        self._load_bpf = load_bpf
        self._stats_args = (stats_on_s, stats_period_s)
        self._clock = clock
        self._header_cache = header_cache
        self._per_cpu = PerCpuCadence(per_cpu_every)
        self._program: BpfProgram | None = None
        self._lock = threading.Lock()  # the program, against `cpu_interrupt_times` callers
        self._online: frozenset[int] = frozenset()
        self._bpf_missing = ""
        self._procfs_error = ""
        self._prev_bpf: _Reading | None = None
        self._prev_irqs: tuple[float, Interrupts] | None = None
        #: CPU -> the softirqs (vector numbers) that ran there since the start, with labels.
        self._soft_pairs: dict[int, list[tuple[int, Labels]]] = {}
        #: IRQ -> the columns (of /proc/interrupts' CPUs) where it had interrupts, each with
        #: its series' labels (built once: a big machine reports thousands of pairs).
        self._irq_pairs: dict[str, list[tuple[int, Labels]]] = {}
        self._pair_count = 0
        self._pairs_seeded = False  # every line's pairs looked at once
        self._omitted_pairs: set[tuple[str, int]] = set()
        self._detached: _DetachedUnlessTraced | None = None  # the budget's step (at start)
        #: Traces that record interrupt times: key -> who asked for it (`hold_for_trace`).
        self._hold_lock = threading.Lock()
        self._holders: dict[Hashable, str] = {}
        #: Requesters that held the programs since the budget last asked (`requested_programs`).
        self._held_since_asked: set[str] = set()

    @classmethod
    def from_config(cls, section: IrqSection, *, per_cpu_every: int = 1) -> IrqCollector:
        """Build the collector from the ``[irq]`` config section."""
        return cls(max_irq_cpu_series=section.max_irq_cpu_series, per_cpu_every=per_cpu_every)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Load and attach the BPF part, check /proc/interrupts, take the first readings.

        Raises:
            CollectorUnavailable: neither part works here (the reason names both).
        """
        procfs_error = ""
        try:
            self._prev_irqs = (self._clock(), read_interrupts(self._root))
        except ProcfsError as e:
            procfs_error = str(e)
        if self._load_bpf:
            try:
                self._program = self._load()
            except BpfLoadError as e:
                self._bpf_missing = str(e)
        else:
            self._bpf_missing = "the BPF part is turned off"
        if self._program is None and procfs_error:
            raise CollectorUnavailable(
                f"no interrupt source works: softirq time: {self._bpf_missing}; "
                f"/proc/interrupts: {procfs_error}"
            )
        self._online = frozenset(online_cpus(self._root / "sys/devices/system/cpu/online"))
        if self._program is not None:
            self._program.start_run_stats(*self._stats_args)
            self._detached = _DetachedUnlessTraced(
                self._program,
                [fn for _, fn in PROGRAMS],
                self._hold_lock,
                lambda: bool(self._holders),
                name="irq.softirq_detached",
                part=self.name,
                what="the softirq and interrupt-handler programs detached",
                lost=(
                    "softirq and device interrupt handler time and runs per CPU are not known "
                    "(NaN); interrupts per IRQ (/proc/interrupts) stay exact; traces "
                    "still record interrupt times, at their requesters' cost"
                ),
            )
            self._prev_bpf = self._read_bpf()

    def _load(self) -> BpfProgram:
        program = BpfProgram.load("irq.bpf.c", header_cache=self._header_cache)
        try:
            for tracepoint, fn in PROGRAMS:
                first = fn == PROGRAMS[0][1]
                program.attach_raw_tracepoint(
                    tracepoint, fn, before_attach=self._forget_runs_in_progress if first else None
                )
        except BpfLoadError:
            program.close()
            raise
        return program

    def _forget_runs_in_progress(self) -> None:
        """Clear every CPU's start times before the programs are attached (again).

        Detached one after another, an entry program can run after its exit program is gone
        and leave a start time behind; taken at the next exit after the programs came back,
        it would count the whole gap as softirq time. The exit programs are attached first
        (`PROGRAMS`), so when this runs nothing is attached to change the array meanwhile.
        """
        if self._program is None:
            return  # the first attach: the array is all zeros
        table = self._program.table(_CPU_MAP)
        values = table.getvalue(table.Key(0))
        for v in values:
            for name in _IN_PROGRESS:
                setattr(v, name, 0)
        table[table.Key(0)] = values

    def close(self) -> None:
        """Detach and unload the BPF part (idempotent)."""
        with self._lock:
            if self._program is not None:
                self._program.close()
                self._program = None

    # --- collection ----------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """Rates of the interval since the previous collection (none on the first); on a
        big node only every few rounds (`per_cpu_every`): nothing is read in between.

        Raises:
            ProcfsError: /proc/interrupts failed and there is no BPF part to report instead.
        """
        out: list[Sample] = []
        if not self._per_cpu.due():
            return out
        if self._program is not None:
            cur = self._read_bpf()
            prev, self._prev_bpf = self._prev_bpf, cur
            if prev is not None and cur.t > prev.t:
                out += self._bpf_samples(prev, cur)
            out += self._program.run_stats_samples()
        try:
            out += self._procfs_samples()
            self._procfs_error = ""
        except ProcfsError as e:
            if not self._procfs_error:
                log.warning("interrupts per IRQ skipped: %s", e)
            self._procfs_error = str(e)
            if self._program is None:
                raise
        return out

    def reductions(self) -> Sequence[Reduction]:
        """The budget's step: detach the softirq and handler programs."""
        return [self._detached] if self._detached is not None else []

    def health(self) -> tuple[PartState, str] | None:
        """Degraded while one part is missing or the budget holds its step, with why; else
        what is measured."""
        reduced = degraded_by(self.reductions())
        if reduced is not None:
            with self._hold_lock:
                traces = len(self._holders)
            if traces:
                state, why = reduced
                return state, (
                    f"{why}; attached meanwhile for {traces} trace(s) recording interrupt "
                    "times (their requesters' cost)"
                )
            return reduced
        missing = []
        if self._program is None:
            missing.append(f"softirq and interrupt-handler time unavailable: {self._bpf_missing}")
        if self._procfs_error:
            missing.append(f"interrupts per IRQ unavailable: {self._procfs_error}")
        if missing:
            return PartState.DEGRADED, "; ".join(missing)
        return PartState.OK, (
            f"softirq and handler time on {len(self._online)} CPUs; "
            f"{self._pair_count} (IRQ, CPU) pairs with interrupts"
        )

    def cpu_interrupt_times(self) -> dict[int, CpuInterrupts] | None:
        """Online CPU -> its cumulative interrupt time now; None without the BPF part.

        Thread-safe: the trace capture calls it at its own rate.
        """
        with self._lock:
            if self._program is None or not self._program.attached(PROGRAMS[0][1]):
                return None  # detached: the counts stand still, not known
            return self._read_bpf().cpus

    def hold_for_trace(self, key: Hashable, requester: str) -> None:
        """Keep the programs attached for the trace ``key`` until `release_for_trace`, even
        while the budget's step is in force (then what they cost is ``requester``'s).

        Call it before the trace's first reading: the programs are attached when it returns
        (unless attaching failed: `why_no_interrupt_times` then says why).
        """
        with self._hold_lock:
            self._holders[key] = requester
            self._held_since_asked.add(requester)
            if self._program is not None and self._detached is not None and self._detached.active:
                self._program.suspend(self._detached.fns, False)

    def release_for_trace(self, key: Hashable) -> None:
        """The trace ``key`` no longer needs the programs (after its last reading); the last
        one gone while the step is in force detaches them again. Unknown keys are ignored."""
        with self._hold_lock:
            if self._holders.pop(key, None) is None or self._holders:
                return
            if self._program is not None and self._detached is not None and self._detached.active:
                self._program.suspend(self._detached.fns, True)

    def requested_programs(self) -> RequestedPrograms:
        """The programs as the traces' work, while the budget's step is in force (any thread).

        Then they run only because traces hold them: the budget charges what they cost to
        the requesters of the traces that held them since it last asked (it asks once a
        window) and leaves it out of the agent's cost. Otherwise they are the agent's own
        (the collector's metrics need them anyway): none are returned.
        """
        with self._hold_lock:
            holding = set(self._holders.values())
            readers = self._held_since_asked | holding
            self._held_since_asked = holding  # they hold into the next window too
            step = self._detached
            if self._program is None or step is None or not step.active:
                return RequestedPrograms()
            ids = self._program.program_ids()
            named = tuple(sorted(r for r in readers if r))  # "": nobody to charge
            return RequestedPrograms(frozenset(ids[fn] for fn in step.fns if fn in ids), named)

    def why_no_interrupt_times(self) -> str:
        """Why `cpu_interrupt_times` answers None now, for a trace's notes ("" if it does not)."""
        if self._program is None:
            why = self._bpf_missing or "the collector is closed"
            return f"the irq collector's BPF program is not loaded ({why})"
        step = self._detached
        if self._program.attached(PROGRAMS[0][1]):
            return ""
        if step is not None and step.active:
            since = datetime.fromtimestamp(step.since).strftime("%H:%M:%S")
            return (
                f"the irq collector's programs are detached by the overhead budget since {since} "
                f"({step.name}) and could not be attached again for the trace (see the agent's "
                "log and `bpfdyno status`)"
            )
        return (
            "the irq collector's programs are not attached (see the agent's log and "
            "`bpfdyno status`)"
        )

    # --- internals -----------------------------------------------------------------------

    def _read_bpf(self) -> _Reading:
        assert self._program is not None
        at_ns = time.monotonic_ns()
        attached_ns = self._program.attached_ns(PROGRAMS[0][1], at_ns) or 0
        step = self._detached
        taken, reduced = (step.taken, step.active) if step is not None else (0, False)
        words = percpu_words(self._program.table(_CPU_MAP))
        t = self._clock()
        cpus = {
            cpu: CpuInterrupts(
                tuple(w[_SOFT_NS : _SOFT_NS + len(SOFTIRQS)]),
                tuple(w[_SOFT_COUNT : _SOFT_COUNT + len(SOFTIRQS)]),
                w[_HARD_NS],
                w[_HARD_COUNT],
            )
            for cpu, w in enumerate(words)
            if cpu in self._online  # bcc returns a slot for every *possible* CPU
        }
        return _Reading(t, cpus, attached_ns, at_ns, taken, reduced)

    def _bpf_samples(self, prev: _Reading, cur: _Reading) -> list[Sample]:
        dt = cur.t - prev.t
        # Attached the whole interval, or its counts hold only part of it: not known. Nor
        # while the budget's step held any of it: attached then only for a trace, and only
        # while it ran (the series would come and go with other people's traces).
        known = (
            cur.attached_ns - prev.attached_ns == cur.at_ns - prev.at_ns
            and not (prev.reduced or cur.reduced)
            and prev.steps_taken == cur.steps_taken
        )
        if not known:
            dt = math.nan
        out: list[Sample] = []
        for cpu, now in sorted(cur.cpus.items()):
            before = prev.cpus.get(cpu)
            if before is None:
                continue
            name = str(cpu)
            labels = {"cpu": name}
            out.append(
                sample(HARDIRQ_TIME, (now.hardirq_ns - before.hardirq_ns) / 1e9 / dt, labels)
            )
            out.append(sample(HARDIRQ_RUNS, (now.hardirq_runs - before.hardirq_runs) / dt, labels))
            vecs = self._soft_pairs.get(cpu)
            if vecs is None or len(vecs) < len(SOFTIRQS):  # softirqs that ran here for once
                seen = list(compress(range(len(SOFTIRQS)), now.softirq_runs))
                if vecs is None or len(seen) != len(vecs):
                    vecs = self._soft_pairs[cpu] = [
                        (vec, (("cpu", name), ("softirq", SOFTIRQS[vec]))) for vec in seen
                    ]
            spent = list(map(sub, now.softirq_ns, before.softirq_ns))
            runs = list(map(sub, now.softirq_runs, before.softirq_runs))
            for vec, pair in vecs:
                out.append(Sample(SOFTIRQ_TIME, spent[vec] / 1e9 / dt, pair))
                out.append(Sample(SOFTIRQ_RUNS, runs[vec] / dt, pair))
        return out

    def _procfs_samples(self) -> list[Sample]:
        t = self._clock()
        cur = read_interrupts(self._root, self._prev_irqs[1] if self._prev_irqs else None)
        prev, self._prev_irqs = self._prev_irqs, (t, cur)
        if prev is None or t <= prev[0]:
            return []
        dt = t - prev[0]
        columns = [str(cpu) for cpu in cur.cpus]
        first, self._pairs_seeded = not self._pairs_seeded, True
        out: list[Sample] = []
        for irq, line in cur.lines.items():
            old = prev[1].lines.get(irq)
            if old is None or len(old.fields) != len(line.fields):
                continue  # a new IRQ (a device came), or the CPUs changed: rates from the next
            per_cpu = len(line.fields) == len(columns)
            if first and per_cpu:
                nonzero = compress(range(len(columns)), map("0".__ne__, line.fields))
                self._add_pairs(irq, list(nonzero), columns)
            # Only the columns whose text changed are converted (on a large machine, most do
            # not change between two readings).
            moved = (
                []
                if line is old
                else list(compress(range(len(line.fields)), map(ne, line.fields, old.fields)))
            )
            deltas = {
                col: counter_delta(int(old.fields[col]), int(line.fields[col])) for col in moved
            }
            if per_cpu and moved:
                self._add_pairs(irq, [col for col in moved if line.fields[col] != "0"], columns)
            if None not in deltas.values():
                total = sum(d for d in deltas.values() if d is not None)
                named = (("irq", irq), ("name", line.name))
                out.append(Sample(INTERRUPTS, total / dt, named))
            for col, labels in self._irq_pairs.get(irq, ()):
                delta = deltas.get(col, 0)
                if delta is not None:
                    out.append(Sample(CPU_INTERRUPTS, delta / dt, labels))
        out.append(sample(CPU_SERIES_OMITTED, len(self._omitted_pairs)))
        return out

    def _add_pairs(self, irq: str, nonzero: list[int], columns: list[str]) -> None:
        """Report these (IRQ, column) pairs, which have had interrupts, from now on (up to the
        cap); those reported already are skipped."""
        have = self._irq_pairs.get(irq, [])
        known = {col for col, _ in have}
        for col in nonzero:
            if col in known or (irq, col) in self._omitted_pairs:
                continue
            if self._pair_count < self._max_pairs:
                have = self._irq_pairs[irq] = sorted(
                    [*have, (col, (("irq", irq), ("cpu", columns[col])))]
                )
                known.add(col)
                self._pair_count += 1
                continue
            if not self._omitted_pairs:
                log.warning(
                    "more than [irq] max_irq_cpu_series = %d (IRQ, CPU) pairs have interrupts; "
                    "the others are left out (irq_cpu_series_omitted counts them)",
                    self._max_pairs,
                )
            self._omitted_pairs.add((irq, col))
