"""The ``fabric`` track: the traced process's RDMA ports and NICs, and the interrupt time on
the CPUs its threads ran on, read at ``[capture] fabric_sample_hz`` while it is traced.

`FabricSampler` picks each process's devices when its recording begins
(`bpfdyno.tracing.capture.fabric_devices`), takes a reading then and every
``1 / fabric_sample_hz`` seconds on its own thread (each device read once per tick however
many processes use it), and when the recording ends turns consecutive readings into
`FabricDelta` records (what each group of counters advanced over each interval) and link
changes into `FabricEvent` records. A reading holds:

- each RDMA port's data, congestion and error counters (sysfs; the few the track needs, not
  all of them: each file read is a query to the adapter's firmware) and its state;
- each interface's byte, packet, drop and error counters (sysfs ``statistics/``), its
  driver's well-known discard, pause, PFC and out-of-buffer statistics (ethtool), its carrier;
- the CPUs the process's threads ran on since the previous reading (each thread whose
  on-CPU time moved, at the CPU it last ran on: ``/proc/PID/task/*/schedstat`` and ``stat``),
  and every CPU's softirq and interrupt-handler time from the interrupt collector's BPF
  program (`InterruptTimeSource`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Protocol

from bpfdyno.sources.counters import counter_delta
from bpfdyno.sources.fabric import nics, rdma
from bpfdyno.sources.fabric.collector import PortPlace
from bpfdyno.sources.fabric.ethtool import DriverStatsReader, Ethtool
from bpfdyno.sources.irq.collector import SOFTIRQS, CpuInterrupts
from bpfdyno.tracing.capture.fabric_devices import FabricSelection, select
from bpfdyno.tracing.capture.records import FabricDelta, FabricEvent, KernelRecord, TrackStats
from bpfdyno.tracing.capture.ticker import Ticker

log = logging.getLogger(__name__)

#: sysfs statistics/ of an interface that the track reads.
NIC_STATISTICS = (
    "tx_bytes",
    "rx_bytes",
    "tx_packets",
    "rx_packets",
    "rx_dropped",
    "tx_dropped",
    "rx_missed_errors",
    "rx_errors",
    "tx_errors",
)
#: RDMA counters the track reads, by group file.
_PORT_COUNTERS = {
    group: tuple(
        dict.fromkeys(
            [c for g, c, _, _ in rdma.DATA_COUNTERS if g == group]
            + list(rdma.CONGESTION_COUNTERS.get(group, ()))
            + list(rdma.ERROR_COUNTERS.get(group, ()))
        )
    )
    for group in rdma.GROUPS
}


class InterruptTimeSource(Protocol):
    """What the interrupt collector offers to the trace capture."""

    def cpu_interrupt_times(self) -> Mapping[int, CpuInterrupts] | None:
        """Online CPU -> its cumulative interrupt time now; None while it cannot tell."""

    def hold_for_trace(self, key: Hashable, requester: str) -> None:
        """Keep the interrupt times coming for trace ``key`` (whatever the overhead budget
        holds), at ``requester``'s cost, until `release_for_trace`."""

    def release_for_trace(self, key: Hashable) -> None:
        """Trace ``key`` needs no more interrupt times."""

    def why_no_interrupt_times(self) -> str:
        """Why `cpu_interrupt_times` answers None now, with what to do ("" when it does not)."""


@dataclass(frozen=True, slots=True)
class _DeviceReading:
    """One device at one tick: counter values by their track name, and its link."""

    values: dict[str, int]
    up: bool | None
    state: str = ""


@dataclass(slots=True)
class _Reading:
    ts_ns: int
    devices: dict[str, _DeviceReading]  # "rdma mlx5_0:1" / "nic eth2" -> reading
    cpus: frozenset[int]
    interrupts: Mapping[int, CpuInterrupts] | None


@dataclass(slots=True)
class _Traced:
    pid: int
    selection: FabricSelection
    readings: deque[_Reading]
    runtimes: dict[int, int] = field(default_factory=dict)  # tid -> on-CPU ns last seen
    cpus_seen: set[int] = field(default_factory=set)
    dropped: int = 0


def port_label(place: PortPlace) -> str:
    """``rdma mlx5_0:1``."""
    return f"rdma {place.device}:{place.port}"


class FabricSampler:
    """Reads the fabric of traced processes on a thread of its own while any is traced.

    Args:
        interrupts: the interrupt collector (None: no interrupt time in the track).
        hz: readings per second.
        max_readings: most readings kept per traced process (the oldest go first).
        root: the sysfs root's parent (``/``; a fixture tree in tests).
        proc_root: where /proc is.
        clock: CLOCK_MONOTONIC ns (the capture's clock).
    """

    def __init__(
        self,
        interrupts: InterruptTimeSource | None,
        hz: float,
        max_readings: int,
        root: Path = Path("/"),
        proc_root: Path = Path("/proc"),
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._interrupts = interrupts
        self.hz = hz
        self._max = max_readings
        self._root = root
        self._proc_root = proc_root
        self._clock = clock
        self._lock = threading.Lock()  # the traced processes
        #: One reading at a time (the thread's ticks, and the first and last of a process).
        self._reading_lock = threading.Lock()
        self._traced: dict[Hashable, _Traced] = {}
        #: The reading thread (its rounds and busy time: for status and benchmarks).
        self.ticker = Ticker("trace-fabric", 1.0 / hz, self._busy, self.read_now)
        self._ethtool: Ethtool | None = None
        self._stats: DriverStatsReader | None = None
        #: Known statistics of each interface's driver: ifname -> (names, index -> key).
        self._known: dict[str, tuple[list[str], dict[int, str]]] = {}

    def start(self) -> None:
        """Start the reading thread (it sleeps while nothing is traced)."""
        if self.ticker.running:
            return
        try:
            self._ethtool = Ethtool()
            self._stats = DriverStatsReader(self._ethtool)
        except OSError as e:
            log.warning("capture: no NIC driver statistics in the fabric track: %s", e)
        self.ticker.start()

    def stop(self) -> None:
        """Stop the thread (readings of processes still traced are kept)."""
        self.ticker.stop()
        if self._ethtool is not None:
            self._ethtool.close()
            self._ethtool = None
            self._stats = None

    def add(self, key: Hashable, pid: int, requester: str = "") -> str:
        """Record the fabric of ``pid`` from now on under ``key`` for ``requester`` (who pays
        for the interrupt programs if the overhead budget had detached them); "" or why there
        is none."""
        selection = select(pid, self._root, self._proc_root)
        traced = _Traced(pid, selection, deque(maxlen=max(2, self._max)))
        if self._interrupts is not None:
            self._interrupts.hold_for_trace(key, requester)  # before the first reading
        with self._reading_lock:
            traced.readings.append(self._reading([traced], traced))
        with self._lock:
            self._traced[key] = traced
        self.ticker.wake()
        if not selection.ports and not selection.interfaces and self._interrupts is None:
            return "no RDMA port, no network interface and no interrupt collector to read"
        return ""

    def remove(self, key: Hashable) -> tuple[list[KernelRecord], TrackStats]:
        """Stop reading for ``key``; its records and what to say about them."""
        with self._lock:
            t = self._traced.pop(key, None)
        if t is None:
            return [], TrackStats(note="not recorded")
        with self._reading_lock:  # after the thread's tick that may still hold it
            t.readings.append(self._reading([t], t))  # the end of the last interval
            records = _records(t)
        missing = ""
        if self._interrupts is not None:
            if any(r.interrupts is None for r in t.readings):
                missing = self._why_no_interrupts()
            self._interrupts.release_for_trace(key)
        notes = []
        if not t.selection.ports and not t.selection.interfaces:
            notes.append("no RDMA port or network interface to read")
        if self._interrupts is None:
            notes.append(
                "no interrupt time: the irq collector is not running (see `bpfdyno status`)"
            )
        elif missing:
            some = any(r.interrupts is not None for r in t.readings)
            what = "interrupt time missing from some readings" if some else "no interrupt time"
            notes.append(f"{what}: {missing}")
        if t.dropped:
            notes.append(f"{t.dropped} oldest reading(s) dropped over the cap")
        info = {
            "devices": [port_label(p) for p in t.selection.ports]
            + [f"nic {n}" for n in t.selection.interfaces],
            "chosen": t.selection.how,
            "sample_hz": self.hz,
            "cpus": sorted(t.cpus_seen),
        }
        deltas = sum(1 for r in records if isinstance(r, FabricDelta))
        return records, TrackStats(events=deltas, note="; ".join(notes), info=info)

    def read_now(self) -> None:
        """One reading of every traced process now, on the caller's thread (as the thread
        does at each tick; for tests and benchmarks)."""
        with self._lock:
            traced = list(self._traced.values())
        with self._reading_lock:
            self._read_all(traced)

    # -- the thread ---------------------------------------------------------------------------

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._traced)

    def _read_all(self, traced: list[_Traced]) -> None:
        shared = self._read_devices(traced)
        interrupts = self._interrupt_times()
        ts = self._clock()
        for t in traced:
            if len(t.readings) == t.readings.maxlen:
                t.dropped += 1
            t.readings.append(self._for_process(t, shared, interrupts, ts))

    def _reading(self, traced: list[_Traced], one: _Traced) -> _Reading:
        shared = self._read_devices(traced)
        interrupts = self._interrupt_times()
        return self._for_process(one, shared, interrupts, self._clock())

    def _why_no_interrupts(self) -> str:
        assert self._interrupts is not None
        try:
            return self._interrupts.why_no_interrupt_times() or (
                "the irq collector could not be read at some readings (see the agent's log)"
            )
        except Exception:  # the collector closing under us
            return "the irq collector was closing"

    def _interrupt_times(self) -> Mapping[int, CpuInterrupts] | None:
        if self._interrupts is None:
            return None
        try:
            return self._interrupts.cpu_interrupt_times()
        except Exception:  # the collector closing under us
            log.debug("capture: interrupt times unavailable", exc_info=True)
            return None

    def _for_process(
        self,
        t: _Traced,
        shared: dict[str, _DeviceReading],
        interrupts: Mapping[int, CpuInterrupts] | None,
        ts: int,
    ) -> _Reading:
        wanted = [port_label(p) for p in t.selection.ports] + [
            f"nic {n}" for n in t.selection.interfaces
        ]
        first = not t.readings
        cpus = self._thread_cpus(t)
        if first:  # every thread "moved" since nothing: only the runtimes count now
            cpus = set()
        t.cpus_seen |= cpus
        mine = {k: shared[k] for k in wanted if k in shared}
        return _Reading(ts, mine, frozenset(cpus), interrupts)

    def _read_devices(self, traced: Iterable[_Traced]) -> dict[str, _DeviceReading]:
        ports: dict[str, PortPlace] = {}
        ifnames: set[str] = set()
        for t in traced:
            ports.update((port_label(p), p) for p in t.selection.ports)
            ifnames.update(t.selection.interfaces)
        out: dict[str, _DeviceReading] = {}
        for label, place in ports.items():
            reading = self._read_port(place)
            if reading is not None:
                out[label] = reading
        for ifname in ifnames:
            reading = self._read_nic(ifname)
            if reading is not None:
                out[f"nic {ifname}"] = reading
        return out

    def _read_port(self, place: PortPlace) -> _DeviceReading | None:
        try:
            status = rdma.read_port_status(self._root, place.device, place.port)
            counters = rdma.read_port_counters(
                self._root,
                place.device,
                place.port,
                _PORT_COUNTERS["counters"],
                _PORT_COUNTERS["hw_counters"],
            )
        except rdma.DeviceGone:
            return None
        values = {f"counters/{k}": v for k, v in counters.counters.items()}
        values |= {f"hw_counters/{k}": v for k, v in counters.hw_counters.items()}
        return _DeviceReading(values, status.active if status.state else None, status.state_name)

    def _read_nic(self, ifname: str) -> _DeviceReading | None:
        link = nics.read_link(self._root, ifname)
        if link is None:
            return None
        values = nics.read_statistics(self._root, ifname, NIC_STATISTICS)
        values |= self._known_stats(ifname)
        up = None if link.carrier is None else bool(link.carrier)
        return _DeviceReading(values, up, link.operstate)

    def _known_stats(self, ifname: str) -> dict[str, int]:
        """The interface's well-known driver statistics, keyed as the track names them."""
        if self._stats is None or self._ethtool is None:
            return {}
        try:
            got = self._stats.read(ifname)
            if got is None:
                return {}
            names, values = got
            cached = self._known.get(ifname)
            if cached is None or cached[0] is not names:
                driver = self._ethtool.driver_info(ifname).driver
                keys = {
                    i: k.kind
                    + (f"_{k.direction}" if k.kind != "out_of_buffer" else "")
                    + (f"_prio{k.priority}" if k.priority else "")
                    for i, k in nics.well_known(driver, names)
                }
                cached = self._known[ifname] = (names, keys)
        except OSError:
            return {}
        return {key: values[i] for i, key in cached[1].items()}

    def _thread_cpus(self, t: _Traced) -> set[int]:
        """The CPUs where threads of ``t`` ran since the previous reading (their last CPU)."""
        task_dir = self._proc_root / str(t.pid) / "task"
        try:
            tids = os.listdir(task_dir)
        except OSError:
            return set()
        cpus = set()
        runtimes = {}
        for tid in tids:
            try:
                runtime = int((task_dir / tid / "schedstat").read_text().split()[0])
                stat = (task_dir / tid / "stat").read_text()
            except (OSError, ValueError, IndexError):
                continue  # exited meanwhile
            runtimes[int(tid)] = runtime
            if runtime != t.runtimes.get(int(tid), 0):
                fields = stat.rpartition(")")[2].split()
                if len(fields) > 36 and fields[36].isdigit():  # field 39, "processor"
                    cpus.add(int(fields[36]))
        t.runtimes = runtimes
        return cpus


def _records(t: _Traced) -> list[KernelRecord]:
    """Deltas of each device's groups between consecutive readings, and link changes.

    A counter missing from one reading (its file could not be read then) is counted from its
    last value: the interval without it shows 0, the next one what it advanced since.
    """
    deltas: list[FabricDelta] = []
    events: list[KernelRecord] = []
    last: dict[str, dict[str, int]] = {}  # device -> counter -> its last value read
    if t.readings:
        last = {d: dict(r.values) for d, r in t.readings[0].devices.items()}
    for a, b in pairwise(t.readings):
        for device, after in b.devices.items():
            before = a.devices.get(device)
            known = last.get(device)
            if before is None or known is None:
                last[device] = dict(after.values)
                continue  # back after a reading without it: deltas from the next one
            for group, values in _groups(device, known, after.values).items():
                deltas.append(FabricDelta(a.ts_ns, b.ts_ns, device, group, values))
            known.update(after.values)
            event = _link_event(device, before, after, b.ts_ns)
            if event is not None:
                events.append(event)
        if a.interrupts is not None and b.interrupts is not None and b.cpus:
            values = _interrupt_time(a.interrupts, b.interrupts, b.cpus)
            deltas.append(FabricDelta(a.ts_ns, b.ts_ns, "cpu", "interrupt time", values))
    return [*_same_keys(deltas), *events]


def _groups(
    device: str, before: dict[str, int], after: dict[str, int]
) -> dict[str, dict[str, int]]:
    """The advance of a device's counters between two readings, by the track's groups."""
    advanced = {}
    for key, value in after.items():
        old = before.get(key)
        delta = counter_delta(old, value) if old is not None else None
        advanced[key] = delta if delta is not None else 0
    out: dict[str, dict[str, int]] = defaultdict(dict)
    if device.startswith("rdma "):
        for group, counter, direction, kind in rdma.DATA_COUNTERS:
            key = f"{group}/{counter}"
            if key in advanced:
                scale = rdma.DATA_WORD_BYTES if kind == "bytes" else 1
                out[kind][direction] = advanced[key] * scale
        for target, sets in (
            ("congestion", rdma.CONGESTION_COUNTERS),
            ("errors", rdma.ERROR_COUNTERS),
        ):
            for group, names in sets.items():
                for name in names:
                    if f"{group}/{name}" in advanced:
                        out[target][name] = advanced[f"{group}/{name}"]
        return dict(out)
    for key, value in advanced.items():
        if key in ("tx_bytes", "rx_bytes"):
            out["bytes"][key[:2]] = value
        elif key in ("tx_packets", "rx_packets"):
            out["packets"][key[:2]] = value
        elif key in ("rx_errors", "tx_errors"):
            out["errors"][key] = value
        elif key.startswith(("pause_", "pfc_")):
            out["pause"][key] = value
        else:  # rx_dropped, tx_dropped, rx_missed_errors, discards_*, out_of_buffer
            out["drops"][key] = value
    return dict(out)


def _interrupt_time(
    before: Mapping[int, CpuInterrupts], after: Mapping[int, CpuInterrupts], cpus: Iterable[int]
) -> dict[str, int]:
    """Softirq time by softirq and handler time, summed over ``cpus`` (ns)."""
    out = dict.fromkeys([*SOFTIRQS, "hardirq"], 0)
    for cpu in cpus:
        a, b = before.get(cpu), after.get(cpu)
        if a is None or b is None:
            continue
        for name, x, y in zip(SOFTIRQS, a.softirq_ns, b.softirq_ns, strict=True):
            out[name] += max(0, y - x)
        out["hardirq"] += max(0, b.hardirq_ns - a.hardirq_ns)
    return out


def _same_keys(deltas: list[FabricDelta]) -> list[FabricDelta]:
    """Every delta of a (device, group) with the same keys (0 for a missing one), so each
    counter series has a point at every interval; interrupt time without softirqs that never
    ran."""
    keys: dict[tuple[str, str], set[str]] = defaultdict(set)
    for d in deltas:
        keys[(d.device, d.group)].update(k for k, v in d.values.items() if v or d.device != "cpu")
    for (device, _), names in keys.items():
        if device == "cpu":
            names.add("hardirq")
    return [
        FabricDelta(
            d.start_ns,
            d.end_ns,
            d.device,
            d.group,
            {k: d.values.get(k, 0) for k in sorted(keys[(d.device, d.group)])},
        )
        for d in deltas
    ]


def _link_event(
    device: str, before: _DeviceReading, after: _DeviceReading, ts_ns: int
) -> FabricEvent | None:
    if before.up is None or after.up is None or before.up == after.up:
        return None
    rdma_port = device.startswith("rdma ")
    if rdma_port:
        kind = "rdma_link_up" if after.up else "rdma_link_down"
    else:
        kind = "nic_carrier_up" if after.up else "nic_carrier_down"
    return FabricEvent(ts_ns, kind, {"device": device.split(" ", 1)[1], "state": after.state})
