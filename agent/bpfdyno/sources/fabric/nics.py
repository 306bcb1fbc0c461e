"""Network interfaces: their link from sysfs (``/sys/class/net``), and which of their
drivers' statistics mean what.

`read_link` reads what the kernel keeps for every interface: carrier, carrier changes, speed
and duplex (which the kernel asks the driver for), operational state. `well_known` picks,
from a driver's own statistics (`bpfdyno.sources.fabric.ethtool`), the ones that explain
drops the socket layer never sees, under stable names: port discards, pause frames, PFC
pause frames per priority, receive-buffer exhaustion (`WELL_KNOWN`, by driver name).
`is_queue_stat` tells per-queue statistics (dozens per queue) from the totals.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.sources.fabric.sysfs import read_attr, read_attr_int

#: ``flags`` bit of an interface set up (administratively).
IFF_UP = 0x1


def net_dir(root: Path) -> Path:
    """``<root>/sys/class/net``."""
    return root / "sys" / "class" / "net"


@dataclass(frozen=True, slots=True)
class NicLink:
    """An interface's link now; None where the kernel does not say.

    Attributes:
        carrier: 1 up, 0 down (an administratively down interface has none: 0).
        carrier_changes: link ups and downs since the interface was created.
        speed_bps: the negotiated speed, bits/s.
        full_duplex: 1 full, 0 half.
        operstate: ``up``, ``down``, ``lowerlayerdown``, ``dormant``, ``unknown``... (the
            kernel updates it a moment after the carrier, from its link-watch work).
    """

    carrier: int | None
    carrier_changes: int | None
    speed_bps: float | None
    full_duplex: int | None
    operstate: str


def list_interfaces(root: Path = Path("/")) -> list[str]:
    """The interfaces of the agent's network namespace (as sysfs shows them), sorted."""
    try:
        return sorted(os.listdir(net_dir(root)))
    except OSError:
        return []


def read_link(root: Path, ifname: str) -> NicLink | None:
    """The interface's link; None when the interface is gone."""
    base = f"{net_dir(root)}/{ifname}"  # strings: read every collection, for every interface
    operstate = read_attr(f"{base}/operstate")
    if operstate is None:
        return None
    carrier = read_attr_int(f"{base}/carrier")
    flags = read_attr_int(f"{base}/flags", 16)
    if carrier is None and flags is not None and not flags & IFF_UP:
        carrier = 0  # the kernel refuses to read the carrier of an interface set down
    speed = read_attr_int(f"{base}/speed")
    duplex = read_attr(f"{base}/duplex") or ""
    return NicLink(
        carrier,
        read_attr_int(f"{base}/carrier_changes"),
        speed * 1e6 if speed is not None and speed > 0 else None,  # sysfs: Mb/s, -1 unknown
        {"full": 1, "half": 0}.get(duplex),
        operstate,
    )


def read_statistics(root: Path, ifname: str, names: tuple[str, ...]) -> dict[str, int]:
    """The kernel's own counters of an interface (``statistics/rx_bytes``...), those present."""
    base = f"{net_dir(root)}/{ifname}/statistics"
    out = {}
    for name in names:
        value = read_attr_int(f"{base}/{name}")
        if value is not None:
            out[name] = value
    return out


#: Per-queue statistics: virtio/mlx5 ``rx0_drops``, ``tx3_packets``, ``ch2_events``; veth,
#: virtio and ice ``rx_queue_0_drops``; i40e ``tx-0.tx_packets``; bnxt ``[0]: rx_ucast``;
#: ena ``queue_0_tx_cnt``. (mlx5's ``rx_prio3_pause`` is per priority, not per queue.)
_QUEUE_STAT = re.compile(
    r"^(?:(?:rx|tx)_queue_\d+_|(?:rx|tx|ch|xsk|xdp|ptp|qos|rxq|txq)\d+_|(?:rx|tx)-\d+\.|"
    r"\[\d+\]|queue_\d+_)"
)


def is_queue_stat(name: str) -> bool:
    """Whether a driver statistic counts one queue (rather than the interface)."""
    return _QUEUE_STAT.match(name) is not None


@dataclass(frozen=True, slots=True)
class KnownStat:
    """One driver statistic with a stable meaning.

    Attributes:
        kind: ``discards`` (frames the port dropped: no buffer, policy), ``pause`` (802.3x
            pause frames), ``pfc`` (priority flow control pause frames), ``out_of_buffer``
            (packets dropped for lack of receive descriptors).
        direction: ``rx`` or ``tx``.
        priority: the PFC priority ("" for the others).
    """

    kind: str
    direction: str
    priority: str = ""


#: Driver -> (statistic name pattern, what it is); a pattern's groups "dir" and "prio" fill
#: the direction and priority. mlx5 (ConnectX, the usual RDMA NIC of GPU clusters) names
#: from drivers/net/ethernet/mellanox/mlx5/core/en_stats.c.
WELL_KNOWN: Mapping[str, tuple[tuple[re.Pattern[str], KnownStat], ...]] = {
    "mlx5_core": (
        (re.compile(r"^(?P<dir>rx|tx)_discards_phy$"), KnownStat("discards", "")),
        (re.compile(r"^(?P<dir>rx|tx)_pause_ctrl_phy$"), KnownStat("pause", "")),
        (re.compile(r"^(?P<dir>rx|tx)_prio(?P<prio>\d)_pause$"), KnownStat("pfc", "")),
        (re.compile(r"^(?P<dir>rx)_out_of_buffer$"), KnownStat("out_of_buffer", "")),
    ),
}


def well_known(driver: str, names: list[str]) -> Iterator[tuple[int, KnownStat]]:
    """(index into ``names``, its meaning) for each statistic of ``driver`` with a known one."""
    patterns = WELL_KNOWN.get(driver, ())
    if not patterns:
        return
    for i, name in enumerate(names):
        for pattern, known in patterns:
            m = pattern.match(name)
            if m is not None:
                groups = m.groupdict()
                yield i, KnownStat(known.kind, groups["dir"], groups.get("prio") or "")
                break
