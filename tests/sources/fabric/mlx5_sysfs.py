"""Sysfs trees of mlx5 RDMA adapters and NVIDIA GPUs, built under a test's root directory.

There is no RDMA hardware on the test machines, so the fabric collector reads a tree built
here from the kernel's real layout (drivers/infiniband/core/sysfs.c, the mlx5 driver's
counter names from drivers/infiniband/hw/mlx5/counters.c) and real file contents
("4: ACTIVE", "200 Gb/sec (4X HDR)", "InfiniBand", one decimal number per counter file):

- PCI functions under ``sys/devices/pci<domain>:<bus>/<bridge>.../<function>`` with
  ``vendor``, ``class``, ``numa_node``; ``sys/bus/pci/devices/<address>`` links to them;
- an RDMA device's directory under its PCI function
  (``.../<function>/infiniband/mlx5_0``), ``sys/class/infiniband/mlx5_0`` linking to it and
  its ``device`` link back to the function, ``ports/<n>/`` with ``state``, ``phys_state``,
  ``rate``, ``link_layer``, ``counters/``, ``hw_counters/`` (with ``lifespan``), and
  ``gid_attrs/ndevs/0`` naming the RoCE netdev;
- the adapter's network interface under ``<function>/net/<name>`` (its ``device`` link back
  to the function), linked from ``sys/class/net``.

Every link is relative, as the kernel's are, so the tree resolves inside the root.
A file whose read must fail as the firmware's refusal does (EIO) is a link to
``/proc/self/mem``, whose first page is never mapped.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

MELLANOX_VENDOR = "0x15b3"
NVIDIA_VENDOR = "0x10de"
#: InfiniBand controller, Ethernet controller, 3D controller.
CLASS_IB = "0x020700"
CLASS_ETHERNET = "0x020000"
CLASS_3D = "0x030200"

#: The InfiniBand PMA counters a ConnectX port shows (the extended set), in sysfs order.
IB_COUNTERS = (
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
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_xmit_wait",
    "port_rcv_packets",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
)
#: mlx5 hw_counters of an InfiniBand port: the q counters (no congestion counters).
MLX5_IB_HW_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
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
    "resp_cqe_flush_error",
    "req_cqe_flush_error",
)
#: ... and of a RoCE port: RoCE accelerations and the congestion (CNP/ECN) counters too.
MLX5_ROCE_HW_COUNTERS = (
    *MLX5_IB_HW_COUNTERS,
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_ignored",
    "rp_cnp_handled",
    "np_ecn_marked_roce_packets",
    "np_cnp_sent",
    "rx_icrc_encapsulated",
)


#: The kernel's counters of every interface (sysfs statistics/), those the tests use.
NIC_STATISTICS = (
    "rx_bytes",
    "tx_bytes",
    "rx_packets",
    "tx_packets",
    "rx_dropped",
    "tx_dropped",
    "rx_errors",
    "tx_errors",
    "rx_missed_errors",
)


@dataclass(frozen=True)
class Function:
    """A PCI function of the tree: its address and its directory under the root."""

    address: str
    path: Path


class SysfsTree:
    """Builds and changes the tree under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for d in ("sys/devices", "sys/bus/pci/devices", "sys/class/infiniband", "sys/class/net"):
            (root / d).mkdir(parents=True, exist_ok=True)

    # -- PCI ---------------------------------------------------------------------------

    def function(self, chain: tuple[str, ...], vendor: str, klass: str, numa_node: int) -> Function:
        """A PCI function at ``chain`` (host bridge, bridges, the function's address)."""
        path = self.root / "sys" / "devices" / Path(*chain)
        path.mkdir(parents=True, exist_ok=True)
        # Bridges exist as functions too (the tree's directories), with their node.
        for depth in range(1, len(chain)):
            bridge = self.root / "sys" / "devices" / Path(*chain[: depth + 1])
            _write(bridge / "numa_node", f"{numa_node}\n")
        _write(path / "vendor", f"{vendor}\n")
        _write(path / "class", f"{klass}\n")
        address = chain[-1]
        _link(self.root / "sys/bus/pci/devices" / address, path)
        return Function(address, path)

    def gpu(self, chain: tuple[str, ...], numa_node: int) -> Function:
        """An NVIDIA GPU (3D controller) at ``chain``."""
        return self.function(chain, NVIDIA_VENDOR, CLASS_3D, numa_node)

    # -- RDMA --------------------------------------------------------------------------

    def hca(
        self,
        name: str,
        chain: tuple[str, ...],
        numa_node: int,
        *,
        link_layer: str,
        netdev: str,
        rate: str = "200 Gb/sec (4X HDR)",
    ) -> Function:
        """A one-port mlx5 adapter: InfiniBand (netdev = its IPoIB interface) or Ethernet
        (RoCE: netdev = the port's GID netdev)."""
        klass = CLASS_IB if link_layer == "InfiniBand" else CLASS_ETHERNET
        fn = self.function(chain, MELLANOX_VENDOR, klass, numa_node)
        dev = fn.path / "infiniband" / name
        _write(dev / "node_type", "1: CA\n")
        _write(dev / "fw_ver", "28.39.1002\n")
        _write(dev / "hca_type", "MT4123\n")
        _write(dev / "node_guid", "b83f:d203:00a1:5f20\n")
        _link(dev / "device", fn.path)
        _link(self.root / "sys/class/infiniband" / name, dev)
        port = dev / "ports" / "1"
        _write(port / "lid", "0x12\n" if link_layer == "InfiniBand" else "0x0\n")
        _write(port / "sm_lid", "0x1\n" if link_layer == "InfiniBand" else "0x0\n")
        _write(port / "cap_mask", "0xa651e848\n")
        self.set_link(name, 1, "4: ACTIVE", "5: LinkUp", rate)
        _write(port / "link_layer", f"{link_layer}\n")
        for counter in IB_COUNTERS:
            self.set_counter(name, 1, "counters", counter, 0)
        hw = MLX5_IB_HW_COUNTERS if link_layer == "InfiniBand" else MLX5_ROCE_HW_COUNTERS
        for counter in hw:
            self.set_counter(name, 1, "hw_counters", counter, 0)
        _write(port / "hw_counters" / "lifespan", "10\n")
        net = fn.path / "net" / netdev
        _write(net / "dev_port", "0\n")
        _write(net / "operstate", "up\n")
        _write(net / "carrier", "1\n")
        _write(net / "flags", "0x1003\n")
        for stat in NIC_STATISTICS:
            _write(net / "statistics" / stat, "0\n")
        _link(net / "device", fn.path)
        _link(self.root / "sys/class/net" / netdev, net)
        if link_layer == "Ethernet":
            _write(port / "gid_attrs" / "ndevs" / "0", f"{netdev}\n")
            _write(port / "gid_attrs" / "types" / "0", "IB/RoCE v1\n")
        else:  # an IB port's GID has no netdev: the kernel answers EINVAL
            self.unreadable(port / "gid_attrs" / "ndevs" / "0")
        return fn

    def port_dir(self, name: str, port: int) -> Path:
        return self.root / "sys/class/infiniband" / name / "ports" / str(port)

    def set_link(self, name: str, port: int, state: str, phys_state: str, rate: str) -> None:
        """The port's state ("1: DOWN"), physical state ("3: Disabled") and rate."""
        base = self.port_dir(name, port)
        _write(base / "state", f"{state}\n")
        _write(base / "phys_state", f"{phys_state}\n")
        _write(base / "rate", f"{rate}\n")

    def set_counter(self, name: str, port: int, group: str, counter: str, value: int) -> None:
        _write(self.port_dir(name, port) / group / counter, f"{value}\n")

    def add(
        self, name: str, port: int, group: str, counter: str, amount: int, width: int = 64
    ) -> None:
        """Advance a counter by ``amount``, wrapping at ``width`` bits as the hardware does."""
        path = self.port_dir(name, port) / group / counter
        value = int(path.read_text())
        self.set_counter(name, port, group, counter, (value + amount) % (1 << width))

    def nic_add(self, netdev: str, stat: str, amount: int) -> None:
        """Advance an interface's ``statistics/<stat>`` by ``amount``."""
        path = self.root / "sys/class/net" / netdev / "statistics" / stat
        _write(path, f"{int(path.read_text()) + amount}\n")

    def remove_counter(self, name: str, port: int, group: str, counter: str) -> None:
        (self.port_dir(name, port) / group / counter).unlink()

    def unreadable(self, path: Path) -> None:
        """Make ``path`` a file whose read fails with EIO."""
        if path.exists() or path.is_symlink():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        os.symlink("/proc/self/mem", path)

    def remove_hca(self, name: str) -> None:
        """The adapter disappears (hot unplug, driver unload): its class link and directory."""
        link = self.root / "sys/class/infiniband" / name
        target = link.resolve()
        link.unlink()
        shutil.rmtree(target)


def _write(path: Path, text: str) -> None:
    """Replace ``path``'s content at once, as a sysfs read sees it (never half written): the
    new content is written beside the tree's ``sys/`` (never listed in it), then renamed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    parts = path.parts
    scratch = Path(*parts[: len(parts) - parts[::-1].index("sys") - 1]) / ".writes"
    scratch.mkdir(exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=scratch)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink():
        link.unlink()
    os.symlink(os.path.relpath(target, link.parent), link)


def dgx_like(root: Path) -> SysfsTree:
    """Two NUMA nodes, each with a PCIe switch holding GPUs and an adapter.

    Node 0, host bridge pci0000:00: switch 0000:01:00.0 with GPU 0 (0000:03:00.0), GPU 1
    (0000:05:00.0) and mlx5_0 (0000:04:00.0, InfiniBand HDR, IPoIB ib0).
    Node 1, host bridge pci0000:80: switch 0000:81:00.0 with GPU 2 (0000:83:00.0) and
    mlx5_1 (0000:84:00.0, RoCE 100 GbE, netdev eth2).
    """
    tree = SysfsTree(root)
    sw0 = ("pci0000:00", "0000:00:01.0", "0000:01:00.0")
    sw1 = ("pci0000:80", "0000:80:01.0", "0000:81:00.0")
    tree.gpu((*sw0, "0000:02:08.0", "0000:03:00.0"), 0)
    tree.hca(
        "mlx5_0", (*sw0, "0000:02:10.0", "0000:04:00.0"), 0, link_layer="InfiniBand", netdev="ib0"
    )
    tree.gpu((*sw0, "0000:02:0c.0", "0000:05:00.0"), 0)
    tree.gpu((*sw1, "0000:82:08.0", "0000:83:00.0"), 1)
    tree.hca(
        "mlx5_1",
        (*sw1, "0000:82:10.0", "0000:84:00.0"),
        1,
        link_layer="Ethernet",
        netdev="eth2",
        rate="100 Gb/sec (4X EDR)",
    )
    return tree
