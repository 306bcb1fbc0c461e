"""GPU telemetry through NVML: per-GPU state, per-process use, GPM profiling metrics, XIDs.

The only module (with its ``gpu_*`` helpers) that talks to NVML. What it reads each round:

* per GPU: utilization, memory, power and limit, temperature, SM/memory clocks, PCIe and
  NVLink throughput, ECC counters, throttle reasons, MIG mode (`gpu_metrics` lists them);
* per process on each GPU: used memory and the latest utilization sample, for the process
  table (`GpuCollector.per_process`);
* on Hopper-class GPUs: GPM profiling metrics over the interval (`gpu_gpm`), paused while a
  Kineto trace runs on that GPU or an operator's dcgm-pause is in force;
* XID and other critical events on their own thread (`gpu_events`).

Failure handling: an NVML error costs only the field it feeds (NaN, logged once); a lost GPU
reports ``gpu_up 0`` while the others go on, and a lost driver marks every GPU lost; NVML is
then re-initialised with exponential back-off until the GPU or driver comes back. No library
or no driver at start makes the collector unavailable with the cause and a fix.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial

import pynvml

from bpfdyno.core.config import GpuSection
from bpfdyno.core.events import EventSink
from bpfdyno.core.metrics import Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.gpu import metrics as m
from bpfdyno.sources.gpu.events import EventWatcher
from bpfdyno.sources.gpu.gpm import GpmSampler, ManualPause, ProfilingPause
from bpfdyno.sources.gpu.nvml import (
    DeviceLost,
    DeviceRef,
    DriverGone,
    Nvml,
    NvmlInitError,
    probe_host,
)
from bpfdyno.sources.gpu.probe import (
    DeviceState,
    ProcessRows,
    ProcGpu,
    collect_device,
    join_processes,
    query_processes,
    read_trace_counters,
)
from bpfdyno.sources.kubelet.podresources import DeviceOwners, PodRef

log = logging.getLogger("bpfdyno.sources.gpu.collector")

NAN = math.nan
#: With a process-churn signal, each GPU's processes are asked for at least this often (their
#: memory grows and shrinks without any process starting or exiting).
PROCESS_REFRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class GpuDeviceStatus:
    """One GPU in `GpuStatus`; ``lost`` is "" while NVML answers for it."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    lost: str
    gpm: str  # "active", "paused (why[, until ...])", "unavailable: why"


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """What ``status`` and ``doctor`` show about the GPU collector."""

    state: PartState
    reason: str
    driver_version: str
    devices: tuple[GpuDeviceStatus, ...]
    events: str
    missing_functions: tuple[str, ...]
    retry_in_s: float | None


class GpuCollector(Collector):
    """NVML telemetry for every GPU on the host.

    Args:
        library_path: NVML library to use instead of the system's ``libnvidia-ml.so.1``.
        gpm_enabled: read GPM profiling metrics where the GPU supports them.
        events_enabled: watch XID and other critical events.
        event_sink: receives critical events as `KernelEvent`s (from the event thread).
        traced_pids: returns the pids being traced right now (GPM pauses on their GPUs).
        device_owners: returns who holds each device on Kubernetes (the kubelet collector's
            latest lookup): the GPUs' series carry the holder's namespace, pod, container.
        retry_min_s: first delay before re-initialising NVML after a loss; doubles per
            failed attempt up to ``retry_max_s``.
        retry_max_s: longest delay between re-init attempts.
        event_wait_ms: ``nvmlEventSetWait`` timeout; bounds how long `close` waits.
        clock: monotonic seconds (injectable for tests).
        process_churn: a count that moves whenever a process starts or exits on the host
            (the sched collector's exec/exit events): the per-process queries run only when
            it moved or every `PROCESS_REFRESH_S`; None: every round.
        read_demand: whether someone reads the agent's data now: the GPM metric NVML
            computes slowly is then computed every round, else every
            `bpfdyno.sources.gpu.gpm.SLOW_METRICS_S`; None: every round.
    """

    name = "gpu"

    def __init__(
        self,
        library_path: str | None = None,
        *,
        gpm_enabled: bool = True,
        events_enabled: bool = True,
        event_sink: EventSink | None = None,
        traced_pids: Callable[[], Collection[int]] | None = None,
        device_owners: Callable[[], DeviceOwners] | None = None,
        retry_min_s: float = 1.0,
        retry_max_s: float = 60.0,
        event_wait_ms: int = 200,
        clock: Callable[[], float] = time.monotonic,
        process_churn: Callable[[], int] | None = None,
        read_demand: Callable[[], bool] | None = None,
    ) -> None:
        self._nv = Nvml(library_path)
        self._library_path = library_path
        self._process_churn = process_churn
        self._read_demand = read_demand
        self._churn_seen: int | None = None
        self._processes_at = 0.0
        self._gpm_enabled = gpm_enabled
        self._events_enabled = events_enabled
        self._event_sink = event_sink
        self._traced_pids = traced_pids
        self._device_owners = device_owners
        self._pods: dict[int, PodRef] = {}
        self._retry_min_s = retry_min_s
        self._retry_max_s = retry_max_s
        self._event_wait_ms = event_wait_ms
        self._clock = clock
        self._pause = ProfilingPause(clock)
        self._devices: list[DeviceState] = []
        self._watcher: EventWatcher | None = None
        self._xid_totals: dict[str, int] = {}  # by uuid, from watchers already stopped
        self._driver_version = ""
        self._down = ""  # why NVML itself is unusable; "" while it works
        self._retry_at: float | None = None
        self._retry_delay = retry_min_s
        self._started = False
        self._procs: dict[int, ProcGpu] = {}
        # A round and a reader's fresh process query (`fresh_gpu_memory_by_pid`) take turns.
        self._round_lock = threading.Lock()
        self._traced_failed_logged = False
        #: NVML re-initialisations attempted since start (for status and tests).
        self.reinit_attempts = 0

    @classmethod
    def from_config(
        cls,
        section: GpuSection,
        *,
        event_sink: EventSink | None = None,
        traced_pids: Callable[[], Collection[int]] | None = None,
        device_owners: Callable[[], DeviceOwners] | None = None,
        process_churn: Callable[[], int] | None = None,
        read_demand: Callable[[], bool] | None = None,
    ) -> GpuCollector:
        """Build the collector from the ``[gpu]`` config section and the daemon's hooks."""
        return cls(
            section.library_path or None,
            gpm_enabled=section.gpm_enabled,
            events_enabled=section.events_enabled,
            event_sink=event_sink,
            traced_pids=traced_pids,
            device_owners=device_owners,
            process_churn=process_churn,
            read_demand=read_demand,
        )

    # ---- lifecycle ----

    def start(self) -> None:
        """Initialise NVML and enumerate the GPUs.

        Raises:
            CollectorUnavailable: no NVML library, no driver, no GPU.
        """
        try:
            self._nv.init()
        except NvmlInitError as e:
            # No NVIDIA driver at all: a host without GPUs, not a broken one.
            no_driver = e.code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND and not self._library_path
            raise CollectorUnavailable(str(e), absent=no_driver) from e
        try:
            self._enumerate()
        except DriverGone as e:
            self._nv.shutdown()
            raise CollectorUnavailable(
                f"NVML lost the driver while listing GPUs ({e}) — check that `nvidia-smi` works"
            ) from e
        if not self._devices:
            self._nv.shutdown()
            raise CollectorUnavailable(
                "NVML works but lists no GPU — check `nvidia-smi -L`; in a container, expose "
                "the GPUs to it (e.g. --gpus all)"
            )
        self._start_generation()
        self._started = True
        log.info("gpu: %s", self.health()[1])

    def close(self) -> None:
        """Stop the event thread, free GPM samples and shut NVML down. Idempotent."""
        if not self._started:
            return
        self._started = False
        self._end_generation()
        self._nv.shutdown()

    def _start_generation(self) -> None:
        """After a successful init + enumerate: driver version, GPM samplers, event thread."""
        nv = self._nv
        try:
            version = nv.get("nvmlSystemGetDriverVersion", -1, pynvml.nvmlSystemGetDriverVersion)
            self._driver_version = version or ""
            for dev in self._devices:
                if dev.lost or not self._gpm_enabled:
                    continue
                try:
                    dev.gpm = GpmSampler(nv, dev.ref)
                except DeviceLost as e:
                    dev.lost = str(e)
        except DriverGone as e:
            self._mark_all_lost(str(e))
        healthy = [d.ref for d in self._devices if not d.lost]
        if self._events_enabled and healthy:
            self._watcher = EventWatcher(nv, healthy, self._event_sink, self._event_wait_ms)
            self._watcher.start()
        if len(healthy) < len(self._devices):
            self._schedule_retry()

    def _end_generation(self) -> None:
        """Before nvmlShutdown: stop the event thread (keeping its counts), free GPM."""
        if self._watcher is not None:
            self._watcher.stop()
            by_index = {d.ref.index: d.ref.uuid for d in self._devices}
            for index, count in self._watcher.xid_counts().items():
                uuid = by_index.get(index, "")
                self._xid_totals[uuid] = self._xid_totals.get(uuid, 0) + count
            self._watcher = None
        for dev in self._devices:
            if dev.gpm is not None:
                dev.gpm.close()
                dev.gpm = None

    def _enumerate(self) -> None:
        """List the GPUs of this init generation; known GPUs that vanished stay, as lost.

        Raises:
            DriverGone: NVML lost the driver.
        """
        nv = self._nv
        previous = {d.ref.index: d for d in self._devices}
        count = nv.get("nvmlDeviceGetCount_v2", -1, pynvml.nvmlDeviceGetCount) or 0
        devices: list[DeviceState] = []
        for i in range(count):
            old = previous.get(i)
            try:
                handle = nv.get(
                    "nvmlDeviceGetHandleByIndex_v2",
                    i,
                    partial(pynvml.nvmlDeviceGetHandleByIndex, i),
                )
                if handle is None:
                    raise DeviceLost(i, "nvmlDeviceGetHandleByIndex_v2", pynvml.NVML_ERROR_UNKNOWN)
                uuid = nv.get("nvmlDeviceGetUUID", i, partial(pynvml.nvmlDeviceGetUUID, handle))
                name = nv.get("nvmlDeviceGetName", i, partial(pynvml.nvmlDeviceGetName, handle))
                pci = nv.get(
                    "nvmlDeviceGetPciInfo_v3", i, partial(pynvml.nvmlDeviceGetPciInfo_v3, handle)
                )
                bus_id = _text(pci.busId) if pci is not None else ""
                # GKE's device plugin names GPUs by their device node, /dev/nvidia<minor>.
                minor = nv.get(
                    "nvmlDeviceGetMinorNumber", i, partial(pynvml.nvmlDeviceGetMinorNumber, handle)
                )
                ref = DeviceRef(i, uuid or f"index-{i}", name or "", bus_id, handle, minor)
                devices.append(DeviceState(ref))
            except DeviceLost as e:
                ref = (
                    replace(old.ref, handle=None)
                    if old
                    else DeviceRef(i, f"index-{i}", "", "", None)
                )
                devices.append(DeviceState(ref, lost=str(e)))
        present = {d.ref.uuid for d in devices}
        for old in self._devices:
            if old.ref.uuid not in present and not old.ref.uuid.startswith("index-"):
                gone = DeviceState(replace(old.ref, handle=None), lost="no longer listed by NVML")
                devices.append(gone)
        self._devices = devices

    # ---- recovery ----

    def _schedule_retry(self) -> None:
        if self._retry_at is None:
            self._retry_at = self._clock() + self._retry_delay

    def _retry_failed(self) -> None:
        self._retry_delay = min(max(self._retry_delay * 2, self._retry_min_s), self._retry_max_s)
        self._retry_at = self._clock() + self._retry_delay

    def _mark_all_lost(self, why: str) -> None:
        for dev in self._devices:
            dev.lost = dev.lost or why

    def _reinit(self) -> None:
        """Shut NVML down and initialise it again, for lost GPUs or a lost driver."""
        self.reinit_attempts += 1
        self._end_generation()
        self._nv.shutdown()
        try:
            self._nv.init()
            self._enumerate()
        except (NvmlInitError, DriverGone) as e:
            self._nv.shutdown()
            self._down = e.reason if isinstance(e, NvmlInitError) else str(e)
            self._mark_all_lost(f"NVML unavailable: {self._down}")
            self._retry_failed()
            return
        self._down = ""
        self._retry_at = None
        self._start_generation()
        if any(d.lost for d in self._devices):
            self._retry_failed()
        else:
            log.info("gpu: NVML re-initialised, all %d GPU(s) answer again", len(self._devices))
            self._retry_at = None
            self._retry_delay = self._retry_min_s

    # ---- collection ----

    def collect(self) -> Sequence[Sample]:
        """One round: every GPU's metrics; lost GPUs report ``gpu_up 0``."""
        with self._round_lock:
            return self._collect()

    def _collect(self) -> list[Sample]:
        if not self._started:
            return []
        if self._retry_at is not None and self._clock() >= self._retry_at:
            self._reinit()
        manual = self._pause.current()
        traced = (
            self._traced() if any(d.gpm and not d.gpm.unavailable for d in self._devices) else set()
        )
        per_device: dict[int, list[Sample]] = {}
        procs: ProcessRows = {}
        owners = self._device_owners() if self._device_owners is not None else DeviceOwners()
        for dev in self._devices:
            dev.attribute(owners.labels(dev.ref.aliases()))
        now = self._clock()
        processes_due = self._processes_due(now)
        slow_gpm_now = self._read_now()
        for pos, dev in enumerate(self._devices):
            if dev.lost:
                continue
            rows: ProcessRows = {}  # merged only if the whole GPU could be read
            try:
                per_device[pos] = collect_device(
                    self._nv,
                    dev,
                    self._pause_reason(manual, traced),
                    self._xid_count(dev),
                    rows,
                    now,
                    processes_due,
                    slow_gpm_now,
                )
                for pid, entries in rows.items():
                    procs.setdefault(pid, []).extend(entries)
            except DeviceLost as e:
                self._device_lost(dev, str(e))
            except DriverGone as e:
                log.warning("gpu: NVML lost the driver (%s); every GPU is marked lost", e)
                self._mark_all_lost(str(e))
                per_device.clear()
                procs.clear()
                self._schedule_retry()
                break
        if self._watcher is not None and self._watcher.lost:
            self._schedule_retry()  # the event thread saw a loss: restart it with new handles
        out = [sample(m.GPU_COUNT, len(per_device))]
        for pos, dev in enumerate(self._devices):
            if pos in per_device:
                out.extend(per_device[pos])
            else:
                out.append(sample(m.GPU_UP, 0, dev.labels))
        self._procs = join_processes(procs)
        by_index = {d.ref.index: d.ref.aliases() for d in self._devices}
        self._pods = {
            pid: pod
            for pid, p in self._procs.items()
            if (pod := owners.owner(by_index.get(p.gpu, ()))) is not None
        }
        return out

    def _read_now(self) -> bool:
        """Whether someone reads the agent's data now (no demand given, or one that cannot
        say: as if someone did, so the data stays fresh)."""
        if self._read_demand is None:
            return True
        try:
            return bool(self._read_demand())
        except Exception:
            return True

    def _processes_due(self, now: float) -> bool:
        """Whether to ask NVML for each GPU's processes this round (see ``process_churn``)."""
        if self._process_churn is None:
            self._processes_at = now
            return True
        churn = self._process_churn()
        if churn == self._churn_seen and now - self._processes_at < PROCESS_REFRESH_S:
            return False
        self._churn_seen, self._processes_at = churn, now
        return True

    def _device_lost(self, dev: DeviceState, why: str) -> None:
        if not dev.lost:
            log.warning(
                "gpu %d (%s) lost: %s; NVML will be re-initialised",
                dev.ref.index,
                dev.ref.uuid,
                why,
            )
        dev.lost = why
        dev.nvlink_prev = None
        self._schedule_retry()

    def _traced(self) -> set[int]:
        provider = self._traced_pids
        if provider is None:
            return set()
        try:
            return set(provider())
        except Exception:
            if not self._traced_failed_logged:
                self._traced_failed_logged = True
                log.exception("gpu: the traced-pids provider failed; GPM is not paused for traces")
            return set()

    @staticmethod
    def _pause_reason(
        manual: ManualPause | None, traced: set[int]
    ) -> Callable[[Collection[int]], str]:
        """A function telling, from the pids on a GPU, why GPM must pause there ("" if not)."""

        def reason(pids_on_gpu: Collection[int]) -> str:
            if manual is not None:
                return f"dcgm-pause, until {_iso(manual.until_wall)}"
            on_gpu = sorted(traced.intersection(pids_on_gpu))
            if on_gpu:
                return "Kineto trace in pid " + ", ".join(str(p) for p in on_gpu)
            return ""

        return reason

    def _xid_count(self, dev: DeviceState) -> float:
        watcher = self._watcher
        if watcher is None or not watcher.state.startswith("watching"):
            return NAN
        return float(
            self._xid_totals.get(dev.ref.uuid, 0) + watcher.xid_counts().get(dev.ref.index, 0)
        )

    # ---- profiling pause (dcgm-pause / dcgm-resume) ----

    def pause_profiling(self, duration_s: float) -> bool:
        """Stop GPM sampling on every GPU for ``duration_s`` seconds (dcgm-pause).

        Thread-safe. Returns whether any GPU has profiling metrics to pause (False also
        before start), like dynolog's reply without a profiling source.

        Raises:
            InvalidArgument: ``duration_s`` breaks `bpfdyno.core.rules.pause_duration_s`.
        """
        pause = self._pause.pause(duration_s)
        log.info("gpu: profiling paused until %s (dcgm-pause)", _iso(pause.until_wall))
        return self._has_profiling()

    def resume_profiling(self) -> bool:
        """End a dcgm-pause now (pauses for running traces stay). Thread-safe.

        Returns whether any GPU has profiling metrics to resume.
        """
        if self._pause.resume():
            log.info("gpu: profiling resumed (dcgm-resume)")
        return self._has_profiling()

    def set_traced_pids_provider(self, provider: Callable[[], Collection[int]] | None) -> None:
        """Set the function returning the pids being traced now (tracing's ``tracing_pids``)."""
        self._traced_pids = provider

    def _has_profiling(self) -> bool:
        return self._started and any(
            d.gpm is not None and not d.gpm.unavailable for d in self._devices
        )

    # ---- views for other parts ----

    def per_process(self) -> dict[int, ProcGpu]:
        """pid -> its GPU use, from the last round (a snapshot; safe from any thread)."""
        return self._procs

    def pods_by_pid(self) -> dict[int, PodRef]:
        """The pod and container of each process on a GPU one container holds (Kubernetes),
        as of the last round; for the process table."""
        return self._pods

    def fresh_gpu_memory_by_pid(self, max_age_s: float) -> dict[int, int] | None:
        """`gpu_memory_by_pid` from a process query at most ``max_age_s`` old: each GPU's
        processes are asked for first when the last query is older (blocking: a worker
        thread's call).

        Between process starts and exits the rounds ask only every `PROCESS_REFRESH_S`; the
        process table's reader is never answered from that. A GPU that fails here keeps its
        last query's processes (the next round deals with the failure).
        """
        with self._round_lock:
            if not self._started:
                return None
            now = self._clock()
            if now - self._processes_at > max_age_s:
                rows: ProcessRows = {}
                for dev in self._devices:
                    if not dev.lost:
                        with contextlib.suppress(DeviceLost, DriverGone):
                            query_processes(self._nv, dev)
                    for pid, entries in dev.proc_rows.items():
                        rows.setdefault(pid, []).extend(entries)
                self._procs = join_processes(rows)
                self._processes_at = now
        return self.gpu_memory_by_pid()

    def gpu_memory_by_pid(self) -> dict[int, int] | None:
        """pid -> GPU memory in bytes, the shape the process table's provider takes.

        None while the collector is not running (no GPU, no driver), so the process table
        shows "unknown" rather than 0 bytes.
        """
        if not self._started:
            return None
        return {
            pid: int(p.used_memory_bytes)
            for pid, p in self._procs.items()
            if not math.isnan(p.used_memory_bytes)
        }

    # ---- the kernel tracks of traces (bpfdyno.tracing.capture.gpu) ----

    def trace_gpus(self, pid: int) -> tuple[int, ...] | None:
        """The GPUs process ``pid`` has a context on, as of the last round (any thread).

        None while the collector is not running.
        """
        if not self._started:
            return None
        p = self._procs.get(pid)
        return p.gpus if p is not None else ()

    def trace_counters(self, gpus: Collection[int]) -> dict[int, dict[str, float]]:
        """Read the trace counters of ``gpus`` now (any thread; NVML is thread-safe).

        A lost GPU (or driver) is left out; the collection rounds deal with the loss.
        """
        out: dict[int, dict[str, float]] = {}
        if not self._started:
            return out
        for dev in list(self._devices):
            if dev.ref.index not in gpus or dev.lost:
                continue
            try:
                out[dev.ref.index] = read_trace_counters(self._nv, dev)
            except (DeviceLost, DriverGone):
                continue
        return out

    def status(self) -> GpuStatus:
        """The collector's detailed state (safe from any thread)."""
        state, reason = self.health()
        retry = None if self._retry_at is None else max(0.0, self._retry_at - self._clock())
        manual = self._pause.current()
        devices = tuple(
            GpuDeviceStatus(
                d.ref.index,
                d.ref.uuid,
                d.ref.name,
                d.ref.pci_bus_id,
                d.lost,
                self._gpm_status(d, manual),
            )
            for d in self._devices
        )
        watcher = self._watcher
        events = (
            watcher.state if watcher else ("disabled" if not self._events_enabled else "stopped")
        )
        return GpuStatus(
            state,
            reason,
            self._driver_version,
            devices,
            events,
            tuple(sorted(self._nv.missing)),
            retry,
        )

    def health(self) -> tuple[PartState, str]:
        """(state, one-line reason) for the daemon's status: DEGRADED while a GPU is lost."""
        if not self._started:
            return PartState.STOPPED, "not started"
        retry = (
            ""
            if self._retry_at is None
            else f"; re-init in {max(0.0, self._retry_at - self._clock()):.0f} s"
        )
        if self._down:
            return PartState.DEGRADED, f"NVML unavailable: {self._down}{retry}"
        lost = [d for d in self._devices if d.lost]
        if lost:
            what = "; ".join(f"gpu {d.ref.index} ({d.ref.uuid}) lost: {d.lost}" for d in lost)
            return PartState.DEGRADED, what + retry
        manual = self._pause.current()
        gpm = sorted({self._gpm_status(d, manual) for d in self._devices})
        watcher = self._watcher
        return PartState.OK, (
            f"{len(self._devices)} GPU(s), driver {self._driver_version or '?'}; GPM: "
            f"{' / '.join(gpm)}; events: {watcher.state if watcher else 'disabled'}"
        )

    def _gpm_status(self, dev: DeviceState, manual: ManualPause | None) -> str:
        if not self._gpm_enabled:
            return "disabled ([gpu] gpm_enabled = false)"
        if dev.lost:
            return "unavailable: the GPU is lost"
        if dev.gpm is None:
            return "unavailable"
        if dev.gpm.unavailable:
            return f"unavailable: {dev.gpm.unavailable}"
        if manual is not None:
            return f"paused (dcgm-pause, until {_iso(manual.until_wall)})"
        return dev.gpm_state


def _text(value: str | bytes) -> str:
    # pynvml returns char arrays as str in recent versions, bytes in older ones.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def doctor_check(library_path: str | None = None) -> tuple[bool | None, str, str]:
    """Can NVML be used here? For ``bpfdyno doctor`` (initialises NVML briefly).

    Returns:
        (ok, detail, fix): ok is True when NVML lists GPUs, False when a driver is installed
        but unusable, None when the machine has no NVIDIA driver at all (not applicable).
    """
    return probe_host(library_path)


__all__ = ["GpuCollector", "GpuDeviceStatus", "GpuStatus", "ProcGpu", "doctor_check"]
