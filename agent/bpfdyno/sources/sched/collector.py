"""Scheduler telemetry from BPF (``bpf/sched.bpf.c``) and the kernel's own per-thread books.

The hot path is one small program on ``sched_switch`` that keeps, per CPU, the context
switches, the time non-idle tasks ran, and the run-queue latency histogram (from the
kernel's ``sched_info.last_queued``; no per-thread state, no clock read). Per-process times
come from the kernel's books of every thread (on-CPU, run-queue wait, context switches,
migrations; blocked is the rest of each thread's life), read once per collection with a BPF
task iterator, plus the last books of threads that exited since the previous collection,
which the exit program keeps in a map that each collection drains. See ``bpf/sched.h``.

Every ``collect`` turns the per-CPU counters into per-second rates and interval quantiles,
sums threads into processes for the process table (`per_process`), and hands the exec/exit
events to ``sink`` as `KernelEvent`s.

Why the process totals are exact and never go down: a thread's books only grow; a thread is
counted live by the iterator until its exit is recorded; its last books then replace its
live ones, in the same collection when it exited after the iterator saw it (drained after
the walk), otherwise in the next one. Nothing is read-then-cleared.
"""

from __future__ import annotations

import logging
import math
import struct
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bpfdyno.core.config import SchedSection
from bpfdyno.core.events import EventSink, KernelEvent, MonotonicClock
from bpfdyno.core.histogram import histogram_quantile, log2_export_buckets
from bpfdyno.core.metrics import HistogramSample, Sample, sample
from bpfdyno.core.text import shown_c_string
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.headers import header_defines, header_enum, header_text
from bpfdyno.ebpf.maps import map_pop_all, percpu_words
from bpfdyno.ebpf.program import BpfProgram, RingBuffer, TaskIterator
from bpfdyno.ebpf.runstats import DEFAULT_ON_S, DEFAULT_PERIOD_S
from bpfdyno.sources.base import Collector, CollectorUnavailable
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
#: struct sched_task: tid, tgid, oncpu, runq wait, blocked, switches, migrations, comm.
TASK_RECORD = struct.Struct("<IIQQQQQ16s")
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

# The program's maps (bpf/sched.bpf.c).
_CPU_STATS = "bpfdyno_scpu"
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
    ) -> None:
        if ringbuf_pages < 1 or ringbuf_pages & (ringbuf_pages - 1):
            raise ValueError(f"[sched] ringbuf_pages must be a power of two, got {ringbuf_pages}")
        if max_exits < 1:
            raise ValueError(f"[sched] max_exits must be at least 1, got {max_exits}")
        self._sink = sink
        self._defines = {"SCHED_MAX_EXITS": max_exits, "SCHED_RINGBUF_PAGES": ringbuf_pages}
        self._stats_args = (stats_on_s, stats_period_s)
        self._header_cache = header_cache
        self._program: BpfProgram | None = None
        self._tasks: TaskIterator | None = None
        self._events: RingBuffer[KernelEvent] | None = None
        self._clock = MonotonicClock()
        self._prev: _Totals | None = None
        #: tgid -> last books of its exited threads, until the process is gone.
        self._exited: dict[int, list[int]] = {}
        self._departed: dict[int, list[int]] = {}
        self._procs: dict[int, ProcSched] = {}
        self._comms: dict[bytes, str] = {}
        self._snapshot_lock = threading.Lock()
        self._online: frozenset[int] = frozenset()

    @classmethod
    def from_config(cls, section: SchedSection, *, sink: EventSink | None = None) -> SchedCollector:
        """Build the collector from the ``[sched]`` config section."""
        return cls(sink, max_exits=section.max_exits, ringbuf_pages=section.ringbuf_pages)

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
                program.attach_btf_tracepoint(tp, fn)
            self._tasks = program.open_task_iterator(ITERATOR)
            self._events = program.open_ring_buffer(_EVENTS, self._decode_event)
        except BpfLoadError as e:
            program.close()
            raise CollectorUnavailable(str(e)) from e
        self._program = program
        self._online = frozenset(online_cpus())
        program.start_run_stats(*self._stats_args)
        self._prev = self._read_totals()
        self._refresh_processes(self._tasks.read(), [], [])

    def close(self) -> None:
        """Stop the run statistics and detach and unload every program (idempotent)."""
        if self._program is not None:
            self._program.close()
            self._program = None
            self._tasks = None
            self._events = None
        with self._snapshot_lock:
            self._procs = {}

    # --- collection ----------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """Read the books and counters, compute the interval's rates, emit events."""
        program = self._require()
        assert self._tasks is not None and self._events is not None
        # Order matters: the walk first, then the exits (see the module docstring); the
        # events before the exits, so an exit event's process has all its threads' books.
        walk = self._tasks.read()
        events = self._events.drain()
        exited = map_pop_all(program.table(_EXITED))
        totals = self._read_totals()
        prev_procs = self._procs
        threads = self._refresh_processes(walk, exited, events)
        prev, self._prev = self._prev, totals
        out: list[Sample] = []
        if prev is not None and totals.t > prev.t:
            out += _interval_samples(prev, totals, events, self._online)
            out.append(_blocked_sample(prev_procs, self._procs, totals.t - prev.t))
        out += self._drop_samples()
        out.append(sample(TRACKED_THREADS, threads))
        out += program.run_stats_samples()
        if events and self._sink is not None:
            try:
                self._sink(events)
            except Exception:  # the sink's failure must not cost this interval's metrics
                log.exception("the kernel event sink failed; %d events lost", len(events))
        return out

    def per_process(self) -> dict[int, ProcSched] | None:
        """tgid -> cumulative scheduler times, as of the last ``collect`` (thread-safe).

        None while the programs are not loaded, so the process table shows "unknown"
        rather than zeros.
        """
        if self._program is None:
            return None
        with self._snapshot_lock:
            return dict(self._procs)

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
        words = percpu_words(self._program.table(_CPU_STATS))
        return {cpu: int(w[_SWITCHES]) for cpu, w in enumerate(words) if cpu in self._online}

    # --- internals -----------------------------------------------------------------------

    def _require(self) -> BpfProgram:
        if self._program is None:
            raise RuntimeError("the sched collector is not started (or was closed)")
        return self._program

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

    def _read_totals(self) -> _Totals:
        cpus = percpu_words(self._require().table(_CPU_STATS))
        hist = tuple(sum(slot) for slot in zip(*(w[_HIST:CPU_WORDS] for w in cpus), strict=True))
        return _Totals(
            t=time.monotonic(),
            switches=tuple(w[_SWITCHES] for w in cpus),
            busy_ns=tuple(w[_BUSY] for w in cpus),
            migrations=sum(w[_MIGRATIONS] for w in cpus),
            runq_count=sum(w[_RUNQ_COUNT] for w in cpus),
            runq_sum_ns=sum(w[_RUNQ_SUM] for w in cpus),
            hist=hist,
        )

    def _drop_samples(self) -> list[Sample]:
        per_cpu = percpu_words(self._require().table(_ERRORS))
        return [
            sample(DROPPED, sum(w[slot] for w in per_cpu), {"reason": reason})
            for slot, reason in _DROP_REASONS
        ]

    def _refresh_processes(
        self, walk: bytes, exited: list[tuple[Any, Any]], events: Iterable[KernelEvent]
    ) -> int:
        """Sum the walk's live threads and the exited threads' books into processes."""
        gone = [TASK_RECORD.unpack(bytes(rec)) for _, rec in exited]
        replaced = {r[0] for r in gone}
        live: dict[int, list[int]] = {}
        comms: dict[int, bytes] = {}
        threads = 0
        for tid, tgid, oncpu, wait, blocked, switches, migrations, comm in TASK_RECORD.iter_unpack(
            walk
        ):
            if replaced and tid in replaced:  # exited after the walk saw it: its last books
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
        for _, tgid, *times, comm in gone:
            acc = self._exited.setdefault(tgid, [0] * _N_TIMES)
            for i in range(_N_TIMES):
                acc[i] += times[i]
            comms.setdefault(tgid, comm)
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
        for ev in events:
            if ev.kind == "exit":
                dead = departed.get(ev.pid) or self._departed.get(ev.pid)
                if dead is not None:  # the process's totals, every thread's last books
                    ev.attrs["oncpu_ns"] = dead[0]
                    ev.attrs["offcpu_ns"] = dead[1] + dead[2]
        self._departed = departed
        with self._snapshot_lock:
            self._procs = procs
        return threads

    def _comm(self, raw: bytes) -> str:
        comm = self._comms.get(raw)
        if comm is None:
            if len(self._comms) >= 4096:
                self._comms.clear()  # a bound against name churn (cheap to refill)
            comm = shown_c_string(raw)
            self._comms[raw] = comm
        return comm


def _interval_samples(
    prev: _Totals, cur: _Totals, events: Sequence[KernelEvent], online: frozenset[int]
) -> list[Sample]:
    dt = cur.t - prev.t
    out: list[Sample] = []
    for cpu, (s0, s1, b0, b1) in enumerate(
        zip(prev.switches, cur.switches, prev.busy_ns, cur.busy_ns, strict=True)
    ):
        if cpu not in online:  # bcc returns a slot for every *possible* CPU
            continue
        labels = {"cpu": str(cpu)}
        out.append(sample(SWITCHES, max(s1 - s0, 0) / dt, labels))
        out.append(sample(CPU_BUSY, min(max(b1 - b0, 0) / 1e9 / dt, 1.0), labels))
    out.append(sample(MIGRATIONS, max(cur.migrations - prev.migrations, 0) / dt))
    waits = cur.runq_count - prev.runq_count
    out.append(sample(RUNQ_WAITS, max(waits, 0) / dt))
    delta = [max(b - a, 0) for a, b in zip(prev.hist, cur.hist, strict=True)]
    for q in QUANTILES:
        out.append(sample(RUNQ_LATENCY, histogram_quantile(delta, q) / 1e9, {"quantile": str(q)}))
    wait_ns = cur.runq_sum_ns - prev.runq_sum_ns
    out.append(sample(RUNQ_MEAN, wait_ns / waits / 1e9 if waits > 0 else math.nan))
    out.append(sample(ONCPU, max(sum(cur.busy_ns) - sum(prev.busy_ns), 0) / 1e9 / dt))
    out.append(sample(OFFCPU, max(wait_ns, 0) / 1e9 / dt, {"state": "runnable"}))
    out.append(sample(EXECS, sum(1 for e in events if e.kind == "exec") / dt))
    out.append(sample(EXITS, sum(1 for e in events if e.kind == "exit") / dt))
    return out


def _blocked_sample(prev: dict[int, ProcSched], cur: dict[int, ProcSched], dt: float) -> Sample:
    """Blocked thread-seconds per second of the processes alive at both readings."""
    blocked = 0
    for tgid, p in cur.items():
        before = prev.get(tgid)
        if before is not None and p.offcpu_blocked_ns > before.offcpu_blocked_ns:
            blocked += p.offcpu_blocked_ns - before.offcpu_blocked_ns
    return sample(OFFCPU, blocked / 1e9 / dt, {"state": "blocked"})
