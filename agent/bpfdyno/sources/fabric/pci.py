"""Where devices sit on the PCIe tree (sysfs), which GPUs are closest to a NIC, and which GPUs
a process uses.

A PCI device's sysfs directory is its path from the host bridge
(``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:03:00.0``: host bridge, root
port, switch ports, the device), so two devices' common ancestors say how traffic between
them flows, in the terms ``nvidia-smi topo -m`` uses:

- ``PIX``: through at most one PCIe switch (both hang off the same bridge, one level down);
- ``PXB``: through several bridges, without crossing the host bridge;
- ``PHB``: through the host bridge (the CPU's root complex);
- ``NODE``: between host bridges of one NUMA node;
- ``SYS``: across NUMA nodes (or a node is unknown).

GPUs are the NVIDIA display and 3D controllers (vendor 0x10de, PCI class 0x03); a GPU's index
is its place in PCI address order, which is how NVML numbers them.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.sources.fabric.sysfs import read_attr_int

NVIDIA_VENDOR = 0x10DE
#: PCI base class of display controllers (VGA 0x0300, 3D 0x0302).
DISPLAY_CLASS = 0x03
#: The link levels from closest to farthest.
LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_NVIDIA_DEV = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True, slots=True)
class PciDevice:
    """A PCI function and its place in the tree.

    Attributes:
        address: ``0000:3b:00.0``.
        chain: its sysfs path below ``devices/``: the host bridge, the bridges, itself.
        numa_node: the node of its host bridge; None when the platform does not say.
    """

    address: str
    chain: tuple[str, ...]
    numa_node: int | None


def pci_device(device_dir: Path) -> PciDevice | None:
    """The PCI function a sysfs ``device`` link (or a devices/ directory) resolves to.

    Returns:
        None when it does not resolve to a PCI function (a virtual device).
    """
    try:
        real = Path(os.path.realpath(device_dir))
    except OSError:
        return None
    if not _PCI_ADDRESS.match(real.name):
        return None
    parts = real.parts
    if "devices" not in parts:
        return None
    chain = parts[len(parts) - parts[::-1].index("devices") :]
    numa = read_attr_int(real / "numa_node")
    return PciDevice(real.name, tuple(chain), numa if numa is not None and numa >= 0 else None)


def list_gpus(root: Path = Path("/")) -> list[PciDevice]:
    """The NVIDIA GPUs on the PCI bus, in PCI address order (NVML's index order)."""
    base = root / "sys" / "bus" / "pci" / "devices"
    try:
        entries = sorted(os.listdir(base))
    except OSError:
        return []
    out = []
    for name in entries:
        vendor = read_attr_int(base / name / "vendor", 16)
        klass = read_attr_int(base / name / "class", 16)
        if vendor != NVIDIA_VENDOR or klass is None or klass >> 16 != DISPLAY_CLASS:
            continue
        device = pci_device(base / name)
        if device is not None:
            out.append(device)
    return out


def link_level(a: PciDevice, b: PciDevice) -> str:
    """How traffic between two devices flows: one of `LEVELS`."""
    common = 0
    for x, y in zip(a.chain[:-1], b.chain[:-1], strict=False):
        if x != y:
            break
        common += 1
    if common >= 2:  # a shared PCI bridge below the host bridge
        below = max(len(a.chain) - 1 - common, len(b.chain) - 1 - common)
        return "PIX" if below <= 1 else "PXB"
    if common == 1:
        return "PHB"
    if a.numa_node is not None and a.numa_node == b.numa_node:
        return "NODE"
    return "SYS"


def closest_gpus(device: PciDevice, gpus: list[PciDevice]) -> tuple[tuple[int, ...], str]:
    """The indices of the GPUs closest to ``device``, and their link level ("" without GPUs)."""
    if not gpus:
        return (), ""
    levels = [link_level(device, gpu) for gpu in gpus]
    best = min(levels, key=LEVELS.index)
    return tuple(i for i, level in enumerate(levels) if level == best), best


def process_gpus(
    pid: int, proc_root: Path = Path("/proc"), root: Path = Path("/")
) -> tuple[int, ...]:
    """The indices of the GPUs process ``pid`` has open (its ``/dev/nvidiaN`` descriptors).

    The device minor N is mapped to a PCI address through the driver's
    ``/proc/driver/nvidia/gpus/<address>/information`` ("Device Minor: N"); without it, N is
    taken as the index. Empty when the process has none open or cannot be read.
    """
    try:
        fds = os.listdir(proc_root / str(pid) / "fd")
    except OSError:
        return ()
    minors = set()
    for fd in fds:
        try:
            target = os.readlink(proc_root / str(pid) / "fd" / fd)
        except OSError:
            continue
        m = _NVIDIA_DEV.match(target)
        if m:
            minors.add(int(m.group(1)))
    if not minors:
        return ()
    gpus = list_gpus(root)
    index = {gpu.address: i for i, gpu in enumerate(gpus)}
    by_minor = _driver_minors(root)
    out = set()
    for minor in minors:
        address = by_minor.get(minor)
        if address is not None and address in index:
            out.add(index[address])
        elif not by_minor:
            out.add(minor)
    return tuple(sorted(out))


def _driver_minors(root: Path) -> dict[int, str]:
    """Device minor -> PCI address, from the NVIDIA driver's information files."""
    base = root / "proc" / "driver" / "nvidia" / "gpus"
    out: dict[int, str] = {}
    try:
        entries = os.listdir(base)
    except OSError:
        return out
    for address in entries:
        try:
            text = (base / address / "information").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Device Minor" and value.strip().isdigit():
                out[int(value.strip())] = address.lower()
    return out
