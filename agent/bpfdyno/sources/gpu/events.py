"""XID and other critical GPU events from an NVML event set, on a dedicated thread.

NVML delivers events only through a blocking ``nvmlEventSetWait``; a thread waits with a short
timeout (so `EventWatcher.stop` returns quickly) and turns each event into a `KernelEvent`
for the kernel/GPU event stream. NVML does not say which process caused an XID, so ``pid`` is
0; ``attrs`` carry the GPU index and UUID, the XID code, and the MIG instance when known.

One watcher lives for one NVML init generation: the collector stops it before
``nvmlShutdown`` and starts a new one after a re-init (device handles change).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from functools import partial

import pynvml

from bpfdyno.core.events import EventSink, KernelEvent
from bpfdyno.sources.gpu.nvml import (
    DEVICE_LOST_CODES,
    DRIVER_GONE_CODES,
    DeviceLost,
    DeviceRef,
    DriverGone,
    Nvml,
    describe_error,
    device_address,
)

log = logging.getLogger("bpfdyno.sources.gpu.collector")


#: Critical event types watched, and the event kind each becomes. Single-bit ECC errors are
#: left out on purpose: they are corrected, can be frequent, and the ECC counters count them.
CRITICAL_EVENTS: dict[int, str] = {
    pynvml.nvmlEventTypeXidCriticalError: "gpu_xid",
    pynvml.nvmlEventTypeDoubleBitEccError: "gpu_ecc_double_bit",
    pynvml.nvmlEventTypeDramRetirementFailure: "gpu_dram_retirement_failure",
    pynvml.nvmlEventTypeNonFatalPoisonError: "gpu_nonfatal_poison",
    pynvml.nvmlEventTypeFatalPoisonError: "gpu_fatal_poison",
    pynvml.nvmlEventTypeGpuUnavailableError: "gpu_unavailable",
    pynvml.nvmlEventTypeGpuRecoveryAction: "gpu_recovery_action",
}
CRITICAL_MASK = sum(CRITICAL_EVENTS)
_NO_INSTANCE = 0xFFFFFFFF


class EventWatcher:
    """Waits on one NVML event set for the given GPUs and hands events to ``sink``.

    Args:
        nv: the NVML wrapper.
        devices: the GPUs to register (handles of the current init generation).
        sink: receives each event (called on the watcher thread; must not block long).
        wait_ms: the ``nvmlEventSetWait`` timeout: how long `stop` may take.
    """

    def __init__(
        self,
        nv: Nvml,
        devices: Sequence[DeviceRef],
        sink: EventSink | None,
        wait_ms: int = 200,
    ) -> None:
        self._nv = nv
        self._devices = {device_address(d.handle): d for d in devices}
        self._sink = sink
        self._wait_ms = wait_ms
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._xid_counts: dict[int, int] = {}
        self._thread: threading.Thread | None = None
        self._sink_failed_logged = False
        #: What the watcher is doing, for status ("watching 2 GPUs", "unavailable: ...").
        self.state = "starting"
        #: Set when the wait failed because a GPU or the driver went away.
        self.lost = False

    def start(self, ready_timeout_s: float = 5.0) -> str:
        """Start the thread; return its state once the event set is set up."""
        self._thread = threading.Thread(target=self._run, name="gpu-events", daemon=True)
        self._thread.start()
        self._ready.wait(ready_timeout_s)
        return self.state

    def stop(self) -> None:
        """Stop waiting and free the event set; returns within about ``wait_ms``."""
        self._stop.set()
        if self._thread is not None:
            # A hung driver could block nvmlEventSetWait past its timeout; the thread is a
            # daemon thread, so give up waiting rather than hang the collector.
            self._thread.join(self._wait_ms / 1000 + 5.0)
            if self._thread.is_alive():
                log.warning("gpu: the event thread did not stop within its wait timeout")
            self._thread = None

    def xid_counts(self) -> dict[int, int]:
        """XID events seen per GPU index since this watcher started."""
        with self._lock:
            return dict(self._xid_counts)

    def _run(self) -> None:
        try:
            event_set = self._setup()
        except (DeviceLost, DriverGone) as e:
            self.state, self.lost = f"stopped: {e}", True
            event_set = None
        finally:
            self._ready.set()
        if event_set is None:
            return
        try:
            self._loop(event_set)
        finally:
            self._nv.release("nvmlEventSetFree", partial(pynvml.nvmlEventSetFree, event_set))

    def _setup(self) -> object | None:
        nv = self._nv
        event_set = nv.get("nvmlEventSetCreate", -1, pynvml.nvmlEventSetCreate)
        if event_set is None:
            self.state = "unavailable: nvmlEventSetCreate failed (see the log)"
            return None
        registered = 0
        for dev in self._devices.values():
            supported = nv.get(
                "nvmlDeviceGetSupportedEventTypes",
                dev.index,
                partial(pynvml.nvmlDeviceGetSupportedEventTypes, dev.handle),
            )
            mask = (supported or 0) & CRITICAL_MASK
            if mask and nv.do(
                "nvmlDeviceRegisterEvents",
                dev.index,
                partial(pynvml.nvmlDeviceRegisterEvents, dev.handle, mask, event_set),
            ):
                registered += 1
        if registered == 0:
            self.state = "unavailable: no GPU supports critical-error events"
            nv.release("nvmlEventSetFree", partial(pynvml.nvmlEventSetFree, event_set))
            return None
        self.state = f"watching {registered} GPU(s) for XID and critical errors"
        return event_set  # type: ignore[no-any-return]  # pynvml is untyped

    def _loop(self, event_set: object) -> None:
        logged: set[int] = set()
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait(event_set, self._wait_ms)
            except pynvml.NVMLError as e:
                code = e.value
                if code == pynvml.NVML_ERROR_TIMEOUT:
                    continue
                if code in DEVICE_LOST_CODES or code in DRIVER_GONE_CODES:
                    # The collector notices the loss too, re-initialises NVML and starts a
                    # new watcher with fresh handles.
                    self.state = f"stopped: nvmlEventSetWait: {describe_error(code)}"
                    self.lost = True
                    return
                if code == pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                    self.state = "unavailable: the driver has no nvmlEventSetWait_v2 (too old)"
                    return
                if code not in logged:
                    logged.add(code)
                    log.warning(
                        "nvmlEventSetWait: %s; retrying (logged once)", describe_error(code)
                    )
                self._stop.wait(1.0)
                continue
            self._deliver(data)

    def _deliver(self, data: pynvml.c_nvmlEventData_t) -> None:
        dev = self._devices.get(device_address(data.device))
        etype = int(data.eventType)
        attrs: dict[str, int | float | str] = {
            "gpu": dev.index if dev else -1,
            "uuid": dev.uuid if dev else "",
            "event_type": etype,
        }
        if etype == pynvml.nvmlEventTypeXidCriticalError:
            attrs["xid"] = int(data.eventData)
            if dev is not None:
                with self._lock:
                    self._xid_counts[dev.index] = self._xid_counts.get(dev.index, 0) + 1
        else:
            attrs["data"] = int(data.eventData)
        if data.gpuInstanceId != _NO_INSTANCE:
            attrs["gpu_instance_id"] = int(data.gpuInstanceId)
        if data.computeInstanceId != _NO_INSTANCE:
            attrs["compute_instance_id"] = int(data.computeInstanceId)
        kind = CRITICAL_EVENTS.get(etype, "gpu_event")
        event = KernelEvent(ts_ns=time.time_ns(), kind=kind, pid=0, tid=0, comm="", attrs=attrs)
        log.warning("GPU event %s on gpu %s: %s", kind, attrs["gpu"], attrs)
        if self._sink is None:
            return
        try:
            self._sink([event])
        except Exception:
            if not self._sink_failed_logged:
                self._sink_failed_logged = True
                log.exception("the GPU event sink failed; events are still counted (logged once)")
