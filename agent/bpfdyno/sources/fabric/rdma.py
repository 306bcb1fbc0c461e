"""RDMA devices and their ports from sysfs (``/sys/class/infiniband``), over any root.

The layout, as the kernel's RDMA core creates it (drivers/infiniband/core/sysfs.c)::

    class/infiniband/<dev>/device            -> the PCI function (numa_node below it)
    class/infiniband/<dev>/ports/<n>/state       "4: ACTIVE"
                                     phys_state  "5: LinkUp"
                                     rate        "200 Gb/sec (4X HDR)"
                                     link_layer  "InfiniBand" | "Ethernet" (RoCE)
                                     gid_attrs/ndevs/0   the RoCE port's netdev
                                     counters/<name>     the PMA counters (IB spec)
                                     hw_counters/<name>  the driver's (mlx5: q and
                                                         congestion counters), + lifespan

Counters are read one file each and kept as the device reports them: ``port_xmit_data`` and
``port_rcv_data`` count 4-byte words (`DATA_WORD_BYTES`). A counter the device lacks has no
file and stays absent; one whose read fails (a PMA query the firmware refused: EINVAL/EIO
on current kernels, "N/A (no PMA)" on older ones) is listed as unreadable, never read as 0.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.sources.fabric.pci import PciDevice, pci_device
from bpfdyno.sources.fabric.sysfs import read_attr, read_raw

#: port_xmit_data / port_rcv_data count octets divided by 4.
DATA_WORD_BYTES = 4
#: Files of hw_counters/ that are not counters.
HW_COUNTER_SETTINGS = frozenset({"lifespan"})
#: IB port states (the number before the colon of ``state``).
STATE_ACTIVE = 4

#: The groups of counter files of a port.
GROUPS = ("counters", "hw_counters")
#: Counters of the data moved: (group, name, direction, kind), kind "bytes" (4-byte words
#: times `DATA_WORD_BYTES`) or "packets".
DATA_COUNTERS = (
    ("counters", "port_xmit_data", "tx", "bytes"),
    ("counters", "port_rcv_data", "rx", "bytes"),
    ("counters", "port_xmit_packets", "tx", "packets"),
    ("counters", "port_rcv_packets", "rx", "packets"),
)
#: Error counters, summed into rdma_port_errors_per_second: the InfiniBand PMA's link and
#: port errors, and the mlx5 driver's transport errors and drops (missing ones are skipped).
ERROR_COUNTERS: dict[str, tuple[str, ...]] = {
    "counters": (
        "symbol_error",
        "link_error_recovery",
        "link_downed",
        "port_rcv_errors",
        "port_rcv_remote_physical_errors",
        "port_rcv_switch_relay_errors",
        "port_xmit_discards",
        "port_xmit_constraint_errors",
        "port_rcv_constraint_errors",
        "local_link_integrity_errors",
        "excessive_buffer_overrun_errors",
        "VL15_dropped",
    ),
    "hw_counters": (
        "out_of_buffer",
        "out_of_sequence",
        "duplicate_request",
        "rnr_nak_retry_err",
        "packet_seq_err",
        "implied_nak_seq_err",
        "local_ack_timeout_err",
        "resp_local_length_error",
        "resp_cqe_error",
        "req_cqe_error",
        "req_remote_invalid_request",
        "req_remote_access_errors",
        "resp_remote_access_errors",
    ),
}
#: Congestion counters: port_xmit_wait (ticks with data to send but no credit) and RoCE
#: congestion control (CNPs sent as notification point, handled as reaction point, ECN marks).
CONGESTION_COUNTERS: dict[str, tuple[str, ...]] = {
    "counters": ("port_xmit_wait",),
    "hw_counters": (
        "np_cnp_sent",
        "rp_cnp_handled",
        "rp_cnp_ignored",
        "np_ecn_marked_roce_packets",
    ),
}

_RATE = re.compile(r"^(\d+(?:\.\d+)?) Gb/sec \((\d+)X ?([A-Za-z0-9]*)\)")


def class_dir(root: Path) -> Path:
    """``<root>/sys/class/infiniband``."""
    return root / "sys" / "class" / "infiniband"


@dataclass(frozen=True, slots=True)
class PortStatus:
    """A port's link as the device reports it now.

    Attributes:
        state, state_name: the IB port state (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE,
            5 ACTIVE_DEFER); 0 and "" when unreadable.
        phys_state, phys_state_name: the physical state (2 Polling, 3 Disabled, 5 LinkUp,
            6 LinkErrorRecovery, ...).
        rate_bps: the active rate in bits/s (None when unreadable).
        width: active lanes (1, 2, 4, 8, 12); speed: "HDR", "NDR", ... ("" for old SDR text).
        link_layer: "InfiniBand", "Ethernet" (RoCE) or "Unknown".
    """

    state: int
    state_name: str
    phys_state: int
    phys_state_name: str
    rate_bps: float | None
    width: int | None
    speed: str
    link_layer: str

    @property
    def active(self) -> bool:
        """The port carries traffic (state ACTIVE)."""
        return self.state == STATE_ACTIVE


@dataclass(frozen=True, slots=True)
class PortCounters:
    """One reading of a port's counters.

    Attributes:
        counters: ``counters/`` name -> value (as the device reports it).
        hw_counters: ``hw_counters/`` name -> value.
        unreadable: files present whose read failed (``counters/x``, ``hw_counters/y``).
    """

    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    """An RDMA device (a host channel adapter) and where it sits.

    Attributes:
        name: ``mlx5_0``.
        ports: its port numbers.
        pci: the PCI function behind it (None for a software device such as rxe).
    """

    name: str
    ports: tuple[int, ...]
    pci: PciDevice | None


class DeviceGone(Exception):
    """The device (or port) disappeared while it was read (hot unplug, driver unload)."""


def list_devices(root: Path = Path("/")) -> list[str]:
    """The RDMA devices' names, sorted; [] when there are none (no class directory)."""
    try:
        return sorted(os.listdir(class_dir(root)))
    except OSError:
        return []


def read_device(root: Path, name: str) -> RdmaDevice:
    """A device's ports and PCI function.

    Raises:
        DeviceGone: its directory is gone.
    """
    base = class_dir(root) / name
    try:
        ports = tuple(sorted(int(p) for p in os.listdir(base / "ports") if p.isdigit()))
    except FileNotFoundError as e:
        raise DeviceGone(f"RDMA device {name} disappeared") from e
    except OSError as e:
        raise DeviceGone(f"RDMA device {name}: cannot list its ports ({e.strerror})") from e
    return RdmaDevice(name, ports, pci_device(base / "device"))


def _numbered(text: str | None) -> tuple[int, str]:
    """``"4: ACTIVE"`` -> (4, "ACTIVE"); (0, "") when unreadable or malformed."""
    if text is None:
        return 0, ""
    number, _, name = text.partition(":")
    try:
        return int(number), name.strip()
    except ValueError:
        return 0, ""


def parse_rate(text: str | None) -> tuple[float | None, int | None, str]:
    """``"200 Gb/sec (4X HDR)"`` -> (200e9, 4, "HDR"); Nones when it does not parse."""
    m = _RATE.match(text or "")
    if m is None:
        return None, None, ""
    return float(m.group(1)) * 1e9, int(m.group(2)), m.group(3)


def read_port_status(root: Path, device: str, port: int) -> PortStatus:
    """The port's state, physical state, rate and link layer.

    Raises:
        DeviceGone: the port's directory is gone.
    """
    base = class_dir(root) / device / "ports" / str(port)
    if not base.is_dir():
        raise DeviceGone(f"RDMA device {device} port {port} disappeared")
    state, state_name = _numbered(read_attr(base / "state"))
    phys, phys_name = _numbered(read_attr(base / "phys_state"))
    rate, width, speed = parse_rate(read_attr(base / "rate"))
    return PortStatus(
        state,
        state_name,
        phys,
        phys_name,
        rate,
        width,
        speed,
        read_attr(base / "link_layer") or "Unknown",
    )


def read_port_counters(
    root: Path,
    device: str,
    port: int,
    counters: Collection[str] | None = None,
    hw_counters: Collection[str] | None = None,
) -> PortCounters:
    """Read the port's counters (every one, or only those named).

    Args:
        root: the sysfs root's parent.
        device, port: the port.
        counters: names in ``counters/`` to read (None: all there are).
        hw_counters: names in ``hw_counters/`` to read (None: all there are).

    Raises:
        DeviceGone: the port's directory is gone.
    """
    base = class_dir(root) / device / "ports" / str(port)
    if not base.is_dir():
        raise DeviceGone(f"RDMA device {device} port {port} disappeared")
    unreadable: list[str] = []
    values = {}
    for group, names in (("counters", counters), ("hw_counters", hw_counters)):
        values[group] = _read_group(base / group, group, names, unreadable)
    return PortCounters(values["counters"], values["hw_counters"], tuple(unreadable))


def _read_group(
    directory: Path, group: str, names: Collection[str] | None, unreadable: list[str]
) -> dict[str, int]:
    folder = str(directory)
    if names is None:
        try:
            names = sorted(n for n in os.listdir(folder) if n not in HW_COUNTER_SETTINGS)
        except OSError:
            return {}  # the device has no such group
    out: dict[str, int] = {}
    for name in names:
        try:
            raw = read_raw(f"{folder}/{name}")
        except FileNotFoundError:
            continue  # not a counter of this device: absent, not 0
        except OSError:  # the firmware refused the query (EINVAL, EIO)
            unreadable.append(f"{group}/{name}")
            continue
        try:
            out[name] = int(raw)
        except ValueError:  # "N/A (no PMA)" and the like
            unreadable.append(f"{group}/{name}")
    return out


def port_netdev(root: Path, device: RdmaDevice, port: int) -> str:
    """The network interface of a port: the RoCE GID table's netdev, else the PCI function's
    interface with that port (IPoIB, or an Ethernet port of the HCA); "" when none."""
    ndev = read_attr(class_dir(root) / device.name / "ports" / str(port) / "gid_attrs/ndevs/0")
    if ndev:
        return ndev
    net = class_dir(root) / device.name / "device" / "net"
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return ""
    for name in names:
        dev_port = read_attr(net / name / "dev_port")
        index = int(dev_port) if dev_port and dev_port.isdigit() else 0
        if index == port - 1:
            return name
    return ""
