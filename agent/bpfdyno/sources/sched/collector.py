"""Scheduler telemetry from BPF (``bpf/sched.bpf.c``).

The kernel program keeps cumulative counters: per CPU (switches, migrations, on-/off-CPU
time, run-queue waits), a log2 histogram of run-queue latency, and per thread its on-CPU,
off-CPU (runnable / blocked) and run-queue time (see ``bpf/sched.h`` for the exact
definitions). Every ``collect`` reads them, turns the deltas into per-second rates and
interval quantiles, sums the threads into processes for the process table (`per_process`),
and drains the ring buffer of exec/exit events into ``sink`` as `KernelEvent`s.

Nothing is ever read-then-cleared. Threads are evicted from the maps by the exit probe; a
periodic sweep removes entries of threads whose exit was missed (e.g. while the map was
full). Map-full and ring-buffer-full failures are counted in the kernel and exported.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bpfdyno.core.config import SchedSection
from bpfdyno.core.events import KernelEvent, MonotonicClock
from bpfdyno.core.histogram import LOG2_SLOTS, histogram_quantile, log2_export_buckets
from bpfdyno.core.metrics import HistogramSample, Sample, sample
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.maps import map_items, percpu_values
from bpfdyno.ebpf.program import BpfProgram, RingBuffer
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

EventSink = Callable[[Sequence[KernelEvent]], None]

# Mirrors of the enums in bpf/sched.h (a test checks they match).
SCHED_HIST_SLOTS = LOG2_SLOTS
SCHED_EV_EXEC = 1
SCHED_EV_EXIT = 2
SCHED_ERR_THREAD_FULL = 0
SCHED_ERR_PROC_FULL = 1
SCHED_ERR_RINGBUF = 2

#: Raw tracepoint -> program, in attach order.
PROGRAMS = (
    ("sched_switch", "bpfdyno_switch"),
    ("sched_wakeup", "bpfdyno_wakeup"),
    ("sched_wakeup_new", "bpfdyno_wakenew"),
    ("sched_migrate_task", "bpfdyno_migrate"),
    ("sched_process_exec", "bpfdyno_exec"),
    ("sched_process_exit", "bpfdyno_exit"),
)
QUANTILES = (0.5, 0.9, 0.99)
#: The last log2 slot exported as its own histogram bucket: 2**36 ns, 68.7 s.
EXPORT_LAST_SLOT = 35

# The program's maps (bpf/sched.bpf.c).
_CPU_STATS = "bpfdyno_scpu"
_RUNQ_HIST = "bpfdyno_shist"
_ERRORS = "bpfdyno_serrors"
_THREADS = "bpfdyno_sthread"
_PROCS = "bpfdyno_sprocs"
_EVENTS = "bpfdyno_sevents"


_DROP_REASONS = (
    (SCHED_ERR_THREAD_FULL, "thread_map_full"),
    (SCHED_ERR_PROC_FULL, "process_map_full"),
    (SCHED_ERR_RINGBUF, "ringbuf_full"),
)


@dataclass(frozen=True, slots=True)
class ProcSched:
    """Cumulative scheduler times of one process (all ns; see ``bpf/sched.h``)."""

    tgid: int
    comm: str
    oncpu_ns: int
    offcpu_runnable_ns: int
    offcpu_blocked_ns: int
    runq_wait_ns: int
    switches: int
    migrations: int
    threads: int


_TIME_FIELDS = (
    "oncpu_ns",
    "offcpu_runnable_ns",
    "offcpu_blocked_ns",
    "runq_wait_ns",
    "switches",
    "migrations",
)


@dataclass(frozen=True, slots=True)
class _Totals:
    """Cumulative host-wide counters at one instant."""

    t: float
    switches: tuple[int, ...]  # per CPU
    oncpu: tuple[int, ...]  # per CPU
    migrations: int
    runq_count: int
    runq_sum_ns: int
    offcpu_runnable_ns: int
    offcpu_blocked_ns: int
    hist: tuple[int, ...]


class SchedCollector(Collector):
    """Loads sched.bpf.c, reads its maps each interval, streams exec/exit to ``sink``.

    The defaults of the map and ring buffer sizes are the ``[sched]`` config section's.

    Args:
        sink: receives the decoded events of each collection (e.g. ``FlightRecorder.add``).
        max_threads: threads tracked at once (``[sched] max_threads``).
        max_procs: processes whose exited threads' times are kept until they exit
            (``[sched] max_procs``).
        ringbuf_pages: exec/exit ring buffer size in pages, a power of two
            (``[sched] ringbuf_pages``).
        stats_on_s: BPF run statistics are on for this long ...
        stats_period_s: ... once per this period (see `bpfdyno.ebpf.runstats.BpfRunStats`).
        sweep_interval_s: how often entries of vanished threads are removed.
        track_wakeups: attach the wakeup probes (``[sched] track_wakeups``). Off, run-queue
            latency only covers waits after preemption (not after wakeups) and each wakeup
            costs nothing; for hosts where the wakeup probe's cost matters (see
            docs/performance.md).
        header_cache: where `bpfdyno.ebpf.kheaders` caches generated headers.
        proc_root: procfs mount, for process names and the sweep.

    Raises:
        ValueError: a size the kernel would refuse.
    """

    name = "sched"

    def __init__(
        self,
        sink: EventSink | None = None,
        *,
        max_threads: int = SchedSection.max_threads,
        max_procs: int = SchedSection.max_procs,
        ringbuf_pages: int = SchedSection.ringbuf_pages,
        stats_on_s: float = DEFAULT_ON_S,
        stats_period_s: float = DEFAULT_PERIOD_S,
        sweep_interval_s: float = 30.0,
        track_wakeups: bool = SchedSection.track_wakeups,
        header_cache: Path | None = None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        if ringbuf_pages < 1 or ringbuf_pages & (ringbuf_pages - 1):
            raise ValueError(f"[sched] ringbuf_pages must be a power of two, got {ringbuf_pages}")
        if max_threads < 1 or max_procs < 1:
            raise ValueError(
                f"[sched] max_threads and max_procs must be at least 1, got {max_threads} "
                f"and {max_procs}"
            )
        self._sink = sink
        self._defines = {
            "SCHED_MAX_THREADS": max_threads,
            "SCHED_MAX_PROCS": max_procs,
            "SCHED_RINGBUF_PAGES": ringbuf_pages,
        }
        self._stats_args = (stats_on_s, stats_period_s)
        self._sweep_interval_s = sweep_interval_s
        self._programs = tuple(
            (tp, fn) for tp, fn in PROGRAMS if track_wakeups or not tp.startswith("sched_wakeup")
        )
        self._header_cache = header_cache
        self._proc = proc_root
        self._program: BpfProgram | None = None
        self._events: RingBuffer[KernelEvent] | None = None
        self._clock = MonotonicClock()
        self._prev: _Totals | None = None
        self._comms: dict[int, str] = {}
        self._procs: dict[int, ProcSched] = {}
        self._snapshot_lock = threading.Lock()
        self._last_sweep = 0.0
        self._online: frozenset[int] = frozenset()

    @classmethod
    def from_config(cls, section: SchedSection, *, sink: EventSink | None = None) -> SchedCollector:
        """Build the collector from the ``[sched]`` config section."""
        return cls(
            sink,
            max_threads=section.max_threads,
            max_procs=section.max_procs,
            ringbuf_pages=section.ringbuf_pages,
            track_wakeups=section.track_wakeups,
        )

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Compile and attach the programs (once), and take the baseline reading.

        Raises:
            CollectorUnavailable: no BPF, no BTF headers, not root, or a tracepoint missing.
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
            for tp, fn in self._programs:
                program.attach_raw_tracepoint(tp, fn)
            self._events = program.open_ring_buffer(_EVENTS, self._decode_event)
        except BpfLoadError as e:
            program.close()
            raise CollectorUnavailable(
                f"{e} (the scheduler programs need raw tracepoints, Linux >= 4.17)"
            ) from e
        self._program = program
        self._online = frozenset(online_cpus())
        program.start_run_stats(*self._stats_args)
        self._last_sweep = time.monotonic()
        self._prev = self._read_totals()

    def close(self) -> None:
        """Stop the run statistics and detach and unload every program (idempotent)."""
        if self._program is not None:
            self._program.close()
            self._program = None
            self._events = None
        with self._snapshot_lock:
            self._procs = {}

    # --- collection ----------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """Read the maps, compute the interval's rates, refresh `per_process`, emit events."""
        program = self._require()
        events = self._events.drain() if self._events is not None else []
        totals = self._read_totals()
        prev, self._prev = self._prev, totals
        out: list[Sample] = []
        if prev is not None and totals.t > prev.t:
            out += _interval_samples(prev, totals, events, self._online)
        out += self._drop_samples()
        thread_count = self._refresh_processes(events)
        out.append(sample(TRACKED_THREADS, thread_count))
        out += program.run_stats_samples()
        if events and self._sink is not None:
            try:
                self._sink(events)
            except Exception:  # the sink's failure must not cost this interval's metrics
                log.exception("the kernel event sink failed; %d events lost", len(events))
        if time.monotonic() - self._last_sweep >= self._sweep_interval_s:
            self.sweep()
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

    def sweep(self) -> int:
        """Remove map entries of threads and processes that no longer exist.

        Returns:
            How many entries were removed.
        """
        program = self._require()
        self._last_sweep = time.monotonic()
        removed = 0
        for table_name in (_THREADS, _PROCS):
            table = program.table(table_name)
            for key, _ in map_items(table):
                ident = int(key)
                if not (self._proc / str(ident)).exists():
                    try:
                        del table[table.Key(ident)]
                        removed += 1
                    except KeyError:
                        pass  # evicted by the kernel meanwhile
        return removed

    # --- internals -----------------------------------------------------------------------

    def _require(self) -> BpfProgram:
        if self._program is None:
            raise RuntimeError("the sched collector is not started (or was closed)")
        return self._program

    def _decode_event(self, raw: Any) -> KernelEvent:
        comm = bytes(raw.comm).split(b"\0", 1)[0].decode("utf-8", "replace")
        attrs: dict[str, int | float | str] = {"ppid": int(raw.ppid)}
        if raw.kind == SCHED_EV_EXEC:
            kind = "exec"
            attrs["filename"] = bytes(raw.filename).split(b"\0", 1)[0].decode("utf-8", "replace")
            attrs["old_tid"] = int(raw.old_tid)
        else:
            kind = "exit"
            code = int(raw.exit_code)
            attrs["exit_status"] = (code >> 8) & 0xFF
            attrs["signal"] = code & 0x7F
            attrs["oncpu_ns"] = int(raw.oncpu_ns)
            attrs["offcpu_ns"] = int(raw.offcpu_ns)
        return KernelEvent(
            self._clock.to_wall_ns(int(raw.ts_ns)), kind, int(raw.pid), int(raw.tid), comm, attrs
        )

    def _read_totals(self) -> _Totals:
        program = self._require()
        cpus = percpu_values(program.table(_CPU_STATS))
        hist_cpus = percpu_values(program.table(_RUNQ_HIST))
        hist = tuple(sum(int(h.slots[i]) for h in hist_cpus) for i in range(SCHED_HIST_SLOTS))
        return _Totals(
            t=time.monotonic(),
            switches=tuple(int(c.switches) for c in cpus),
            oncpu=tuple(int(c.oncpu_ns) for c in cpus),
            migrations=sum(int(c.migrations) for c in cpus),
            runq_count=sum(int(c.runq_count) for c in cpus),
            runq_sum_ns=sum(int(c.runq_sum_ns) for c in cpus),
            offcpu_runnable_ns=sum(int(c.offcpu_runnable_ns) for c in cpus),
            offcpu_blocked_ns=sum(int(c.offcpu_blocked_ns) for c in cpus),
            hist=hist,
        )

    def _drop_samples(self) -> list[Sample]:
        per_cpu = percpu_values(self._require().table(_ERRORS))
        return [
            sample(DROPPED, sum(int(e.count[slot]) for e in per_cpu), {"reason": reason})
            for slot, reason in _DROP_REASONS
        ]

    def _refresh_processes(self, events: Sequence[KernelEvent]) -> int:
        program = self._require()
        for ev in events:
            if ev.kind == "exec":
                self._comms[ev.pid] = ev.comm
            elif ev.kind == "exit":
                self._comms.pop(ev.pid, None)
        sums: dict[int, list[int]] = {}
        threads = map_items(program.table(_THREADS))
        for _, th in threads:
            acc = sums.setdefault(int(th.tgid), [0] * (len(_TIME_FIELDS) + 1))
            t = th.t
            acc[0] += t.oncpu_ns
            acc[1] += t.offcpu_runnable_ns
            acc[2] += t.offcpu_blocked_ns
            acc[3] += t.runq_wait_ns
            acc[4] += t.switches
            acc[5] += t.migrations
            acc[6] += 1
        for key, t in map_items(program.table(_PROCS)):
            live = sums.get(int(key))
            if live is not None:  # exited threads of a live process
                for i, fieldname in enumerate(_TIME_FIELDS):
                    live[i] += int(getattr(t, fieldname))
        procs = {
            tgid: ProcSched(tgid, self._comm(tgid), *acc) for tgid, acc in sums.items() if tgid
        }
        for gone in self._comms.keys() - procs.keys():
            del self._comms[gone]
        with self._snapshot_lock:
            self._procs = procs
        return len(threads)

    def _comm(self, tgid: int) -> str:
        comm = self._comms.get(tgid)
        if comm is None:
            try:
                comm = (self._proc / str(tgid) / "comm").read_text().rstrip("\n")
            except OSError:
                comm = ""
            self._comms[tgid] = comm
        return comm


def _interval_samples(
    prev: _Totals, cur: _Totals, events: Sequence[KernelEvent], online: frozenset[int]
) -> list[Sample]:
    dt = cur.t - prev.t
    out: list[Sample] = []
    for cpu, (s0, s1, o0, o1) in enumerate(
        zip(prev.switches, cur.switches, prev.oncpu, cur.oncpu, strict=True)
    ):
        if cpu not in online:  # bcc returns a slot for every *possible* CPU
            continue
        labels = {"cpu": str(cpu)}
        out.append(sample(SWITCHES, max(s1 - s0, 0) / dt, labels))
        out.append(sample(CPU_BUSY, min(max(o1 - o0, 0) / 1e9 / dt, 1.0), labels))
    out.append(sample(MIGRATIONS, max(cur.migrations - prev.migrations, 0) / dt))
    waits = cur.runq_count - prev.runq_count
    out.append(sample(RUNQ_WAITS, max(waits, 0) / dt))
    delta = [max(b - a, 0) for a, b in zip(prev.hist, cur.hist, strict=True)]
    for q in QUANTILES:
        out.append(sample(RUNQ_LATENCY, histogram_quantile(delta, q) / 1e9, {"quantile": str(q)}))
    mean = (cur.runq_sum_ns - prev.runq_sum_ns) / waits / 1e9 if waits > 0 else math.nan
    out.append(sample(RUNQ_MEAN, mean))
    out.append(sample(ONCPU, max(sum(cur.oncpu) - sum(prev.oncpu), 0) / 1e9 / dt))
    for state, a, b in (
        ("runnable", prev.offcpu_runnable_ns, cur.offcpu_runnable_ns),
        ("blocked", prev.offcpu_blocked_ns, cur.offcpu_blocked_ns),
    ):
        out.append(sample(OFFCPU, max(b - a, 0) / 1e9 / dt, {"state": state}))
    out.append(sample(EXECS, sum(1 for e in events if e.kind == "exec") / dt))
    out.append(sample(EXITS, sum(1 for e in events if e.kind == "exit") / dt))
    return out
