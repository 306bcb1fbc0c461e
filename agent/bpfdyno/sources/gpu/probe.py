"""One GPU's round of NVML reads, turned into samples with units converted.

NVML's units are converted here and nowhere else: percent -> ratio, milliwatts -> watts,
MHz -> hertz, PCIe KB/s (KiB, as nvidia-smi and nvitop read it) -> bytes/s, cumulative NVLink
KiB and PCIe byte counters -> bytes/s over the interval (between NVML's own read timestamps).

What a round costs grows with the GPUs, so it asks NVML as little as it can (each call is an
ioctl into the driver on a real GPU): power and the NVLink and PCIe byte counters come in
one ``nvmlDeviceGetFieldValues`` call (each falls back to its own call on a driver that
lacks the field; the PCIe counters replace ``nvmlDeviceGetPcieThroughput``, which samples
for 20 ms per call); what changes slowly (the power limit, ECC totals, MIG mode) is read
every `SLOW_FIELDS_S` and reported from the last read in between; the per-process queries
run only when the caller says the process set may have changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import pynvml

from bpfdyno.core.metrics import MetricSpec, Sample, sample
from bpfdyno.sources.gpu import metrics as m
from bpfdyno.sources.gpu.gpm import GpmSampler
from bpfdyno.sources.gpu.nvml import DeviceRef, Nvml
from bpfdyno.sources.kubelet.podresources import NO_POD

T = TypeVar("T")
NAN = math.nan

#: Most processes reported per GPU (largest memory first), to bound label cardinality.
MAX_PROCESSES_PER_GPU = 128
#: nvmlDeviceGetFieldValues scope meaning "summed over all NVLink links".
_ALL_LINKS = 0xFFFFFFFF
#: Per-entry answers of nvmlDeviceGetFieldValues meaning "this driver lacks the field".
_FIELD_MISSING = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT})
#: The fields of the one per-round ``nvmlDeviceGetFieldValues`` call, in its order.
_POWER_FIELD = (pynvml.NVML_FI_DEV_POWER_AVERAGE, 0)
_NVLINK_FIELDS = (
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
    (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS),
)
_PCIE_FIELDS = (
    (pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, 0),
    (pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES, 0),
)
#: The power limit, ECC totals and MIG mode are read this often (they rarely change).
SLOW_FIELDS_S = 30.0
_FIELD_VALUE = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}
_ECC_TYPES = (
    (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, "corrected"),
    (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, "uncorrected"),
)
_NOT_FOUND = frozenset({pynvml.NVML_ERROR_NOT_FOUND})

#: pid -> [(gpu index, used bytes, sm util ratio)], filled across GPUs for the process table.
ProcessRows = dict[int, list[tuple[int, float, float]]]


@dataclass
class DeviceState:
    """A GPU and what the collector remembers about it between rounds."""

    ref: DeviceRef
    lost: str = ""  # why NVML no longer answers for it; "" while it does
    gpm: GpmSampler | None = None
    gpm_state: str = "starting"
    #: (timestamp us, tx KiB, rx KiB) of the previous NVLink counter read.
    nvlink_prev: tuple[int, int, int] | None = None
    #: (timestamp us, tx bytes, rx bytes) of the previous PCIe counter read.
    pcie_prev: tuple[int, int, int] | None = None
    #: Whether the driver has the power and PCIe counter fields (else their own calls).
    power_field: bool = True
    pcie_fields: bool = True
    #: The slow fields' samples and when they were read (monotonic s; None: never).
    slow: list[Sample] = field(default_factory=list)
    slow_at: float | None = None
    #: The per-process samples, rows and pids of the last process query.
    proc_samples: list[Sample] = field(default_factory=list)
    proc_rows: ProcessRows = field(default_factory=dict)
    proc_pids: set[int] = field(default_factory=set)
    #: Newest process-utilization sample timestamp seen (NVML's lastSeenTimeStamp).
    util_seen_us: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    #: The GPM values of the latest round that read them (None while paused or unavailable)
    #: and when (monotonic seconds): the kernel tracks of traces reuse them.
    gpm_last: dict[MetricSpec, float] | None = None
    gpm_last_mono: float = 0.0

    def __post_init__(self) -> None:
        self.attribute(NO_POD)

    def attribute(self, pod: Mapping[str, str]) -> None:
        """Label the GPU's series with the pod holding it (`bpfdyno.sources.kubelet`)."""
        labels = {"gpu": str(self.ref.index), "uuid": self.ref.uuid, **pod}
        if labels != self.labels:
            self.labels = labels
            self.slow_at = None  # its cached slow-field samples carry the old labels


def _scaled(value: float | None, factor: float = 1, divisor: float = 1) -> float:
    """``value * factor / divisor``, NaN for None. Divisions are exact-rounded, unlike
    multiplying by 0.01 or 1e-3 (57 * 0.01 is 0.5700000000000001)."""
    return NAN if value is None else float(value) * factor / divisor


def collect_device(
    nv: Nvml,
    dev: DeviceState,
    pause_reason: Callable[[Collection[int]], str],
    xid_count: float,
    procs: ProcessRows,
    now: float | None = None,
    processes_due: bool = True,
    slow_gpm_now: bool = True,
) -> list[Sample]:
    """Read one GPU; return its samples (NaN where NVML has no value).

    Args:
        nv: the NVML wrapper.
        dev: the GPU.
        pause_reason: from the pids on this GPU, why GPM must pause ("" if it need not).
        xid_count: XID events seen on this GPU (NaN when events are not watched).
        procs: accumulates this GPU's processes for the process table.
        now: monotonic seconds, for `SLOW_FIELDS_S` (default: the clock).
        processes_due: query its processes now (else the last query's are reported).
        slow_gpm_now: compute the GPM metric NVML computes slowly now (True), or only when
            its interval is over (False) (`bpfdyno.sources.gpu.gpm.GpmSampler.read`).

    Raises:
        DeviceLost: the GPU is gone (the partial samples are dropped by the caller).
        DriverGone: NVML lost the driver.
    """
    h, i, labels = dev.ref.handle, dev.ref.index, dev.labels
    now = time.monotonic() if now is None else now

    def get(function: str, call: Callable[[], T], detail: str = "") -> T | None:
        return nv.get(function, i, call, detail)

    def put(spec: MetricSpec, value: float) -> None:
        out.append(sample(spec, value, labels))

    out: list[Sample] = [
        sample(m.GPU_UP, 1, labels),
        sample(m.GPU_INFO, 1, {**labels, "name": dev.ref.name, "pci_bus_id": dev.ref.pci_bus_id}),
    ]
    util = get("nvmlDeviceGetUtilizationRates", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
    put(m.UTILIZATION, _scaled(util.gpu if util else None, divisor=100))
    put(m.MEMORY_UTILIZATION, _scaled(util.memory if util else None, divisor=100))

    # nvmlDeviceGetMemoryInfo_v2 adds "reserved"; older drivers only have the v1 call.
    mem: Any = get(
        "nvmlDeviceGetMemoryInfo_v2",
        lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
    )
    if mem is None:
        mem = get("nvmlDeviceGetMemoryInfo", lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
    put(m.MEMORY_USED, _scaled(mem.used if mem else None))
    put(m.MEMORY_FREE, _scaled(mem.free if mem else None))
    put(m.MEMORY_TOTAL, _scaled(mem.total if mem else None))
    put(m.MEMORY_RESERVED, _scaled(getattr(mem, "reserved", None)))

    power, (nvlink_tx, nvlink_rx), (pcie_tx, pcie_rx) = _round_fields(nv, dev)
    put(m.POWER, power)
    # nvmlDeviceGetTemperatureV (R550+) replaces the deprecated nvmlDeviceGetTemperature.
    temp = get(
        "nvmlDeviceGetTemperatureV",
        lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
    )
    if temp is None and "nvmlDeviceGetTemperatureV" in nv.missing:
        temp = get(
            "nvmlDeviceGetTemperature",
            lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        )
    put(m.TEMPERATURE, _scaled(temp))
    for spec, clock, detail in (
        (m.SM_CLOCK, pynvml.NVML_CLOCK_SM, "sm"),
        (m.MEMORY_CLOCK, pynvml.NVML_CLOCK_MEM, "mem"),
    ):
        mhz = get(
            "nvmlDeviceGetClockInfo", partial(pynvml.nvmlDeviceGetClockInfo, h, clock), detail
        )
        put(spec, _scaled(mhz, 1_000_000))
    put(m.PCIE_TX, pcie_tx)
    put(m.PCIE_RX, pcie_rx)
    put(m.NVLINK_TX, nvlink_tx)
    put(m.NVLINK_RX, nvlink_rx)

    # "Clocks event reasons" is the R535+ name of the throttle reasons; same bits.
    reasons = get(
        "nvmlDeviceGetCurrentClocksEventReasons",
        lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
    )
    if reasons is None and "nvmlDeviceGetCurrentClocksEventReasons" in nv.missing:
        reasons = get(
            "nvmlDeviceGetCurrentClocksThrottleReasons",
            lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        )
    put(m.THROTTLE_REASONS, _scaled(reasons))
    for bit, reason in m.THROTTLE_REASON_BITS:
        active = NAN if reasons is None else float(bool(reasons & bit))
        out.append(sample(m.THROTTLE_REASON_ACTIVE, active, {**labels, "reason": reason}))

    if dev.slow_at is None or now - dev.slow_at >= SLOW_FIELDS_S:
        dev.slow, dev.slow_at = _slow_fields(nv, dev), now
    out.extend(dev.slow)
    put(m.XID_ERRORS, xid_count)

    if processes_due:
        query_processes(nv, dev)
    out.extend(dev.proc_samples)
    for pid, entries in dev.proc_rows.items():
        procs.setdefault(pid, []).extend(entries)
    _gpm(dev, pause_reason(dev.proc_pids), out, slow_gpm_now)
    return out


def query_processes(nv: Nvml, dev: DeviceState) -> None:
    """Ask NVML for one GPU's processes now; the device keeps them until the next query.

    Raises:
        DeviceLost: the GPU stopped answering.
        DriverGone: the driver went away.
    """
    samples: list[Sample] = []
    rows: ProcessRows = {}
    pids = _processes(nv, dev, samples, rows)
    dev.proc_samples, dev.proc_rows, dev.proc_pids = samples, rows, pids


def _slow_fields(nv: Nvml, dev: DeviceState) -> list[Sample]:
    """The power limit, ECC totals and MIG mode of one GPU (read every `SLOW_FIELDS_S`)."""
    h, i, labels = dev.ref.handle, dev.ref.index, dev.labels
    limit = nv.get(
        "nvmlDeviceGetEnforcedPowerLimit", i, lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h)
    )
    out = [sample(m.POWER_LIMIT, _scaled(limit, divisor=1000), labels)]
    for etype, name in _ECC_TYPES:
        count = nv.get(
            "nvmlDeviceGetTotalEccErrors",
            i,
            partial(pynvml.nvmlDeviceGetTotalEccErrors, h, etype, pynvml.NVML_VOLATILE_ECC),
            name,
        )
        out.append(sample(m.ECC_ERRORS, _scaled(count), {**labels, "type": name}))
    mig = nv.get("nvmlDeviceGetMigMode", i, lambda: pynvml.nvmlDeviceGetMigMode(h))
    out.append(
        sample(
            m.MIG_MODE,
            NAN if mig is None else float(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE),
            labels,
        )
    )
    return out


def _round_fields(
    nv: Nvml, dev: DeviceState
) -> tuple[float, tuple[float, float], tuple[float, float]]:
    """Power (W), NVLink and PCIe (tx, rx) bytes/s: one field-values call, with fallbacks.

    A field the driver does not have (``NOT_SUPPORTED`` for it, or ``INVALID_ARGUMENT`` for an
    id older drivers do not know) is not asked for again: the power then comes from
    ``nvmlDeviceGetPowerUsage``, the PCIe rates from ``nvmlDeviceGetPcieThroughput``. When the
    whole call fails (a driver without it, or an error for the call) this round's power and
    PCIe come from those calls too; NVLink has no other source.
    """
    h, i = dev.ref.handle, dev.ref.index
    fields = [
        *((_POWER_FIELD,) if dev.power_field else ()),
        *_NVLINK_FIELDS,
        *(_PCIE_FIELDS if dev.pcie_fields else ()),
    ]
    values: Any = nv.get(
        "nvmlDeviceGetFieldValues", i, lambda: pynvml.nvmlDeviceGetFieldValues(h, fields)
    )
    entries = dict(zip(fields, values, strict=True)) if values is not None else {}

    batched = values is not None
    power = NAN
    if dev.power_field and batched:
        entry = entries[_POWER_FIELD]
        if entry.nvmlReturn == pynvml.NVML_SUCCESS:
            power = _scaled(_field_value(entry), divisor=1000)
        elif entry.nvmlReturn in _FIELD_MISSING:
            dev.power_field = False
        else:
            nv.failed("nvmlDeviceGetFieldValues", i, entry.nvmlReturn, "power")
    if not dev.power_field or not batched:
        mw = nv.get("nvmlDeviceGetPowerUsage", i, lambda: pynvml.nvmlDeviceGetPowerUsage(h))
        power = _scaled(mw, divisor=1000)

    nvlink = _counter_rates(nv, dev, [entries.get(f) for f in _NVLINK_FIELDS], "nvlink", 1024)
    pcie = (NAN, NAN)
    if dev.pcie_fields and batched:
        pcie_entries = [entries[f] for f in _PCIE_FIELDS]
        if any(e.nvmlReturn in _FIELD_MISSING for e in pcie_entries):
            dev.pcie_fields = False
        else:
            pcie = _counter_rates(nv, dev, pcie_entries, "pcie", 1)
    if not dev.pcie_fields or not batched:
        dev.pcie_prev = None  # the counters' next reading starts a new interval
        pcie = _pcie_throughput(nv, dev)
    return power, nvlink, pcie


def _field_value(entry: Any) -> float:
    return float(getattr(entry.value, _FIELD_VALUE.get(int(entry.valueType), "ullVal")))


def _pcie_throughput(nv: Nvml, dev: DeviceState) -> tuple[float, float]:
    """PCIe tx/rx bytes/s sampled by NVML over 20 ms (drivers without the counter fields)."""
    h, i = dev.ref.handle, dev.ref.index
    out: list[float] = []
    for counter, detail in (
        (pynvml.NVML_PCIE_UTIL_TX_BYTES, "tx"),
        (pynvml.NVML_PCIE_UTIL_RX_BYTES, "rx"),
    ):
        kbps = nv.get(
            "nvmlDeviceGetPcieThroughput",
            i,
            partial(pynvml.nvmlDeviceGetPcieThroughput, h, counter),
            detail,
        )
        out.append(_scaled(kbps, 1024))
    return out[0], out[1]


def _counter_rates(
    nv: Nvml, dev: DeviceState, entries: list[Any], kind: str, unit: int
) -> tuple[float, float]:
    """tx/rx bytes/s from two cumulative counters (``unit`` bytes each) between two reads.

    The previous read is kept on ``dev`` (``<kind>_prev``); a counter that went back was
    reset (a driver reload): no rate for that interval.
    """
    if any(e is None for e in entries):
        setattr(dev, f"{kind}_prev", None)
        return NAN, NAN
    for entry, detail in zip(entries, (f"{kind}_tx", f"{kind}_rx"), strict=True):
        if entry.nvmlReturn != pynvml.NVML_SUCCESS:
            nv.failed("nvmlDeviceGetFieldValues", dev.ref.index, entry.nvmlReturn, detail)
            setattr(dev, f"{kind}_prev", None)
            return NAN, NAN
    now = (
        int(entries[0].timestamp),
        int(_field_value(entries[0])),
        int(_field_value(entries[1])),
    )
    prev = getattr(dev, f"{kind}_prev")
    setattr(dev, f"{kind}_prev", now)
    if prev is None or now[0] <= prev[0]:
        return NAN, NAN
    seconds = (now[0] - prev[0]) / 1e6
    tx = NAN if now[1] < prev[1] else (now[1] - prev[1]) * unit / seconds
    rx = NAN if now[2] < prev[2] else (now[2] - prev[2]) * unit / seconds
    return tx, rx


def _processes(nv: Nvml, dev: DeviceState, out: list[Sample], procs: ProcessRows) -> set[int]:
    """Per-process memory and utilization samples; returns the pids on this GPU."""
    h, i = dev.ref.handle, dev.ref.index
    running: Any = nv.get(
        "nvmlDeviceGetComputeRunningProcesses_v3",
        i,
        lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h),
    )
    # NOT_FOUND means "no sample newer than util_seen_us": a normal answer, not an error.
    samples: Any = nv.get(
        "nvmlDeviceGetProcessUtilization",
        i,
        lambda: pynvml.nvmlDeviceGetProcessUtilization(h, dev.util_seen_us),
        expected=_NOT_FOUND,
    )
    latest: dict[int, Any] = {}
    for s in samples or ():
        if s.pid not in latest or s.timeStamp > latest[s.pid].timeStamp:
            latest[s.pid] = s
        dev.util_seen_us = max(dev.util_seen_us, int(s.timeStamp))
    if running is None:
        return set()
    rows = [(p.pid, NAN if p.usedGpuMemory is None else float(p.usedGpuMemory)) for p in running]
    rows.sort(key=lambda r: (-(0.0 if math.isnan(r[1]) else r[1]), r[0]))
    for pid, used in rows[:MAX_PROCESSES_PER_GPU]:
        util = latest.get(pid)
        sm = NAN if util is None else util.smUtil / 100
        mem = NAN if util is None else util.memUtil / 100
        labels = {"gpu": str(i), "pid": str(pid)}
        out.append(sample(m.PROCESS_MEMORY, used, labels))
        out.append(sample(m.PROCESS_SM_UTILIZATION, sm, labels))
        out.append(sample(m.PROCESS_MEMORY_UTILIZATION, mem, labels))
        procs.setdefault(pid, []).append((i, used, sm))
    return {pid for pid, _ in rows}


def _gpm(dev: DeviceState, pause_reason: str, out: list[Sample], slow_now: bool) -> None:
    labels = dev.labels
    gpm = dev.gpm
    values: dict[MetricSpec, float] | None = None
    if gpm is None or gpm.unavailable:
        paused = NAN
    elif pause_reason:
        gpm.reset()  # the next interval must not span the pause
        dev.gpm_state = f"paused ({pause_reason})"
        paused = 1.0
    else:
        values = gpm.read(slow_now)
        dev.gpm_state = "active"
        paused = 0.0
    dev.gpm_last = values
    dev.gpm_last_mono = time.monotonic()
    out.append(sample(m.PROFILING_PAUSED, paused, labels))
    for metric in m.GPM_METRICS:
        out.append(sample(metric.spec, NAN if values is None else values[metric.spec], labels))


@dataclass(frozen=True, slots=True)
class ProcGpu:
    """One process's use of the GPUs, for the process table.

    Attributes:
        pid: the process id (host pid namespace).
        gpu: index of the GPU where it holds the most memory.
        gpus: every GPU it has a context on.
        used_memory_bytes: device memory it uses, summed over its GPUs; NaN if unknown.
        sm_util_ratio: its latest SM utilization sample on ``gpu``; NaN without one.
    """

    pid: int
    gpu: int
    gpus: tuple[int, ...]
    used_memory_bytes: float
    sm_util_ratio: float


def join_processes(procs: ProcessRows) -> dict[int, ProcGpu]:
    """One `ProcGpu` per pid from its rows on each GPU (memory summed, primary GPU first)."""
    out: dict[int, ProcGpu] = {}
    for pid, rows in procs.items():
        rows = sorted(rows, key=lambda r: (-(0.0 if math.isnan(r[1]) else r[1]), r[0]))
        known = [r[1] for r in rows if not math.isnan(r[1])]
        out[pid] = ProcGpu(
            pid=pid,
            gpu=rows[0][0],
            gpus=tuple(sorted(r[0] for r in rows)),
            used_memory_bytes=float(sum(known)) if known else NAN,
            sm_util_ratio=rows[0][2],
        )
    return out


#: GPM metrics a trace's GPU track shows: (counter key, metric); GPM reports ratios.
_TRACE_GPM = (
    ("sm_active_percent", m.SM_ACTIVE),
    ("sm_occupancy_percent", m.SM_OCCUPANCY),
    ("tensor_active_percent", m.TENSOR_ACTIVE),
    ("dram_bandwidth_percent", m.DRAM_BW_UTIL),
)
#: GPM values older than this are not shown in a trace (a collection round is ~1 s).
TRACE_GPM_MAX_AGE_S = 5.0


def read_trace_counters(nv: Nvml, dev: DeviceState) -> dict[str, float]:
    """The counters of one GPU for a trace's GPU track, read now (NaN where unknown).

    Utilization, memory used, power and SM clock come from NVML at once; the GPM metrics
    are those of the collector's latest round (GPM needs an interval, and it is paused
    while a Kineto trace uses CUPTI on the GPU: then they are NaN and ``gpm_paused`` is 1).

    Raises:
        DeviceLost: the GPU is gone.
        DriverGone: NVML lost the driver.
    """
    h, i = dev.ref.handle, dev.ref.index
    util = nv.get(
        "nvmlDeviceGetUtilizationRates", i, lambda: pynvml.nvmlDeviceGetUtilizationRates(h)
    )
    mem = nv.get("nvmlDeviceGetMemoryInfo", i, lambda: pynvml.nvmlDeviceGetMemoryInfo(h))
    power = nv.get("nvmlDeviceGetPowerUsage", i, lambda: pynvml.nvmlDeviceGetPowerUsage(h))
    sm = nv.get(
        "nvmlDeviceGetClockInfo",
        i,
        partial(pynvml.nvmlDeviceGetClockInfo, h, pynvml.NVML_CLOCK_SM),
        "sm",
    )
    out = {
        "utilization_percent": _scaled(util.gpu if util else None),
        "memory_used_mib": _scaled(mem.used if mem else None, divisor=1 << 20),
        "power_watts": _scaled(power, divisor=1000),
        "sm_clock_mhz": _scaled(sm),
    }
    fresh = dev.gpm_last is not None and time.monotonic() - dev.gpm_last_mono <= TRACE_GPM_MAX_AGE_S
    for key, spec in _TRACE_GPM:
        out[key] = dev.gpm_last[spec] * 100 if fresh and dev.gpm_last else NAN
    if dev.gpm is not None and not dev.gpm.unavailable:
        out["gpm_paused"] = 1.0 if dev.gpm_state.startswith("paused") else 0.0
    return out
