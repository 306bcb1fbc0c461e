"""`CaptureManager`: records the kernel tracks of each traced process, from request to file.

The tracker says when a config is stored for a process (`begin`) and when its file is
complete or its trace ended otherwise (`end`, `discard`). Between the two the manager
records, for that process only, what its request asked for:

* ``net`` and ``sched`` through `KernelCapture` (bpf/capture.bpf.c),
* ``nccl`` through `NcclCapture` (bpf/nccl.bpf.c on its libnccl),
* ``gpu`` through `GpuSampler` (the GPU collector's NVML reads),
* ``fabric`` through `FabricSampler` (RDMA ports and NICs from sysfs and ethtool, interrupt
  time from the interrupt collector).

All BPF work happens on one thread of its own ("trace-capture"): it loads both programs when
the manager starts (so the first trace does not wait for a compile), attaches them when the
first traced process needs them, drains their ring buffers every `DRAIN_INTERVAL_S` (sooner
while one fills: `FAST_DRAIN_INTERVAL_S`) while
anything is traced, and detaches them when the last traced process leaves. Callers on the
event loop never block: `discard` only queues a command, `begin` and `end` return futures.
The future of `begin` is done once the recording is in place (maps filled, probes attached:
attaching uprobes to a large libnccl takes tens of milliseconds, more with a cold page
cache or a capture thread busy detaching another trace's probes); the tracker hands the
process its config only then, so the trace's window never starts before its recording.

Bounded: each traced process keeps at most ``[capture] max_events_per_process`` records;
beyond it the oldest go first (the trace window is at the end of the capture, since the file
is written right after it), and how many were dropped is part of the result.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from bpfdyno.core.budget import RequestedPrograms, excluded_work
from bpfdyno.core.config import CaptureSection
from bpfdyno.core.events import MonotonicClock
from bpfdyno.core.pidfs import read_environ
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.tracing.capture.cpu_quota import CpuQuotaReader
from bpfdyno.tracing.capture.fabric import FabricSampler, InterruptTimeSource
from bpfdyno.tracing.capture.gpu import GpuCounterSource, GpuSampler
from bpfdyno.tracing.capture.kernel import KernelCapture
from bpfdyno.tracing.capture.memory_cgroup import MemoryCgroupReader
from bpfdyno.tracing.capture.nccl import NcclCapture
from bpfdyno.tracing.capture.records import (
    KernelRecord,
    KernelTrackRequest,
    PackedOffCpu,
    ProcessCapture,
    Track,
    TrackStats,
    unpacked,
)

log = logging.getLogger(__name__)

#: How often the ring buffers are consumed while something is traced...
DRAIN_INTERVAL_S = 0.1
#: ... and how often while one fills at a rate that would leave it `FAST_DRAIN_FILL` full
#: between two drains `DRAIN_INTERVAL_S` apart. The default ring (1 MiB) holds about 8,700
#: off-CPU records: a traced job switching threads 30,000 times a second fills a third of
#: it between two such drains. (Beyond ~165,000 records a second, two threads passing a
#: pipe, it is the decoding that cannot keep up, with a CPU to itself.)
FAST_DRAIN_INTERVAL_S = 0.01
FAST_DRAIN_FILL = 0.25
#: How often traced processes without a libnccl are looked at again.
NCCL_RESCAN_S = 1.0
#: The programs are compiled this long after start (or at the first trace, if sooner), so
#: the compile does not hold up the collectors' own at the daemon's start (one compile at a
#: time) and the daemon is ready as fast as without this feature.
PRELOAD_DELAY_S = 5.0


#: Environment variables of a distributed job (torchrun's), in distributedInfo's terms.
_DIST_ENV = (("RANK", "rank"), ("WORLD_SIZE", "world_size"), ("LOCAL_RANK", "local_rank"))


def distributed_info(pid: int, proc_root: Path = Path("/proc")) -> dict[str, int] | None:
    """``{"rank", "world_size"[, "local_rank"]}`` from the process's environment, or None.

    Kineto's on-demand traces carry no ``distributedInfo`` (the Python profiler adds it, the
    daemon path does not), and tools such as Holistic Trace Analysis need the rank to tell the
    files of a job apart; torchrun puts it in every rank's environment.
    """
    env = read_environ(proc_root, pid, [var for var, _ in _DIST_ENV])
    out: dict[str, int] = {}
    for var, key in _DIST_ENV:
        value = env.get(var, "")
        if value.isdigit():
            out[key] = int(value)
    return out if "rank" in out and "world_size" in out else None


@dataclass(frozen=True, slots=True)
class CaptureKey:
    """One traced process's part of one trace.

    ``pid`` is the process in the agent's pid namespace (from the kernel's credentials of
    its polls, never its word): what the programs, /proc and the GPU's process list know.
    ``ns_pid`` is the pid it knows itself by (in a container, its namespace's), shown beside
    it; 0 when the two are the same. ``requester`` is who asked for the trace, as the
    requested-work account names them (`bpfdyno.core.budget.reader`): what recording it
    costs is theirs; not part of the key's identity.
    """

    trace_id: str
    pid: int
    ns_pid: int = 0
    requester: str = field(default="", compare=False)

    def label(self) -> str:
        """ "pid 4242" or, for a process in a pid namespace of its own, "pid 4242 (1 in its
        namespace)"."""
        inner = f" ({self.ns_pid} in its namespace)" if self.ns_pid not in (0, self.pid) else ""
        return f"pid {self.pid}{inner}"


@dataclass(slots=True)
class _Active:
    key: CaptureKey
    request: KernelTrackRequest
    begin_ns: int
    begin_wall_ns: int
    offset_begin_ns: int
    records: deque[KernelRecord | PackedOffCpu]
    notes: dict[Track, str] = field(default_factory=dict)
    dropped: int = 0
    distributed: dict[str, int] | None = None
    counters_at_begin: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Begin:
    key: CaptureKey
    request: KernelTrackRequest
    future: Future[None]


@dataclass(frozen=True, slots=True)
class _End:
    key: CaptureKey
    future: Future[ProcessCapture] | None  # None: discard


_STOP = object()


class MapFull(NamedTuple):
    """What a host-wide "this BPF map was full" counter costs a trace recorded meanwhile."""

    track: Track
    what: str  # what did not fit, for `status`
    note: str  # for the trace ({n}: how many times while it was recorded)


MAP_FULL = {
    "CAP_C_THREAD_FULL": MapFull(
        Track.SCHED,
        "traced threads ([capture] max_threads)",
        "{n} thread(s) of traced processes could not be followed (more than [capture] "
        "max_threads at once): their off-CPU time is missing",
    ),
    "CAP_C_CHILD_FULL": MapFull(
        Track.SCHED,
        "child processes of traced processes ([capture] max_processes)",
        "{n} child process(es) of traced processes (DataLoader workers) could not be followed "
        "(more than [capture] max_processes at once): what they waited for is missing",
    ),
    "CAP_C_SOCK_FULL": MapFull(
        Track.NET,
        "sockets ([capture] max_sockets)",
        "{n} socket(s) could not be remembered (more than [capture] max_sockets): their "
        "retransmits and drops are missing",
    ),
    "CAP_C_BURST_FULL": MapFull(
        Track.NET,
        "open bursts ([capture] max_sockets)",
        "{n} socket call(s) were written one by one, not coalesced (more than [capture] "
        "max_sockets bursts open)",
    ),
    "NCCL_C_INFLIGHT_FULL": MapFull(
        Track.NCCL,
        "NCCL calls in progress ([capture] max_threads)",
        "{n} NCCL call(s) were missed (more than [capture] max_threads calls in progress)",
    ),
}


class CaptureManager:
    """Kernel, NCCL and GPU recording of traced processes.

    Args:
        settings: the ``[capture]`` section.
        gpu: the GPU collector's counters (None: no GPU track).
        interrupts: the interrupt collector's times (None: no interrupt time in the fabric
            track).
        header_cache: where generated kernel headers are cached.
        proc_root: where /proc is.
        sysfs_root: the directory holding ``sys/`` for the fabric track (a fixture tree in
            tests).
        preload_delay_s: compile the programs this long after `start`, or at the first
            trace if it comes sooner.
    """

    name = "capture"

    def __init__(
        self,
        settings: CaptureSection,
        gpu: GpuCounterSource | None = None,
        interrupts: InterruptTimeSource | None = None,
        header_cache: Path | None = None,
        proc_root: Path = Path("/proc"),
        sysfs_root: Path = Path("/"),
        preload_delay_s: float = 0.0,
    ) -> None:
        self.settings = settings
        self._preload_delay_s = preload_delay_s
        self.kernel = KernelCapture(settings, header_cache)
        self.nccl = NcclCapture(settings, header_cache, proc_root)
        self.gpu = GpuSampler(gpu, settings.gpu_sample_hz, settings.max_events_per_process)
        self.fabric = FabricSampler(
            interrupts,
            settings.fabric_sample_hz,
            settings.max_events_per_process,
            root=sysfs_root,
            proc_root=proc_root,
        )
        #: The traced processes' CPU-quota throttling (sched track), read at each drain.
        self.quota = CpuQuotaReader(proc_root)
        self.memory = MemoryCgroupReader(proc_root)
        self._proc_root = proc_root
        self._queue: queue.Queue[object] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._active: dict[int, _Active] = {}  # by pid; touched on the capture thread only
        #: Who asked for the processes recorded now (`requested_programs`).
        self._requesters: tuple[str, ...] = ()
        self._load_errors: dict[str, str] = {}  # "kernel" / "nccl" -> why it did not load
        self._loaded = threading.Event()
        self._last_drain = 0.0
        self._drain_interval = DRAIN_INTERVAL_S
        self._last_rescan = 0.0
        #: Processes captured so far, and records kept / dropped over the cap (for status).
        self.captures = 0
        self.records_kept = 0
        self.records_dropped = 0
        #: `MAP_FULL` counters since the programs were loaded (updated as parts end).
        self.map_full: dict[str, int] = {}

    # -- lifecycle (event loop) -----------------------------------------------------------

    def start(self) -> None:
        """Start the capture thread; it loads the programs first (in the background)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="trace-capture", daemon=True)
        self._thread.start()
        self.gpu.start()
        self.fabric.start()

    def stop(self) -> None:
        """Stop recording everything, detach and unload (blocks until the thread is done)."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
        self.gpu.stop()
        self.fabric.stop()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Wait until the programs are loaded (or failed to load); for tests and tools."""
        return self._loaded.wait(timeout)

    # -- commands (any thread) ----------------------------------------------------------

    def begin(self, key: CaptureKey, request: KernelTrackRequest) -> Future[None]:
        """Start recording ``request``'s tracks of ``key.pid`` (queued; returns at once).

        Returns:
            A future done once the recording is in place — or once it is known that it
            cannot be (the reasons are in the capture's notes): either way the process's
            trace may start then.
        """
        fut: Future[None] = Future()
        if request.enabled and self._thread is not None:
            self._queue.put(_Begin(key, request, fut))
        else:  # nothing to record, or nobody to record it (stopped: the daemon is exiting)
            fut.set_result(None)
        return fut

    def end(self, key: CaptureKey) -> Future[ProcessCapture]:
        """Stop recording ``key`` and hand over what was recorded (in the future)."""
        fut: Future[ProcessCapture] = Future()
        self._queue.put(_End(key, fut))
        return fut

    def discard(self, key: CaptureKey) -> None:
        """Stop recording ``key`` and forget it (its trace failed or timed out)."""
        self._queue.put(_End(key, None))

    def status(self) -> PartStatus:
        """The capture's state for ``status`` and ``doctor``."""
        if not self.settings.enabled:
            return PartStatus(self.name, PartState.DISABLED, "[capture] enabled = false")
        if self._thread is None:
            return PartStatus(self.name, PartState.STOPPED, "not started")
        if not self._loaded.is_set():
            return PartStatus(self.name, PartState.STARTING, "loading the capture programs")
        missing = self.unavailable_tracks()
        active = len(self._active)
        summary = (
            f"{active} process(es) being recorded; {self.captures} captured, "
            f"{self.records_kept} records kept, {self.records_dropped} dropped over the cap"
        )
        full = [f"{MAP_FULL[name].what} {n} times" for name, n in self.map_full.items() if n]
        if full:
            summary += f"; maps full since loading: {', '.join(full)} (see the traces' notes)"
        for lib, functions in sorted(dict(self.nccl.missing).items()):
            summary += f"; {lib} has no {', '.join(functions)} (not recorded)"
        if len(missing) == len(Track):
            why = "; ".join(f"{t.value}: {r}" for t, r in missing.items())
            return PartStatus(self.name, PartState.UNAVAILABLE, f"no kernel track works: {why}")
        if missing:
            why = "; ".join(f"{t.value}: {r}" for t, r in missing.items())
            # No GPU on this machine is how it is, not a fault of the capture.
            state = PartState.OK if set(missing) == {Track.GPU} else PartState.DEGRADED
            return PartStatus(self.name, state, f"{summary}; unavailable: {why}")
        return PartStatus(self.name, PartState.OK, summary)

    def requested_programs(self) -> RequestedPrograms:
        """The capture's BPF programs and who asked for what they record now (any thread).

        They run only because someone asked for a trace: what they cost is the requesters'
        (the overhead budget charges it to them and leaves it out of the agent's own cost),
        and the budget never samples or detaches them, so a trace keeps all it asked for."""
        ids = self.kernel.loaded_ids() | self.nccl.loaded_ids()
        return RequestedPrograms(ids, self._requesters)

    def _note_requesters(self) -> None:
        """Who asked for the processes recorded now (on the capture thread; one assignment,
        read by the budget's thread)."""
        self._requesters = tuple(sorted({a.key.requester for a in self._active.values()}))

    def unavailable_tracks(self) -> dict[Track, str]:
        """Tracks that cannot be recorded on this machine, with why."""
        out: dict[Track, str] = {}
        for track in (Track.NET, Track.SCHED):
            if "kernel" in self._load_errors:
                out[track] = self._load_errors["kernel"]
            elif track in self.kernel.unavailable:
                out[track] = self.kernel.unavailable[track]
        if "nccl" in self._load_errors:
            out[Track.NCCL] = self._load_errors["nccl"]
        if self.gpu.available:
            out[Track.GPU] = self.gpu.available
        return out

    # -- the capture thread ---------------------------------------------------------------

    def _run(self) -> None:
        first: object = None
        if self._preload_delay_s > 0:
            try:
                first = self._queue.get(timeout=self._preload_delay_s)
            except queue.Empty:
                first = None
        with excluded_work():  # compiling at start (or the first trace), not a running cost
            self._load()
        try:
            while True:
                if first is not None:  # what came before the programs were loaded
                    cmd, first = first, None
                else:
                    timeout = self._drain_interval if self._active else None
                    try:
                        cmd = self._queue.get(timeout=timeout)
                    except queue.Empty:
                        cmd = None
                if cmd is _STOP:
                    break
                try:
                    self._handle(cmd)
                    now = time.monotonic()
                    if self._active and now - self._last_drain >= self._drain_interval:
                        self._last_drain = now
                        self._drain()
                    if self._active and now - self._last_rescan >= NCCL_RESCAN_S:
                        self._last_rescan = now
                        if self.nccl.loaded:
                            self.nccl.rescan()
                except Exception:  # keep capturing the other processes
                    log.exception("capture: handling %r failed", cmd)
        finally:
            for active in list(self._active.values()):
                self._finish(active, None)
            self.kernel.close()
            self.nccl.close()
            self._answer_leftovers()

    def _answer_leftovers(self) -> None:
        """Complete the futures of commands queued after the stop: nobody waits forever."""
        while True:
            try:
                cmd = self._queue.get_nowait()
            except queue.Empty:
                return
            if isinstance(cmd, _Begin):
                cmd.future.set_result(None)
            elif isinstance(cmd, _End) and cmd.future is not None:
                cmd.future.set_exception(RuntimeError("the capture stopped"))

    def _load(self) -> None:
        if not self.settings.enabled:
            self._loaded.set()
            return
        for name, part in (("kernel", self.kernel), ("nccl", self.nccl)):
            try:
                part.load()
            except BpfLoadError as e:
                self._load_errors[name] = str(e)
                log.warning("capture: the %s capture program is unavailable: %s", name, e)
            except Exception as e:  # an unexpected environment: that part only
                self._load_errors[name] = f"{type(e).__name__}: {e}"
                log.exception("capture: loading the %s capture program failed", name)
        self._loaded.set()

    def _handle(self, cmd: object) -> None:
        if isinstance(cmd, _Begin):
            try:
                self._begin(cmd.key, cmd.request)
            finally:  # its trace may start: with what could be put in place
                cmd.future.set_result(None)
        elif isinstance(cmd, _End):
            active = self._active.get(cmd.key.pid)
            if active is None or active.key != cmd.key:
                if cmd.future is not None:
                    cmd.future.set_exception(
                        LookupError(f"nothing was recorded for pid {cmd.key.pid}")
                    )
                return
            try:
                self._finish(active, cmd.future)
            except Exception as e:  # the caller must hear of it, not wait forever
                if cmd.future is not None and not cmd.future.done():
                    cmd.future.set_exception(e)
                raise

    def _begin(self, key: CaptureKey, request: KernelTrackRequest) -> None:
        old = self._active.get(key.pid)
        if old is not None:  # a previous part never ended: it cannot be merged any more
            self._finish(old, None)
        clock = MonotonicClock()
        active = _Active(
            key=key,
            request=request,
            begin_ns=time.monotonic_ns(),
            begin_wall_ns=time.time_ns(),
            offset_begin_ns=clock.offset_ns,
            records=deque(maxlen=self.settings.max_events_per_process),
            distributed=distributed_info(key.pid, self._proc_root),
            counters_at_begin=self._map_full_counters(),  # before anything is attached
        )
        self._active[key.pid] = active
        self._note_requesters()
        kernel_tracks = frozenset(t for t in request.tracks if t in (Track.NET, Track.SCHED))
        if kernel_tracks:
            if self.kernel.loaded:
                for track, reason in self.kernel.add(key.pid, kernel_tracks).items():
                    active.notes[track] = reason
            else:
                for track in kernel_tracks:
                    active.notes[track] = self._load_errors.get("kernel", "not loaded")
        if Track.SCHED in request.tracks:
            self._keep(active, [*self.quota.sample(key.pid), *self.memory.sample(key.pid)])
        if Track.NCCL in request.tracks:
            if self.nccl.loaded:
                reason = self.nccl.add(key.pid)
                if reason:
                    log.info("capture: pid %d: %s; looking again every second", key.pid, reason)
            else:
                active.notes[Track.NCCL] = self._load_errors.get("nccl", "not loaded")
        if Track.GPU in request.tracks:
            reason = self.gpu.add(key, key.pid)
            if reason:
                active.notes[Track.GPU] = reason
        if Track.FABRIC in request.tracks:
            reason = self.fabric.add(key, key.pid, key.requester)
            if reason:
                active.notes[Track.FABRIC] = reason
        log.info(
            "capture: recording %s of %s for trace %s",
            ", ".join(request.names()),
            key.label(),
            key.trace_id,
        )

    def _map_full_notes(self, active: _Active) -> dict[Track, list[str]]:
        """What the maps being full while ``active`` was recorded cost its tracks."""
        full = self._map_full_counters()
        self.map_full = full
        notes: dict[Track, list[str]] = {}
        for name, total in full.items():
            entry = MAP_FULL[name]
            n = total - active.counters_at_begin.get(name, 0)
            if n > 0:
                notes.setdefault(entry.track, []).append(entry.note.format(n=n))
        return notes

    def _map_full_counters(self) -> dict[str, int]:
        """The `MAP_FULL` counters of the loaded programs (host-wide, since loading)."""
        out: dict[str, int] = {}
        for part in (self.kernel, self.nccl):
            if part.loaded:
                out.update((k, v) for k, v in part.counters().items() if k in MAP_FULL)
        return out

    def _drain(self) -> None:
        batches: list[Iterable[tuple[int, list[KernelRecord | PackedOffCpu]]]] = []
        if self.kernel.loaded:
            batches.append(self.kernel.drain().items())
        if self.nccl.loaded:
            batches.append([(t, list(c)) for t, c in self.nccl.drain().items()])
        # What a drain every `DRAIN_INTERVAL_S` would find at this rate: drained sooner, the
        # ring holds less (without that, the drains went back to slow, and it overflowed).
        fill = max(self.kernel.fill(), self.nccl.fill())
        filling = fill * DRAIN_INTERVAL_S / self._drain_interval
        self._drain_interval = (
            FAST_DRAIN_INTERVAL_S if filling >= FAST_DRAIN_FILL else DRAIN_INTERVAL_S
        )
        for batch in batches:
            for tgid, records in batch:
                active = self._active.get(tgid)
                if active is None:
                    continue  # its part just ended (records after its final drain)
                self._keep(active, records)
        for active in self._active.values():
            if Track.SCHED in active.request.tracks:
                pid = active.key.pid
                self._keep(active, [*self.quota.sample(pid), *self.memory.sample(pid)])

    @staticmethod
    def _keep(active: _Active, records: Sequence[KernelRecord | PackedOffCpu]) -> None:
        room = (active.records.maxlen or 0) - len(active.records)
        if len(records) > room:
            active.dropped += len(records) - max(room, 0)
        active.records.extend(records)

    def _finish(self, active: _Active, future: Future[ProcessCapture] | None) -> None:
        """Stop recording one process; complete ``future`` with its capture (None: drop)."""
        pid = active.key.pid
        stats: dict[Track, TrackStats] = {}
        tracks = active.request.tracks
        try:
            self._drain()
            removed = None
            if self.kernel.loaded and pid in self.kernel.traced():
                removed = self.kernel.remove(pid)
                stats.update(removed.stats)
            if Track.NCCL in tracks and self.nccl.loaded:
                stats[Track.NCCL] = self.nccl.remove(pid)
            self._drain()  # what the ring buffers got before the maps forgot the process
            if removed is not None:
                # The bursts still open in the map are each socket's newest: they go last.
                self._keep(active, removed.records)
            full_notes = self._map_full_notes(active)
        finally:
            del self._active[pid]
            self._note_requesters()
        if Track.GPU in tracks:
            samples, gpu_stats = self.gpu.remove(active.key)
            stats[Track.GPU] = gpu_stats
            self._keep(active, list(samples))
        if Track.FABRIC in tracks:
            fabric_records, stats[Track.FABRIC] = self.fabric.remove(active.key)
            self._keep(active, fabric_records)
        for track in tracks:
            st = stats.setdefault(track, TrackStats())
            if track in active.notes and not st.note:
                st.note = active.notes[track]
            st.note = "; ".join(n for n in (st.note, *full_notes.get(track, ())) if n)
        if future is None:
            return
        end_clock = MonotonicClock()
        capture = ProcessCapture(
            pid=pid,
            request=active.request,
            begin_ns=active.begin_ns,
            end_ns=time.monotonic_ns(),
            begin_wall_ns=active.begin_wall_ns,
            offset_ns=(active.offset_begin_ns + end_clock.offset_ns) // 2,
            drift_ns=end_clock.offset_ns - active.offset_begin_ns,
            records=list(map(unpacked, active.records)),
            stats=stats,
            dropped_over_cap=active.dropped,
            cap=self.settings.max_events_per_process,
            settings={
                "net_coalesce_gap_us": self.settings.net_coalesce_gap_us,
                "net_coalesce_max_us": self.settings.net_coalesce_max_us,
                "net_tcp_sample_us": self.settings.net_tcp_sample_us,
                "sched_min_offcpu_us": self.settings.sched_min_offcpu_us,
            },
            distributed=active.distributed,
        )
        self.captures += 1
        self.records_kept += len(capture.records)
        self.records_dropped += active.dropped
        future.set_result(capture)
