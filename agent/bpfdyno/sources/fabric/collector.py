"""The fabric GPU clusters use: RDMA ports (InfiniBand, RoCE) and NIC driver statistics.

Every collection:

- **RDMA** (`bpfdyno.sources.fabric.rdma`): each device in ``/sys/class/infiniband`` and each
  of its ports: state, physical state, rate and width, link layer, netdev, PCI address, NUMA
  node and closest GPUs (`bpfdyno.sources.fabric.pci`, worked out once per device), and
  every counter the port offers, as totals and as rates with their units (data counters in
  bytes). A port that leaves ACTIVE, or whose ``link_downed`` counter moved, is an
  ``rdma_link_down`` event (``rdma_link_up`` when it is back), handed to ``sink``.
- **NICs** (`bpfdyno.sources.fabric.nics`, `bpfdyno.sources.fabric.ethtool`): each
  interface matching ``[fabric] nic_interfaces`` (loopback aside): carrier, carrier changes,
  speed, duplex, and the driver's own statistics with the well-known ones (discards, pause
  and PFC frames, out-of-buffer drops) as rates. A carrier lost is a ``nic_carrier_down``
  event (``nic_carrier_up`` when back).

A counter that moved backwards was wrapped or reset (`bpfdyno.sources.counters`); a device,
port or interface seen for the first time has rates from its second reading; one that
disappears is no longer reported (and logged once). A machine without RDMA devices is
normal: the collector says what it found.
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.core.config import FabricSection
from bpfdyno.core.events import EventSink, KernelEvent
from bpfdyno.core.metrics import Labels, Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.counters import counter_delta
from bpfdyno.sources.fabric import nics, rdma
from bpfdyno.sources.fabric.ethtool import DriverInfo, DriverStatsReader, Ethtool
from bpfdyno.sources.fabric.metrics import (
    COUNTER_RATE,
    COUNTER_TOTAL,
    NIC_CARRIER,
    NIC_CARRIER_CHANGES,
    NIC_DISCARDS,
    NIC_DRIVER_STAT,
    NIC_DUPLEX,
    NIC_INFO,
    NIC_OUT_OF_BUFFER,
    NIC_PAUSE,
    NIC_PFC,
    NIC_SPEED,
    NIC_STATS_OMITTED,
    PORT_ACTIVE,
    PORT_BYTES,
    PORT_ERRORS,
    PORT_INFO,
    PORT_PACKETS,
    PORT_PHYS_STATE,
    PORT_RATE,
    PORT_STATE,
    PORT_WIDTH,
    RDMA_DEVICES,
    UNREADABLE,
)
from bpfdyno.sources.fabric.nics import KnownStat, NicLink
from bpfdyno.sources.fabric.pci import closest_gpus, list_gpus
from bpfdyno.sources.fabric.rdma import PortCounters, PortStatus, RdmaDevice

log = logging.getLogger(__name__)


_KNOWN_SPEC = {
    "discards": NIC_DISCARDS,
    "pause": NIC_PAUSE,
    "pfc": NIC_PFC,
    "out_of_buffer": NIC_OUT_OF_BUFFER,
}


@dataclass(frozen=True, slots=True)
class PortPlace:
    """Where an RDMA port sits: what `rdma_port_info` says of it."""

    device: str
    port: int
    link_layer: str
    netdev: str
    pci: str
    numa_node: int | None
    gpus: tuple[int, ...]
    gpu_link: str

    def describe(self) -> str:
        gpus = f", GPUs {','.join(map(str, self.gpus))} {self.gpu_link}" if self.gpus else ""
        netdev = f" ({self.netdev})" if self.netdev else ""
        return f"{self.device}:{self.port}{netdev} {self.link_layer}{gpus}"


def port_places(root: Path, devices: Sequence[RdmaDevice]) -> list[PortPlace]:
    """Every port of ``devices`` with its netdev, PCI address, NUMA node and closest GPUs."""
    gpus = list_gpus(root)
    out = []
    for device in devices:
        near, level = closest_gpus(device.pci, gpus) if device.pci else ((), "")
        for port in device.ports:
            status = _link_layer(root, device.name, port)
            out.append(
                PortPlace(
                    device.name,
                    port,
                    status,
                    rdma.port_netdev(root, device, port),
                    device.pci.address if device.pci else "",
                    device.pci.numa_node if device.pci else None,
                    near,
                    level,
                )
            )
    return out


def _link_layer(root: Path, device: str, port: int) -> str:
    try:
        return rdma.read_port_status(root, device, port).link_layer
    except rdma.DeviceGone:
        return "Unknown"


@dataclass(slots=True)
class _Port:
    place: PortPlace
    t: float
    status: PortStatus
    counters: PortCounters


@dataclass(slots=True)
class _Nic:
    info: DriverInfo | None
    names: list[str] = field(default_factory=list)
    known: list[tuple[int, KnownStat]] = field(default_factory=list)
    values: list[int] | None = None
    t: float = 0.0
    link: NicLink | None = None


class FabricCollector(Collector):
    """RDMA ports from sysfs and NIC driver statistics from ethtool, every interval.

    Args:
        sink: receives link-down and link-up events (e.g. ``FlightRecorder.add``).
        root: directory holding ``sys/`` and ``proc/`` (a fixture tree in tests).
        nic_interfaces: shell patterns of the interfaces to report (``[fabric]``).
        nic_queue_stats: also export per-queue driver statistics.
        max_stats_per_interface: most driver statistics exported per interface.
        ethtool: read driver statistics (False: sysfs only, e.g. for a fixture root, whose
            interfaces are not the kernel's).
        clock: monotonic seconds.
    """

    name = "fabric"
    #: Reading an RDMA counter is a firmware query behind sysfs; a hung adapter must delay
    #: only this collector.
    may_block = True

    def __init__(
        self,
        sink: EventSink | None = None,
        *,
        root: Path = Path("/"),
        nic_interfaces: Sequence[str] = ("*",),
        nic_queue_stats: bool = FabricSection.nic_queue_stats,
        max_stats_per_interface: int = FabricSection.max_stats_per_interface,
        ethtool: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._sink = sink
        self._root = root
        self._patterns = tuple(nic_interfaces)
        self._queue_stats = nic_queue_stats
        self._max_stats = max_stats_per_interface
        self._use_ethtool = ethtool
        self._clock = clock
        self._ethtool: Ethtool | None = None
        self._stats: DriverStatsReader | None = None
        self._ports: dict[tuple[str, int], _Port] = {}
        self._places: dict[str, list[PortPlace]] = {}  # by device, worked out once
        self._nics: dict[str, _Nic] = {}
        self._noted: set[str] = set()  # problems logged once
        self._labels: dict[tuple[str, int, str, str], Labels] = {}
        self._rdma_summary = ""
        self._nic_summary = ""

    @classmethod
    def from_config(
        cls, section: FabricSection, *, sink: EventSink | None = None
    ) -> FabricCollector:
        """Build the collector from the ``[fabric]`` config section."""
        return cls(
            sink,
            nic_interfaces=section.nic_interfaces,
            nic_queue_stats=section.nic_queue_stats,
            max_stats_per_interface=section.max_stats_per_interface,
        )

    def start(self) -> None:
        """Open the ethtool socket and take the first readings.

        Raises:
            CollectorUnavailable: sysfs is not there (no ``sys/class/net`` under the root).
        """
        if not nics.net_dir(self._root).is_dir():
            raise CollectorUnavailable(
                f"fabric metrics need sysfs: {nics.net_dir(self._root)} is missing (mount it "
                f"with 'mount -t sysfs sysfs {self._root / 'sys'}')"
            )
        if self._use_ethtool:
            try:
                self._ethtool = Ethtool()
                self._stats = DriverStatsReader(self._ethtool)
            except OSError as e:
                log.warning("NIC driver statistics unavailable: no socket for ethtool (%s)", e)
        self.collect()

    def close(self) -> None:
        """Close the ethtool socket (idempotent)."""
        if self._ethtool is not None:
            self._ethtool.close()
            self._ethtool = None
            self._stats = None

    def collect(self) -> Sequence[Sample]:
        """One reading of every RDMA port and interface; rates from the previous one."""
        events: list[KernelEvent] = []
        out = self._collect_rdma(events)
        out += self._collect_nics(events)
        if events and self._sink is not None:
            try:
                self._sink(events)
            except Exception:  # the sink's failure must not cost this interval's metrics
                log.exception("the kernel event sink failed; %d events lost", len(events))
        return out

    def health(self) -> tuple[PartState, str] | None:
        """Always ok (no RDMA device is a machine without any): what was found."""
        return PartState.OK, f"{self._rdma_summary}; {self._nic_summary}"

    # --- RDMA ----------------------------------------------------------------------------

    def _collect_rdma(self, events: list[KernelEvent]) -> list[Sample]:
        names = rdma.list_devices(self._root)
        out = [sample(RDMA_DEVICES, len(names))]
        seen: set[tuple[str, int]] = set()
        for name in names:
            try:
                places = self._device_places(name)
                for place in places:
                    key = (place.device, place.port)
                    out += self._collect_port(place, events)
                    seen.add(key)
            except rdma.DeviceGone as e:
                self._note(f"gone:{name}", str(e))
                self._places.pop(name, None)
        for key in [k for k in self._ports if k not in seen]:
            log.info("RDMA device %s port %d is gone", *key)
            del self._ports[key]
        for name in [n for n in self._places if n not in names]:
            del self._places[name]
        described = "; ".join(
            f"{p.place.describe()} {p.status.state_name or '?'}"
            + (f" {p.status.rate_bps / 1e9:g} Gb/s" if p.status.rate_bps else "")
            for p in self._ports.values()
        )
        self._rdma_summary = (
            f"{len(names)} RDMA device(s): {described}"
            if names
            else "no RDMA devices (/sys/class/infiniband is empty or absent)"
        )
        return out

    def _device_places(self, name: str) -> list[PortPlace]:
        places = self._places.get(name)
        if places is None:
            places = self._places[name] = port_places(
                self._root, [rdma.read_device(self._root, name)]
            )
        return places

    def _collect_port(self, place: PortPlace, events: list[KernelEvent]) -> list[Sample]:
        status = rdma.read_port_status(self._root, place.device, place.port)
        t = self._clock()
        counters = rdma.read_port_counters(self._root, place.device, place.port)
        key = (place.device, place.port)
        prev = self._ports.get(key)
        self._ports[key] = _Port(place, t, status, counters)
        labels = {"device": place.device, "port": str(place.port)}
        out = [
            sample(
                PORT_INFO,
                1,
                labels
                | {
                    "link_layer": place.link_layer,
                    "netdev": place.netdev,
                    "pci": place.pci,
                    "numa_node": "" if place.numa_node is None else str(place.numa_node),
                    "gpus": ",".join(map(str, place.gpus)),
                    "gpu_link": place.gpu_link,
                },
            ),
            sample(UNREADABLE, len(counters.unreadable), labels),
        ]
        if counters.unreadable:
            self._note(
                f"unreadable:{place.device}:{place.port}:{','.join(counters.unreadable)}",
                f"RDMA device {place.device} port {place.port}: cannot read "
                f"{', '.join(counters.unreadable)} (left out)",
            )
        if status.state:
            out.append(sample(PORT_STATE, status.state, labels))
            out.append(sample(PORT_ACTIVE, 1 if status.active else 0, labels))
        if status.phys_state:
            out.append(sample(PORT_PHYS_STATE, status.phys_state, labels))
        if status.rate_bps is not None:
            out.append(sample(PORT_RATE, status.rate_bps, labels))
        if status.width is not None:
            out.append(sample(PORT_WIDTH, status.width, labels))
        for group, values in (
            ("counters", counters.counters),
            ("hw_counters", counters.hw_counters),
        ):
            for counter, value in values.items():
                out.append(
                    Sample(COUNTER_TOTAL, value, self._counter_labels(place, group, counter))
                )
        if prev is None or t <= prev.t:
            return out
        dt = t - prev.t
        deltas = {
            group: port_deltas(getattr(prev.counters, group), getattr(counters, group))
            for group in rdma.GROUPS
        }
        for group, by_name in deltas.items():
            for counter, delta in by_name.items():
                labels_of = self._counter_labels(place, group, counter)
                out.append(Sample(COUNTER_RATE, delta / dt, labels_of))
        for group, counter, direction, kind in rdma.DATA_COUNTERS:
            advanced = deltas[group].get(counter)
            if advanced is None:
                continue
            spec = PORT_BYTES if kind == "bytes" else PORT_PACKETS
            scale = rdma.DATA_WORD_BYTES if kind == "bytes" else 1
            out.append(sample(spec, advanced * scale / dt, labels | {"direction": direction}))
        errors = [
            deltas[group][c]
            for group, names in rdma.ERROR_COUNTERS.items()
            for c in names
            if c in deltas[group]
        ]
        if errors:
            out.append(sample(PORT_ERRORS, sum(errors) / dt, labels))
        events += _port_events(place, prev.status, status, deltas["counters"].get("link_downed", 0))
        return out

    def _counter_labels(self, place: PortPlace, group: str, counter: str) -> Labels:
        """The labels of a counter's series, built once (a node with 8 adapters has
        hundreds of counters, every collection)."""
        key = (place.device, place.port, group, counter)
        labels = self._labels.get(key)
        if labels is None:
            if len(self._labels) >= 65536:
                self._labels.clear()  # a bound against devices and counters churning
            labels = self._labels[key] = (
                ("device", place.device),
                ("port", str(place.port)),
                ("group", group),
                ("counter", counter),
            )
        return labels

    # --- NICs ----------------------------------------------------------------------------

    def _collect_nics(self, events: list[KernelEvent]) -> list[Sample]:
        out: list[Sample] = []
        names = [
            n
            for n in nics.list_interfaces(self._root)
            if n != "lo" and any(fnmatch.fnmatchcase(n, p) for p in self._patterns)
        ]
        for ifname in [n for n in self._nics if n not in names]:
            del self._nics[ifname]
            if self._stats is not None:
                self._stats.forget(ifname)
        for ifname in names:
            link = nics.read_link(self._root, ifname)
            if link is None:
                self._nics.pop(ifname, None)
                continue  # gone between the listing and the read
            nic = self._nics.get(ifname)
            if nic is None:
                nic = self._nics[ifname] = _Nic(self._driver_info(ifname))
            labels = {"interface": ifname}
            if nic.info is not None:
                out.append(
                    sample(
                        NIC_INFO, 1, labels | {"driver": nic.info.driver, "bus": nic.info.bus_info}
                    )
                )
            if link.carrier is not None:
                out.append(sample(NIC_CARRIER, link.carrier, labels))
            if link.carrier_changes is not None:
                out.append(sample(NIC_CARRIER_CHANGES, link.carrier_changes, labels))
            if link.speed_bps is not None:
                out.append(sample(NIC_SPEED, link.speed_bps, labels))
            if link.full_duplex is not None:
                out.append(sample(NIC_DUPLEX, link.full_duplex, labels))
            before, nic.link = nic.link, link
            event = _carrier_event(ifname, before, link)
            if event is not None:
                events.append(event)
            out += self._driver_stats(ifname, nic, labels)
        with_stats = sorted(n for n, nic in self._nics.items() if nic.values is not None)
        self._nic_summary = f"{len(names)} interface(s)" + (
            f", driver statistics of {', '.join(with_stats)}" if with_stats else ""
        )
        return out

    def _driver_info(self, ifname: str) -> DriverInfo | None:
        if self._ethtool is None:
            return None
        try:
            return self._ethtool.driver_info(ifname)
        except OSError:
            return None  # loopback-like devices answer no ethtool request

    def _driver_stats(self, ifname: str, nic: _Nic, labels: dict[str, str]) -> list[Sample]:
        if self._stats is None:
            return []
        values = self._read_driver_stats(ifname, nic)
        t = self._clock()
        if values is None:
            nic.values = None
            return []
        prev, prev_t = nic.values, nic.t
        nic.values, nic.t = values, t
        out: list[Sample] = []
        exported = 0
        for name, value in zip(nic.names, values, strict=True):
            if (not self._queue_stats and nics.is_queue_stat(name)) or exported >= self._max_stats:
                continue
            exported += 1
            out.append(sample(NIC_DRIVER_STAT, value, labels | {"statistic": name}))
        out.append(sample(NIC_STATS_OMITTED, len(values) - exported, labels))
        if prev is None or len(prev) != len(values) or t <= prev_t:
            return out
        dt = t - prev_t
        for index, known in nic.known:
            delta = counter_delta(prev[index], values[index])
            if delta is None:
                continue
            spec = _KNOWN_SPEC[known.kind]
            extra = {"direction": known.direction} if spec is not NIC_OUT_OF_BUFFER else {}
            if known.priority:
                extra["priority"] = known.priority
            out.append(sample(spec, delta / dt, labels | extra))
        return out

    def _read_driver_stats(self, ifname: str, nic: _Nic) -> list[int] | None:
        """The driver's values now (its names in ``nic``); None if it has none."""
        assert self._stats is not None
        try:
            got = self._stats.read(ifname)
        except OSError as e:
            self._note(f"ethtool:{ifname}:{e.errno}", f"driver statistics of {ifname}: {e}")
            return None
        if got is None:
            return None
        names, values = got
        if names is not nic.names:  # first read, or the driver's statistics changed
            nic.names = names
            nic.known = list(nics.well_known(nic.info.driver if nic.info else "", names))
            nic.values = None
        return values

    def _note(self, key: str, message: str) -> None:
        if key not in self._noted:
            if len(self._noted) > 4096:
                self._noted.clear()  # a bound against names churning
            self._noted.add(key)
            log.warning("%s", message)


def port_deltas(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Counter name -> how much it advanced, for counters in both readings and not reset."""
    out = {}
    for name, value in after.items():
        old = before.get(name)
        if old is None:
            continue
        delta = counter_delta(old, value)
        if delta is not None:
            out[name] = delta
    return out


def _carrier_event(ifname: str, before: NicLink | None, now: NicLink) -> KernelEvent | None:
    """``nic_carrier_down`` / ``nic_carrier_up`` when the carrier changed between readings."""
    if before is None or before.carrier is None or now.carrier is None:
        return None
    if before.carrier == now.carrier:
        return None
    attrs: dict[str, int | float | str] = {"interface": ifname, "operstate": now.operstate}
    if now.carrier_changes is not None:
        attrs["carrier_changes"] = now.carrier_changes
    kind = "nic_carrier_up" if now.carrier else "nic_carrier_down"
    return KernelEvent(time.time_ns(), kind, 0, 0, "", attrs)


def _port_events(
    place: PortPlace, before: PortStatus, now: PortStatus, link_downed: int
) -> list[KernelEvent]:
    """``rdma_link_down`` when the port left ACTIVE, or went down and came back between two
    readings (its ``link_downed`` counter moved: ``recovered`` 1); ``rdma_link_up`` when it is
    ACTIVE again."""
    attrs: dict[str, int | float | str] = {
        "device": place.device,
        "port": place.port,
        "state": now.state_name,
        "phys_state": now.phys_state_name,
        "link_layer": place.link_layer,
        "link_downed": link_downed,
    }
    if before.active and not now.active:
        kind = "rdma_link_down"
    elif not before.active and now.active:
        kind = "rdma_link_up"
    elif link_downed > 0:
        kind = "rdma_link_down"
        attrs["recovered"] = 1
    else:
        return []
    if place.netdev:
        attrs["netdev"] = place.netdev
    return [KernelEvent(time.time_ns(), kind, 0, 0, "", attrs)]
