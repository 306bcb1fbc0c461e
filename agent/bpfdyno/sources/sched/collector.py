"""Scheduler telemetry from BPF (``bpf/sched.bpf.c``) and the kernel's own per-thread books.

The hot path is one small program on ``sched_switch`` that keeps, per CPU, the context
switches, the time non-idle tasks ran, and the run-queue latency histogram (from the
kernel's ``sched_info.last_queued``; no per-thread state, no clock read). Per-process times
come from the kernel's books of every thread (on-CPU, run-queue wait, context switches,
migrations; blocked is the rest of each thread's life), read once per collection with a BPF
task iterator, plus the last books of threads that exited since the previous collection,
which the exit program writes to a ring buffer that each collection drains. See
``bpf/sched.h``.

Every ``collect`` turns the per-CPU counters into per-second rates and interval quantiles,
sums threads into processes for the process table (`per_process`), and hands the exec/exit
events to ``sink`` as `KernelEvent`s. The walk of every thread is what grows with the node
(thousands of threads on a big one): when given ``walk_demand`` (the process table says
whether anyone reads it), it walks every round only while someone does, else every
``idle_walk_s``; the exited threads' books and the events are drained every round anyway.
A reader is never answered from that idle walk: `fresh_per_process` walks first when the
last walk is older than half a round (the process table's updates ask for it that way), and
each walk says when it read the books (`ReadAt`), so rates are over the time between walks.

Why the process totals are exact and never go down: a thread's books only grow; a thread is
counted live by the iterator until its exit is recorded; its last books then replace its
live ones, in the same collection when it exited after the iterator saw it (drained after
the walk), otherwise in the next one. Nothing is read-then-cleared. The exit program marks
nothing on the exiting thread (that cost an allocation per exit), so a thread between its
exit record and its removal from the task list is still walked: a walk drops the books of
every thread whose last books were drained, by tid and start time (tids are reused), and
those records are remembered while a walk still finds their thread (`_Recorded`).

Under the overhead budget (`reductions`): the switch program may be attached only part of
the time (per-CPU switches and busy time and run-queue waits are then scaled by the share of
the interval it was attached, and labelled ``estimate="sampled"``; per-process times stay
the kernel's exact books), and the exec/exit programs may be detached (exec/exit events and
their rates are then missing, and a thread that exits meanwhile keeps the books the previous
walk read: its process's totals are a little short, never going down).
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bpfdyno.core.budget import REQUESTED, SAMPLED, Reduction, degraded_by, sampled_share
from bpfdyno.core.config import SchedSection
from bpfdyno.core.events import EventSink, KernelEvent, MonotonicClock
from bpfdyno.core.histogram import histogram_quantile, log2_export_buckets
from bpfdyno.core.metrics import HistogramSample, Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.core.text import shown_c_string
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.fdmap import RingDrainer
from bpfdyno.ebpf.headers import header_defines, header_enum, header_text
from bpfdyno.ebpf.maps import percpu_flat, percpu_words
from bpfdyno.ebpf.program import BpfProgram, RingBuffer, TaskIterator
from bpfdyno.ebpf.reductions import DetachedFunctions, SampledFunctions
from bpfdyno.ebpf.runstats import DEFAULT_ON_S, DEFAULT_PERIOD_S
from bpfdyno.sources.base import Collector, CollectorUnavailable, FillRate, ReadAt
from bpfdyno.sources.percpu import PerCpuCadence
from bpfdyno.sources.perf.perf_event import online_cpus
from bpfdyno.sources.sched.metrics import (
    CPU_BUSY,
    DROPPED,
    EXECS,
    EXITS,
    MIGRATIONS,
    OFFCPU,
    ONCPU,
    RUNQ_HISTOGRAM,
    RUNQ_LATENCY,
    RUNQ_MEAN,
    RUNQ_WAITS,
    SWITCHES,
    TRACKED_THREADS,
)

log = logging.getLogger(__name__)


# From bpf/sched.h, the one definition of the numbers both sides use.
_HEADER = header_text("sched.h")
SCHED_HIST_SLOTS = header_defines(_HEADER, "SCHED_HIST_SLOTS")["SCHED_HIST_SLOTS"]
_KINDS = header_enum(_HEADER, "sched_event_kind")
SCHED_EV_EXEC, SCHED_EV_EXIT = _KINDS["SCHED_EV_EXEC"], _KINDS["SCHED_EV_EXIT"]
_ERRS = header_enum(_HEADER, "sched_error")
SCHED_ERR_EXIT_FULL = _ERRS["SCHED_ERR_EXIT_FULL"]
SCHED_ERR_RINGBUF = _ERRS["SCHED_ERR_RINGBUF"]
SCHED_ERR_MARK = _ERRS["SCHED_ERR_MARK"]
#: struct sched_task: tid, tgid, oncpu, runq wait, blocked, switches, migrations, start,
#: comm.
TASK_RECORD = struct.Struct("<IIQQQQQQ16s")
#: Where a `TASK_RECORD`'s start time is (with the tid, which thread it is).
_START = 7
#: struct sched_cpu: 8 words of counters, then the histogram.
_SWITCHES, _MIGRATIONS, _RUNQ_COUNT, _RUNQ_SUM, _BUSY, _HIST = 0, 1, 2, 3, 4, 8
CPU_WORDS = _HIST + SCHED_HIST_SLOTS

#: Tracepoint -> program (all BTF-typed), in attach order.
PROGRAMS = (
    ("sched_switch", "bpfdyno_switch"),
    ("sched_migrate_task", "bpfdyno_migrate"),
    ("sched_process_exec", "bpfdyno_exec"),
    ("sched_process_exit", "bpfdyno_exit"),
)
#: The task iterator's program.
ITERATOR = "bpfdyno_tasks"
QUANTILES = (0.5, 0.9, 0.99)
#: The last log2 slot exported as its own histogram bucket: 2**36 ns, 68.7 s.
EXPORT_LAST_SLOT = 35

#: The share of the time the switch program stays attached while the budget samples it.
SWITCH_SAMPLE_SHARE = 1 / 8

# The program's maps (bpf/sched.bpf.c).
_CPU_STATS = "bpfdyno_scpu"
_GEN = "bpfdyno_sgen"
_ERRORS = "bpfdyno_serrors"
_EXITED = "bpfdyno_sexit"
_EVENTS = "bpfdyno_sevents"

_DROP_REASONS = (
    (SCHED_ERR_EXIT_FULL, "exit_map_full"),
    (SCHED_ERR_RINGBUF, "ringbuf_full"),
    (SCHED_ERR_MARK, "task_storage"),
)


class ProcSched(NamedTuple):
    """Cumulative scheduler times of one process (all ns; see ``bpf/sched.h``).

    Since each thread started, live and exited threads together. ``offcpu_runnable_ns``
    equals ``runq_wait_ns`` (time runnable but waiting for a CPU, after a preemption or a
    wakeup) and ``offcpu_blocked_ns`` is the rest of the off-CPU time, so on-CPU + runnable
    + blocked is the sum of the threads' lifetimes.
    """

    tgid: int
    comm: str
    oncpu_ns: int
    offcpu_runnable_ns: int
    offcpu_blocked_ns: int
    runq_wait_ns: int
    switches: int
    migrations: int
    threads: int


@dataclass(frozen=True, slots=True)
class _Totals:
    """Cumulative host-wide counters at one instant."""

    t: float
    switches: tuple[int, ...]  # per CPU
    busy_ns: tuple[int, ...]  # per CPU
    migrations: int
    runq_count: int
    runq_sum_ns: int
    hist: tuple[int, ...]


# Indexes of a process accumulator: oncpu, runq wait, blocked, switches, migrations.
_N_TIMES = 5


class SchedCollector(Collector):
    """Loads sched.bpf.c, reads the kernel's books each interval, streams exec/exit events.

    The defaults of the map and ring buffer sizes are the ``[sched]`` config section's.

    Args:
        sink: receives the decoded events of each collection (e.g. ``FlightRecorder.add``).
        max_exits: thread exits remembered between two collections (``[sched] max_exits``).
        ringbuf_pages: exec/exit ring buffer size in pages, a power of two
            (``[sched] ringbuf_pages``).
        stats_on_s: BPF run statistics are on for this long ...
        stats_period_s: ... once per this period (see `bpfdyno.ebpf.runstats.BpfRunStats`).
        header_cache: where `bpfdyno.ebpf.kheaders` caches generated headers.
        walk_demand: whether someone reads the per-process times now; None: walk every round.
        idle_walk_s: while nobody does, walk the threads this often.
        round_s: the daemon's round: a walk is never repeated within half of it, whoever
            asks (`fresh_per_process`).
        readers: who reads the per-process times now: a walk made every round only for
            them is their requested work (`bpfdyno.core.budget.REQUESTED`).
        per_cpu_every: report the per-CPU series every this many rounds
            (`bpfdyno.sources.percpu`).

    Raises:
        ValueError: a size the kernel would refuse.
    """

    name = "sched"
    may_block = False  # BPF maps and an iterator over the kernel's task list

    def __init__(
        self,
        sink: EventSink | None = None,
        *,
        max_exits: int = SchedSection.max_exits,
        ringbuf_pages: int = SchedSection.ringbuf_pages,
        stats_on_s: float = DEFAULT_ON_S,
        stats_period_s: float = DEFAULT_PERIOD_S,
        header_cache: Path | None = None,
        walk_demand: Callable[[], bool] | None = None,
        idle_walk_s: float = 10.0,
        per_cpu_every: int = 1,
        round_s: float = 1.0,
        readers: Callable[[], Collection[str]] | None = None,
    ) -> None:
        if ringbuf_pages < 1 or ringbuf_pages & (ringbuf_pages - 1):
            raise ValueError(f"[sched] ringbuf_pages must be a power of two, got {ringbuf_pages}")
        if max_exits < 1:
            raise ValueError(f"[sched] max_exits must be at least 1, got {max_exits}")
        self._sink = sink
        exit_pages = exit_ring_pages(max_exits)
        self._defines = {"SCHED_EXIT_PAGES": exit_pages, "SCHED_RINGBUF_PAGES": ringbuf_pages}
        #: What fills between two rounds, and how much it holds: the exited threads' ring
        #: buffer (records), the event ring buffer (events).
        self._exits_fill = FillRate(exit_pages * _PAGE // _EXIT_RECORD)
        self._events_fill = FillRate(ringbuf_pages * _PAGE // _RING_RECORD)
        self._stats_args = (stats_on_s, stats_period_s)
        self._header_cache = header_cache
        self._program: BpfProgram | None = None
        self._tasks: TaskIterator | None = None
        self._events: RingBuffer[KernelEvent] | None = None
        self._exit_ring: RingDrainer | None = None
        self._recorded = _Recorded()
        self._clock = MonotonicClock()
        self._prev: _Totals | None = None
        #: tgid -> last books of its exited threads, until the process is gone.
        self._exited: dict[int, list[int]] = {}
        self._departed: dict[int, list[int]] = {}
        self._procs: dict[int, ProcSched] = {}
        self._comms: dict[bytes, str] = {}
        self._snapshot_lock = threading.Lock()
        self._online: frozenset[int] = frozenset()
        # The overhead budget's steps (made at start) and what they need between rounds.
        self._switch_sampled: SampledFunctions | None = None
        self._exits_detached: DetachedFunctions | None = None
        self._migrations_detached: DetachedFunctions | None = None
        self._switch_held_off_ns = 0  # how long the budget held the switch program off, so far
        self._prev_walk = b""
        self._exit_gap = False  # the exit program was off at some time since the last round
        #: Per-CPU switches added by scaling sampled intervals up (see `cpu_switch_counts`).
        self._switch_extra: dict[int, float] = {}
        self._walk_demand = walk_demand
        self._idle_walk_s = idle_walk_s
        self._per_cpu = PerCpuCadence(per_cpu_every)
        #: The totals (and the switch program's held-off time) when per-CPU series were
        #: last reported: their rates are over the time since.
        self._cpu_prev: tuple[_Totals, int] | None = None
        self._walk_t = 0.0  # monotonic time of the last walk (the middle of its read)
        self._procs_at = 0.0  # the same, published with `_procs` under the snapshot lock
        self._round_s = round_s
        self._walked_between = False  # a reader had the threads walked since the last round
        self._readers = readers
        # A walk, with the drain of exited threads that goes with it, runs under this lock:
        # in a round, or for a reader who needs the per-process times fresh.
        self._walk_lock = threading.Lock()
        #: Exec and exit events seen so far (other collectors watch it move).
        self.process_events = 0
        self._threads = 0  # live threads the last walk saw

    @classmethod
    def from_config(
        cls,
        section: SchedSection,
        *,
        sink: EventSink | None = None,
        walk_demand: Callable[[], bool] | None = None,
        per_cpu_every: int = 1,
        round_s: float = 1.0,
        readers: Callable[[], Collection[str]] | None = None,
    ) -> SchedCollector:
        """Build the collector from the ``[sched]`` config section."""
        return cls(
            sink,
            max_exits=section.max_exits,
            ringbuf_pages=section.ringbuf_pages,
            walk_demand=walk_demand,
            per_cpu_every=per_cpu_every,
            round_s=round_s,
            readers=readers,
        )

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Compile, load and attach the programs (once), and take the baseline reading.

        Raises:
            CollectorUnavailable: no BPF, no BTF, not root, or a kernel too old (< 5.11).
        """
        try:
            program = BpfProgram.load(
                "sched.bpf.c",
                defines=self._defines,
                flavour="btf",
                header_cache=self._header_cache,
            )
        except BpfLoadError as e:
            raise CollectorUnavailable(str(e)) from e
        try:
            for tp, fn in PROGRAMS:
                bump = (lambda: _bump_generation(program)) if fn == "bpfdyno_switch" else None
                program.attach_btf_tracepoint(tp, fn, before_attach=bump)
            self._tasks = program.open_task_iterator(ITERATOR)
            self._events = program.open_ring_buffer(_EVENTS, self._decode_event)
            exits = program.table(_EXITED)
            self._exit_ring = RingDrainer(exits.map_fd, exits.max_entries)
        except (BpfLoadError, OSError) as e:
            program.close()
            raise CollectorUnavailable(str(e)) from e
        self._program = program
        self._online = frozenset(online_cpus())
        program.start_run_stats(*self._stats_args)
        self._make_reductions(program)
        self._switch_held_off_ns = self._switch_sampled.held_off_ns() if self._switch_sampled else 0
        self._prev = self._read_totals()
        self._cpu_prev = (self._prev, self._switch_held_off_ns)
        self._per_cpu.due()  # the first round's per-CPU series are over the time since now
        self._prev_walk, self._walk_t = _timed_walk(self._tasks)
        self._threads = self._refresh_processes(self._prev_walk, b"", [], self._walk_t)

    def _make_reductions(self, program: BpfProgram) -> None:
        self._switch_sampled = SampledFunctions(
            program,
            ["bpfdyno_switch"],
            SWITCH_SAMPLE_SHARE,
            name="sched.switch_sampled",
            part=self.name,
            what=(
                f"the context-switch program attached {SWITCH_SAMPLE_SHARE:.1%} of the time "
                "(sampled in time)"
            ),
            lost=(
                "per-CPU context switches and busy time, run-queue waits and their latency "
                'quantiles are estimates scaled from the sampled time (estimate="sampled"); '
                "per-process times stay exact (the kernel's own books)"
            ),
        )
        self._exits_detached = DetachedFunctions(
            program,
            ["bpfdyno_exit", "bpfdyno_exec"],
            name="sched.exits_detached",
            part=self.name,
            what="the exec and exit programs detached",
            lost=(
                "exec/exit events and their rates are missing; a thread that exits keeps the "
                "books the previous round read (its process's times are a little short)"
            ),
        )
        self._migrations_detached = DetachedFunctions(
            program,
            ["bpfdyno_migrate"],
            name="sched.migrations_detached",
            part=self.name,
            what="the migration program detached",
            lost="the host-wide migration rate is missing (per-process migrations stay exact)",
        )

    def reductions(self) -> Sequence[Reduction]:
        """The budget's steps: sample the switch program, detach exec/exit, migrations."""
        return [
            r
            for r in (self._switch_sampled, self._exits_detached, self._migrations_detached)
            if r is not None
        ]

    def health(self) -> tuple[PartState, str] | None:
        """Degraded while the budget holds one of this collector's steps."""
        return degraded_by(self.reductions())

    def close(self) -> None:
        """Stop the run statistics and detach and unload every program (idempotent)."""
        if self._program is not None:
            if self._exit_ring is not None:
                self._exit_ring.close()
                self._exit_ring = None
            self._program.close()
            self._program = None
            self._tasks = None
            self._events = None
        with self._snapshot_lock:
            self._procs = {}

    # --- collection ----------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """Read the books and counters, compute the interval's rates, emit events."""
        with self._walk_lock:
            return self._collect()

    def _collect(self) -> Sequence[Sample]:
        program = self._require()
        assert self._tasks is not None and self._events is not None
        exits_off = self._exit_gap or bool(self._exits_detached and self._exits_detached.active)
        # Order matters: the walk first, then the exits (see the module docstring); the
        # events before the exits, so an exit event's process has all its threads' books.
        why = self._walk_due()
        # A walk made this round only because someone reads is the readers' work.
        readers = self._readers() if why == _FOR_READERS and self._readers is not None else ()
        with REQUESTED.work(readers, bounded=False):
            walk, walk_t = _timed_walk(self._tasks) if why else (None, 0.0)
        events = self._events.drain()
        self.process_events += len(events)
        exited = self._drain_exits()
        now = time.monotonic()
        self._exits_fill.saw(len(exited) // TASK_RECORD.size, now)
        self._events_fill.saw(len(events), now)
        totals = self._read_totals()
        held_off = self._switch_sampled.held_off_ns() if self._switch_sampled else 0
        prev_procs, prev_walk_t = self._procs, self._walk_t
        if walk is not None:
            if exits_off:  # threads that vanished without an exit record keep their last books
                exited = exited + _vanished(self._prev_walk, walk, exited)
            with REQUESTED.work(readers, bounded=False):
                self._threads = self._refresh_processes(walk, exited, events, walk_t)
            self._prev_walk, self._walk_t = walk, walk_t
            self._exit_gap = bool(self._exits_detached and self._exits_detached.active)
        else:
            self._record_exits(exited, events)
            self._exit_gap = exits_off
        threads = self._threads
        prev, self._prev = self._prev, totals
        out: list[Sample] = []
        if prev is not None and totals.t > prev.t:
            share = sampled_share(held_off - self._switch_held_off_ns, totals.t - prev.t)
            self._add_switch_extra(prev, totals, share)
            out += _interval_samples(prev, totals, events, share, exits_off)
            if self._per_cpu.due() and self._cpu_prev is not None:
                (since, since_held), self._cpu_prev = self._cpu_prev, (totals, held_off)
                if totals.t > since.t:
                    cpu_share = sampled_share(held_off - since_held, totals.t - since.t)
                    out += _per_cpu_samples(since, totals, self._online, cpu_share)
            if walk is not None and walk_t > prev_walk_t:
                out.append(_blocked_sample(prev_procs, self._procs, walk_t - prev_walk_t))
        self._switch_held_off_ns = held_off
        out += self._drop_samples()
        out.append(sample(TRACKED_THREADS, threads))
        out += program.run_stats_samples()
        if events and self._sink is not None:
            try:
                self._sink(events)
            except Exception:  # the sink's failure must not cost this interval's metrics
                log.exception("the kernel event sink failed; %d events lost", len(events))
        return out

    def longest_interval_s(self) -> float:
        """The longest interval over which the exited threads' and the events' ring buffers
        stay at most half full at the rate of the last round (the exits' one is sized for
        the slow cadence: ``[sched] max_exits``)."""
        return min(self._exits_fill.longest_interval_s(), self._events_fill.longest_interval_s())

    def per_process(self) -> ReadAt[ProcSched] | None:
        """tgid -> cumulative scheduler times, as of the last walk (thread-safe); its
        ``read_at`` is when that walk read them.

        None while the programs are not loaded, so the process table shows "unknown"
        rather than zeros.
        """
        if self._program is None:
            return None
        with self._snapshot_lock:
            return ReadAt(self._procs, self._procs_at)

    def fresh_per_process(self, max_age_s: float | None = None) -> ReadAt[ProcSched] | None:
        """`per_process`, walking the threads first when the last walk is older than
        ``max_age_s`` (default: half a round).

        For a reader: while nobody reads, the threads are walked only every ``idle_walk_s``,
        and a reader must not be answered from that. A walk is never repeated within half a
        round, however many readers ask.
        """
        age = self._round_s / 2 if max_age_s is None else max_age_s
        with self._walk_lock:
            if self._program is None:
                return None
            if time.monotonic() - self._walk_t > age:
                self._walk_between_rounds()
        return self.per_process()

    def _walk_between_rounds(self) -> None:
        """A walk and the exited threads' books that go with it, outside a round (under
        the walk lock). The events stay in their ring buffer for the next round."""
        self._require()
        assert self._tasks is not None
        exits_off = self._exit_gap or bool(self._exits_detached and self._exits_detached.active)
        walk, walk_t = _timed_walk(self._tasks)
        exited = self._drain_exits()
        if exits_off:
            exited = exited + _vanished(self._prev_walk, walk, exited)
        self._threads = self._refresh_processes(walk, exited, (), walk_t)
        self._prev_walk, self._walk_t = walk, walk_t
        self._exit_gap = bool(self._exits_detached and self._exits_detached.active)
        self._walked_between = True

    def runq_histogram(self) -> tuple[int, ...]:
        """Cumulative run-queue latency counts per log2 slot (ns), as of the last collect."""
        return self._prev.hist if self._prev is not None else ()

    def histograms(self) -> Sequence[HistogramSample]:
        """The cumulative run-queue latency histogram as of the last collect (seconds)."""
        totals = self._prev
        if totals is None:
            return ()
        bounds, counts = log2_export_buckets(totals.hist, 1e-9, EXPORT_LAST_SLOT)
        return (HistogramSample(RUNQ_HISTOGRAM, bounds, counts, totals.runq_sum_ns / 1e9),)

    def cpu_switch_counts(self) -> dict[int, int] | None:
        """Online CPU -> context switches on it since the programs were loaded, now.

        None while the programs are not loaded. Lets another collector report per-CPU
        switches without a perf counter of its own firing on every switch.
        """
        if self._program is None:
            return None
        words, per_cpu = percpu_flat(self._program.table(_CPU_STATS))
        extra = self._switch_extra
        return {
            cpu: int(n + extra.get(cpu, 0.0))
            for cpu, n in enumerate(words[_SWITCHES::per_cpu])
            if cpu in self._online
        }

    def switch_estimate(self) -> str:
        """``"sampled"`` while `cpu_switch_counts` includes switches scaled up from sampled
        time (the budget samples the switch program), else ""."""
        return SAMPLED if self._switch_extra else ""

    def _add_switch_extra(self, prev: _Totals, cur: _Totals, share: float) -> None:
        """Count the switches the sampled interval did not see (`cpu_switch_counts`)."""
        if share >= 1.0:
            return
        extra = dict(self._switch_extra)
        for cpu, (s0, s1) in enumerate(zip(prev.switches, cur.switches, strict=True)):
            seen = max(s1 - s0, 0)
            extra[cpu] = extra.get(cpu, 0.0) + (seen / share - seen if share > 0 else 0.0)
        self._switch_extra = extra

    # --- internals -----------------------------------------------------------------------

    def _require(self) -> BpfProgram:
        if self._program is None:
            raise RuntimeError("the sched collector is not started (or was closed)")
        return self._program

    def _drain_exits(self) -> bytes:
        """The last books of every thread whose exit was recorded since the last drain
        (`TASK_RECORD`s back to back, oldest first)."""
        self._require()
        assert self._exit_ring is not None
        return b"".join(self._exit_ring.drain())

    def _decode_event(self, raw: Any) -> KernelEvent:
        comm = shown_c_string(bytes(raw.comm))
        attrs: dict[str, int | float | str] = {"ppid": int(raw.ppid)}
        if raw.kind == SCHED_EV_EXEC:
            kind = "exec"
            attrs["filename"] = shown_c_string(bytes(raw.filename))
            attrs["old_tid"] = int(raw.old_tid)
        else:
            kind = "exit"
            code = int(raw.exit_code)
            attrs["exit_status"] = (code >> 8) & 0xFF
            attrs["signal"] = code & 0x7F
        return KernelEvent(
            self._clock.to_wall_ns(int(raw.ts_ns)), kind, int(raw.pid), int(raw.tid), comm, attrs
        )

    def _walk_due(self) -> str:
        """Why walk this round: every round while someone reads the per-process times
        (`_FOR_READERS`), else now and then (`_IDLE`); not again within half a round of a
        walk a reader had made since the last round ("": no walk)."""
        since = time.monotonic() - self._walk_t
        between, self._walked_between = self._walked_between, False
        if between and since < self._round_s / 2:
            return ""
        if since >= self._idle_walk_s:
            return _IDLE
        if self._walk_demand is None:
            return _IDLE  # no readers' signal: every round is the collector's own
        return _FOR_READERS if self._walk_demand() else ""

    def _read_totals(self) -> _Totals:
        words, per_cpu = percpu_flat(self._require().table(_CPU_STATS))
        return totals_from_words(words, per_cpu, time.monotonic())

    def _drop_samples(self) -> list[Sample]:
        per_cpu = percpu_words(self._require().table(_ERRORS))
        return [
            sample(DROPPED, sum(w[slot] for w in per_cpu), {"reason": reason})
            for slot, reason in _DROP_REASONS
        ]

    def _refresh_processes(
        self,
        walk: bytes,
        exited: bytes,
        events: Iterable[KernelEvent],
        walk_t: float,
    ) -> int:
        """Sum the walk's live threads and the exited threads' books into processes.

        ``exited`` was drained after the walk: a thread in both exited after the walk saw
        it, and its last books replace what the walk read. So do the books of a thread
        whose exit an earlier drain recorded but that the walk still found (between its
        exit record and its removal from the task list).
        """
        drained = _thread_keys(exited)
        known = self._recorded.before_walk(drained)
        live: dict[int, list[int]] = {}
        comms: dict[int, bytes] = {}
        threads = 0
        for rec in TASK_RECORD.iter_unpack(walk):
            tid, tgid, oncpu, wait, blocked, switches, migrations, start, comm = rec
            if known and (start << _TID_BITS | tid) in known:  # its last books are drained
                self._recorded.still_walked(start << _TID_BITS | tid)
                continue
            threads += 1
            acc = live.get(tgid)
            if acc is None:
                live[tgid] = [oncpu, wait, blocked, switches, migrations, 1]
                comms[tgid] = comm
            else:
                acc[0] += oncpu
                acc[1] += wait
                acc[2] += blocked
                acc[3] += switches
                acc[4] += migrations
                acc[5] += 1
        self._recorded.after_walk(drained)
        self._add_exited(exited)
        for rec in TASK_RECORD.iter_unpack(exited):
            comms.setdefault(rec[1], rec[-1])
        procs: dict[int, ProcSched] = {}
        for tgid, acc in live.items():
            dead = self._exited.get(tgid)
            if dead is not None:
                acc = [a + d for a, d in zip(acc, dead, strict=False)] + [acc[5]]
            procs[tgid] = ProcSched(
                tgid,
                self._comm(comms[tgid]),
                acc[0],
                acc[1],
                acc[2],
                acc[1],
                acc[3],
                acc[4],
                acc[5],
            )
        # A process without live threads is gone: its exited threads' books are kept one more
        # collection, for an exit event that arrives after them.
        departed = {t: self._exited.pop(t) for t in [t for t in self._exited if t not in live]}
        _exit_totals(events, departed, self._departed)
        self._departed = departed
        with self._snapshot_lock:
            self._procs, self._procs_at = procs, walk_t
        return threads

    def _record_exits(self, exited: bytes, events: Iterable[KernelEvent]) -> None:
        """A round without a walk: keep the exited threads' books for the next walk, and give
        exit events their process's totals (all its threads' last books are in by then)."""
        self._recorded.between_walks(_thread_keys(exited))
        self._add_exited(exited)
        _exit_totals(events, self._exited, self._departed)

    def _add_exited(self, exited: bytes) -> None:
        """Add exited threads' last books (`TASK_RECORD`s back to back) to their processes."""
        for _, tgid, *times, _start, _comm in TASK_RECORD.iter_unpack(exited):
            acc = self._exited.setdefault(tgid, [0] * _N_TIMES)
            for i in range(_N_TIMES):
                acc[i] += times[i]

    def _comm(self, raw: bytes) -> str:
        comm = self._comms.get(raw)
        if comm is None:
            if len(self._comms) >= 4096:
                self._comms.clear()  # a bound against name churn (cheap to refill)
            comm = shown_c_string(raw)
            self._comms[raw] = comm
        return comm


def _per_cpu_samples(
    prev: _Totals, cur: _Totals, online: frozenset[int], share: float = 1.0
) -> list[Sample]:
    """Each online CPU's switch rate and busy share since ``prev`` (``share`` as in
    `_interval_samples`)."""
    seen = (cur.t - prev.t) * share
    est = SAMPLED if share < 1.0 else ""
    out: list[Sample] = []
    for cpu, (s0, s1, b0, b1) in enumerate(
        zip(prev.switches, cur.switches, prev.busy_ns, cur.busy_ns, strict=True)
    ):
        if cpu not in online:  # bcc returns a slot for every *possible* CPU
            continue
        labels = {"cpu": str(cpu)}
        switches = max(s1 - s0, 0) / seen if seen > 0 else math.nan
        busy = min(max(b1 - b0, 0) / 1e9 / seen, 1.0) if seen > 0 else math.nan
        out.append(sample(SWITCHES, switches, labels, est))
        out.append(sample(CPU_BUSY, busy, labels, est))
    return out


def totals_from_words(words: Sequence[int], per_cpu: int, t: float) -> _Totals:
    """The host-wide counters at ``t`` from every CPU's `struct sched_cpu`, back to back.

    Each field of every CPU is one strided slice (`bpfdyno.ebpf.maps.percpu_flat`): no
    object per CPU, so this stays cheap on a node with hundreds of CPUs.
    """
    return _Totals(
        t=t,
        switches=tuple(words[_SWITCHES::per_cpu]),
        busy_ns=tuple(words[_BUSY::per_cpu]),
        migrations=sum(words[_MIGRATIONS::per_cpu]),
        runq_count=sum(words[_RUNQ_COUNT::per_cpu]),
        runq_sum_ns=sum(words[_RUNQ_SUM::per_cpu]),
        hist=tuple(sum(words[_HIST + k :: per_cpu]) for k in range(SCHED_HIST_SLOTS)),
    )


def _interval_samples(
    prev: _Totals,
    cur: _Totals,
    events: Sequence[KernelEvent],
    share: float = 1.0,
    exits_off: bool = False,
) -> list[Sample]:
    """The interval's host-wide rates; ``share`` of it the switch program was attached
    (counts made in that time are scaled up and labelled estimates), ``exits_off``: the
    exec/exit programs were detached some of it (their rates are not known)."""
    dt = cur.t - prev.t
    est = SAMPLED if share < 1.0 else ""

    def per_seen_s(delta: float) -> float:
        # Per second of the time the switch program saw (none seen: not known).
        return delta / (dt * share) if share > 0 else math.nan

    out: list[Sample] = []
    out.append(sample(MIGRATIONS, max(cur.migrations - prev.migrations, 0) / dt))
    waits = cur.runq_count - prev.runq_count
    out.append(sample(RUNQ_WAITS, per_seen_s(max(waits, 0)), None, est))
    delta = [max(b - a, 0) for a, b in zip(prev.hist, cur.hist, strict=True)]
    for q in QUANTILES:
        quantile = histogram_quantile(delta, q) / 1e9
        out.append(sample(RUNQ_LATENCY, quantile, {"quantile": str(q)}, est))
    wait_ns = cur.runq_sum_ns - prev.runq_sum_ns
    out.append(sample(RUNQ_MEAN, wait_ns / waits / 1e9 if waits > 0 else math.nan, None, est))
    busy = max(sum(cur.busy_ns) - sum(prev.busy_ns), 0)
    out.append(sample(ONCPU, per_seen_s(busy / 1e9), None, est))
    out.append(sample(OFFCPU, per_seen_s(max(wait_ns, 0) / 1e9), {"state": "runnable"}, est))
    for spec, kind in ((EXECS, "exec"), (EXITS, "exit")):
        rate = math.nan if exits_off else sum(1 for e in events if e.kind == kind) / dt
        out.append(sample(spec, rate))
    return out


def _exit_totals(events: Iterable[KernelEvent], *books: dict[int, list[int]]) -> None:
    """Give each exit event its process's totals: every thread's last books, from the first
    of ``books`` (tgid -> summed books of its exited threads) that has them."""
    for ev in events:
        if ev.kind != "exit":
            continue
        dead = next((b[ev.pid] for b in books if ev.pid in b), None)
        if dead is not None:
            ev.attrs["oncpu_ns"] = dead[0]
            ev.attrs["offcpu_ns"] = dead[1] + dead[2]


def _vanished(prev_walk: bytes, walk: bytes, exited: bytes) -> bytes:
    """Threads of the previous walk missing from this one without an exit record, with the
    books that walk read (while the exit program was detached, that is all there is)."""
    now = {rec[0] for rec in TASK_RECORD.iter_unpack(walk)}
    recorded = {rec[0] for rec in TASK_RECORD.iter_unpack(exited)}
    return b"".join(
        TASK_RECORD.pack(*rec)
        for rec in TASK_RECORD.iter_unpack(prev_walk)
        if rec[0] not in now and rec[0] not in recorded
    )


#: Bits of a tid (the kernel's PID_MAX_LIMIT is 2**22): a thread's key is its start time
#: above them (`_thread_keys`).
_TID_BITS = 22


def _thread_keys(records: bytes) -> set[int]:
    """Which threads ``records`` (`TASK_RECORD`s back to back) are: start time and tid in
    one int each (a set of ints takes a third of the memory of a set of pairs)."""
    return {rec[_START] << _TID_BITS | rec[0] for rec in TASK_RECORD.iter_unpack(records)}


class _Recorded:
    """Threads whose last books were drained and that a walk may still find (`_thread_keys`).

    A thread's exit record is written a little before the kernel takes it off the task list
    (exit_notify()), and the exit program leaves no mark on it, so a walk in between finds
    it with books that are already counted. A record is kept from its drain until the first
    walk after it that does not find its thread: once off the task list, a thread never
    comes back (its tid may, with another start time).
    """

    __slots__ = ("_between", "_found", "_kept")

    def __init__(self) -> None:
        self._kept: set[int] = set()  # drained before the last walk
        self._between: set[int] = set()  # drained in rounds without a walk
        self._found: set[int] = set()  # of those, what the current walk found

    def before_walk(self, drained: set[int]) -> set[int]:
        """What a walk followed by the drain ``drained`` must not count live."""
        if self._between:
            self._kept |= self._between
            self._between = set()
        self._found = set()
        if not self._kept:
            return drained
        return self._kept | drained if drained else self._kept

    def still_walked(self, key: int) -> None:
        """The walk found a recorded thread."""
        self._found.add(key)

    def after_walk(self, drained: set[int]) -> None:
        """Keep what the walk still found, and the records drained after it."""
        self._kept = (self._kept & self._found) | drained
        self._found = set()

    def between_walks(self, drained: set[int]) -> None:
        """Records drained in a round without a walk: the next walk may find them."""
        self._between |= drained

    def __len__(self) -> int:
        return len(self._kept) + len(self._between)


def exit_ring_pages(max_exits: int) -> int:
    """Pages of the exited threads' ring buffer that hold ``max_exits`` records (a power of
    two, as the kernel requires)."""
    pages = -(-max_exits * _EXIT_RECORD // _PAGE)
    return 1 << max(pages - 1, 0).bit_length()


#: Why a round walks the threads (`SchedCollector._walk_due`).
_IDLE, _FOR_READERS = "idle", "readers"
#: A ring buffer's page, and what one event takes in it (the record and its 8-byte header).
_PAGE = 4096
_RING_RECORD = 176 + 8
#: What one exited thread's books take in their ring buffer (`TASK_RECORD` and its header).
_EXIT_RECORD = TASK_RECORD.size + 8


def _timed_walk(tasks: TaskIterator) -> tuple[bytes, float]:
    """Every thread's books, and when they were read: the middle of the read (each thread's
    books are taken as of the moment the iterator visits it, within the read)."""
    t0 = time.monotonic()
    walk = tasks.read()
    return walk, (t0 + time.monotonic()) / 2


def _bump_generation(program: BpfProgram) -> None:
    """Tell the switch program it was off (`bpfdyno_sgen`, see bpf/sched.bpf.c)."""
    table = program.table(_GEN)
    key = table.Key(0)
    table[key] = table.Leaf(int(table[key].value) + 1)


def _blocked_sample(prev: dict[int, ProcSched], cur: dict[int, ProcSched], dt: float) -> Sample:
    """Blocked thread-seconds per second of the processes alive at both readings."""
    blocked = 0
    for tgid, p in cur.items():
        before = prev.get(tgid)
        if before is not None and p.offcpu_blocked_ns > before.offcpu_blocked_ns:
            blocked += p.offcpu_blocked_ns - before.offcpu_blocked_ns
    return sample(OFFCPU, blocked / 1e9 / dt, {"state": "blocked"})
