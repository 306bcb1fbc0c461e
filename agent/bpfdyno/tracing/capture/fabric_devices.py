"""Which RDMA ports and network interfaces a traced process uses, for its ``fabric`` track.

In order:

1. its environment names them, as NCCL reads it: ``NCCL_IB_HCA`` (RDMA ports; their
   netdevs come along) and ``NCCL_SOCKET_IFNAME`` (interfaces), in NCCL's syntax: a comma
   list of name prefixes, ``=`` first for exact names, ``^`` first to exclude, ``:port``
   after an HCA's name for one port (``mlx5_0:1,mlx5_1:1``, ``^docker,lo``, ``=eth0``);
2. else the RDMA ports closest to the GPUs it has open (on the PCIe tree), and their netdevs;
3. else every RDMA port and every interface backed by a device (not loopback, bridges or
   veths; every interface but loopback when none is).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.core.pidfs import read_environ
from bpfdyno.sources.fabric import nics
from bpfdyno.sources.fabric.collector import PortPlace, port_places
from bpfdyno.sources.fabric.pci import process_gpus
from bpfdyno.sources.fabric.rdma import DeviceGone, list_devices, read_device

ENV_HCA = "NCCL_IB_HCA"
ENV_IFNAME = "NCCL_SOCKET_IFNAME"


@dataclass(frozen=True, slots=True)
class NcclNames:
    """A parsed NCCL device list: entries of (name, port or -1), and how they match."""

    entries: tuple[tuple[str, int], ...]
    exact: bool = False
    exclude: bool = False

    def matches(self, name: str, port: int = -1) -> bool:
        """Whether NCCL would use device ``name`` (port ``port``) with this list."""
        hit = any(
            (p == -1 or p == port) and (name == n if self.exact else name.startswith(n))
            for n, p in self.entries
        )
        return not hit if self.exclude else hit


def parse_nccl_list(text: str) -> NcclNames:
    """NCCL's ``NCCL_IB_HCA`` / ``NCCL_SOCKET_IFNAME`` syntax (see the module docstring)."""
    text = text.strip()
    exclude = text.startswith("^")
    text = text.removeprefix("^")
    exact = text.startswith("=")
    text = text.removeprefix("=")
    entries = []
    for item in text.split(","):
        name, colon, port = item.strip().partition(":")
        if name:
            entries.append((name, int(port) if colon and port.isdigit() else -1))
    return NcclNames(tuple(entries), exact, exclude)


@dataclass(frozen=True, slots=True)
class FabricSelection:
    """What the track records for one process, and why those.

    Attributes:
        ports: its RDMA ports.
        interfaces: its network interfaces (the ports' netdevs among them).
        how: why these, in words (for the trace's info slice).
        gpus: the GPUs it had open when chosen.
    """

    ports: tuple[PortPlace, ...]
    interfaces: tuple[str, ...]
    how: str
    gpus: tuple[int, ...] = field(default=())


def all_ports(root: Path) -> list[PortPlace]:
    """Every RDMA port under ``root``, with where it sits."""
    devices = []
    for name in list_devices(root):
        try:
            devices.append(read_device(root, name))
        except DeviceGone:
            continue
    return port_places(root, devices)


def select(pid: int, root: Path = Path("/"), proc_root: Path = Path("/proc")) -> FabricSelection:
    """The ports and interfaces of process ``pid`` (see the module docstring)."""
    env = read_environ(proc_root, pid, (ENV_HCA, ENV_IFNAME))
    ports = all_ports(root)
    interfaces = [n for n in nics.list_interfaces(root) if n != "lo"]
    return choose(env, ports, interfaces, process_gpus(pid, proc_root, root), root)


def choose(
    env: Mapping[str, str],
    ports: Sequence[PortPlace],
    interfaces: Sequence[str],
    gpus: tuple[int, ...],
    root: Path,
) -> FabricSelection:
    """`select` on what was read: the environment, the ports, the interfaces, the GPUs."""
    hca, ifname = env.get(ENV_HCA, "").strip(), env.get(ENV_IFNAME, "").strip()
    if hca or ifname:
        chosen = [p for p in ports if parse_nccl_list(hca).matches(p.device, p.port)] if hca else []
        names = {p.netdev for p in chosen if p.netdev}
        if ifname:
            names |= {n for n in interfaces if parse_nccl_list(ifname).matches(n)}
        how = ", ".join(f"{k}={v}" for k, v in ((ENV_HCA, hca), (ENV_IFNAME, ifname)) if v)
        return FabricSelection(tuple(chosen), _in_order(interfaces, names), f"from {how}", gpus)
    if gpus:
        near = [p for p in ports if set(p.gpus) & set(gpus)]
        if near:
            names = {p.netdev for p in near if p.netdev}
            return FabricSelection(
                tuple(near),
                _in_order(interfaces, names),
                f"closest to its GPUs {','.join(map(str, gpus))}",
                gpus,
            )
    physical = [n for n in interfaces if os.path.exists(nics.net_dir(root) / n / "device")]
    chosen_ifs = physical or list(interfaces)
    return FabricSelection(
        tuple(ports),
        tuple(chosen_ifs),
        "all (no NCCL_IB_HCA or NCCL_SOCKET_IFNAME in its environment"
        + (", and no RDMA port near its GPUs)" if gpus else ", and no GPU open)"),
        gpus,
    )


def _in_order(interfaces: Sequence[str], names: set[str]) -> tuple[str, ...]:
    return tuple(n for n in interfaces if n in names)
