"""The fabric collector's parts on known input: counter deltas across wraps, PCIe link levels,
the GPUs a process has open, NCCL's device lists, and which driver statistics mean what."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlx5_sysfs import SysfsTree, dgx_like

from bpfdyno.sources.counters import counter_delta
from bpfdyno.sources.fabric import nics
from bpfdyno.sources.fabric.nics import KnownStat
from bpfdyno.sources.fabric.pci import PciDevice, link_level, list_gpus, process_gpus
from bpfdyno.sources.fabric.rdma import parse_rate
from bpfdyno.tracing.capture.fabric_devices import choose, parse_nccl_list


@pytest.mark.parametrize(
    ("before", "after", "delta"),
    [
        (10, 25, 15),
        (7, 7, 0),
        (2**32 - 10, 15, 25),  # a 32-bit counter wrapped
        (2**64 - 1, 4, 5),  # a 64-bit counter wrapped
        (2**40, 2**40 + 3, 3),
        (1_000, 7, None),  # reset: it would be a wrap of almost 2**32
        (2**40, 5, None),  # reset of a 64-bit counter
    ],
)
def test_counter_delta(before: int, after: int, delta: int | None) -> None:
    assert counter_delta(before, after) == delta


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("200 Gb/sec (4X HDR)", (200e9, 4, "HDR")),
        ("400 Gb/sec (4X NDR)", (400e9, 4, "NDR")),
        ("2.5 Gb/sec (1X SDR)", (2.5e9, 1, "SDR")),
        ("10 Gb/sec (4X)", (10e9, 4, "")),  # kernels before SDR was spelled out
        ("56 Gb/sec (4X FDR)", (56e9, 4, "FDR")),
        ("garbage", (None, None, "")),
        (None, (None, None, "")),
    ],
)
def test_parse_rate(text: str | None, parsed: tuple[float | None, int | None, str]) -> None:
    assert parse_rate(text) == parsed


def _dev(*chain: str, numa: int | None = 0) -> PciDevice:
    return PciDevice(chain[-1], chain, numa)


def test_link_levels_as_nvidia_smi_topo_names_them() -> None:
    gpu = _dev("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:03:00.0")
    same_switch = _dev("pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:10.0", "0000:04:00.0")
    cascaded = _dev(
        "pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:10.0", "0000:05:00.0", "0000:06:00.0"
    )
    other_root_port = _dev("pci0000:00", "0000:00:03.0", "0000:07:00.0")
    other_bridge = _dev("pci0000:3a", "0000:3a:00.0", "0000:3b:00.0")
    other_node = _dev("pci0000:80", "0000:80:01.0", "0000:81:00.0", numa=1)
    unknown_node = _dev("pci0000:90", "0000:90:01.0", "0000:91:00.0", numa=None)
    assert link_level(gpu, same_switch) == "PIX"
    assert link_level(gpu, cascaded) == "PXB"
    assert link_level(gpu, other_root_port) == "PHB"
    assert link_level(gpu, other_bridge) == "NODE"
    assert link_level(gpu, other_node) == "SYS"
    assert link_level(gpu, unknown_node) == "SYS"
    # Two functions of one device on the same root port.
    a = _dev("pci0000:00", "0000:00:02.0", "0000:08:00.0")
    b = _dev("pci0000:00", "0000:00:02.0", "0000:08:00.1")
    assert link_level(a, b) == "PIX"


def test_gpus_in_pci_order_and_those_a_process_has_open(tmp_path: Path) -> None:
    tree = dgx_like(tmp_path / "root")
    assert [g.address for g in list_gpus(tree.root)] == [
        "0000:03:00.0",
        "0000:05:00.0",
        "0000:83:00.0",
    ]
    proc = tmp_path / "proc"
    fd = proc / "4242" / "fd"
    fd.mkdir(parents=True)
    os.symlink("/dev/nvidiactl", fd / "3")
    os.symlink("/dev/nvidia1", fd / "4")
    os.symlink("/dev/nvidia1", fd / "5")
    os.symlink("/dev/null", fd / "6")
    # Without the driver's information files, the minor is the index.
    assert process_gpus(4242, proc, tree.root) == (1,)
    # With them, the minor maps to the GPU's address (minor 1 is the third GPU here).
    for address, minor in (("0000:03:00.0", 0), ("0000:05:00.0", 2), ("0000:83:00.0", 1)):
        info = tree.root / "proc/driver/nvidia/gpus" / address / "information"
        info.parent.mkdir(parents=True)
        info.write_text(
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 158\nDevice Minor: \t {minor}\n"
        )
    assert process_gpus(4242, proc, tree.root) == (2,)
    assert process_gpus(999999, proc, tree.root) == ()


def test_nccl_lists_as_nccl_matches_them() -> None:
    hca = parse_nccl_list("mlx5_0:1,mlx5_1")
    assert (hca.matches("mlx5_0", 1), hca.matches("mlx5_0", 2), hca.matches("mlx5_1", 2)) == (
        True,
        False,
        True,
    )
    assert parse_nccl_list("mlx5").matches("mlx5_7", 1)  # a prefix
    exact = parse_nccl_list("=mlx5_1")
    assert (exact.matches("mlx5_1", 1), exact.matches("mlx5_10", 1)) == (True, False)
    excluded = parse_nccl_list("^docker,lo")
    assert (excluded.matches("eth0"), excluded.matches("docker0"), excluded.matches("lo")) == (
        True,
        False,
        False,
    )
    both = parse_nccl_list("^=eth1")
    assert (both.matches("eth1"), both.matches("eth10")) == (False, True)


def test_a_process_fabric_from_its_environment_its_gpus_or_everything(tmp_path: Path) -> None:
    from bpfdyno.tracing.capture.fabric_devices import all_ports

    tree = dgx_like(tmp_path)
    ports = all_ports(tree.root)
    ifs = ["eth0", "eth2", "ib0", "veth1"]
    by_env = choose({"NCCL_IB_HCA": "=mlx5_1:1"}, ports, ifs, (), tree.root)
    assert ([p.device for p in by_env.ports], by_env.interfaces) == (["mlx5_1"], ("eth2",))
    assert by_env.how == "from NCCL_IB_HCA==mlx5_1:1"
    by_ifname = choose({"NCCL_SOCKET_IFNAME": "^eth,veth"}, ports, ifs, (0,), tree.root)
    assert ([p.device for p in by_ifname.ports], by_ifname.interfaces) == ([], ("ib0",))
    by_gpu = choose({}, ports, ifs, (0, 1), tree.root)
    assert ([p.device for p in by_gpu.ports], by_gpu.interfaces) == (["mlx5_0"], ("ib0",))
    assert by_gpu.how == "closest to its GPUs 0,1"
    everything = choose({}, ports, ifs, (), tree.root)
    # Interfaces backed by a device (the adapters' ib0 and eth2), not veths.
    assert ([p.device for p in everything.ports], everything.interfaces) == (
        ["mlx5_0", "mlx5_1"],
        ("eth2", "ib0"),
    )


#: A ConnectX-6 Dx's statistics names (mlx5_core), a selection in the driver's order.
MLX5_STATS = [
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "rx_out_of_buffer",
    "rx_discards_phy",
    "tx_discards_phy",
    "tx_errors_phy",
    "rx_pause_ctrl_phy",
    "tx_pause_ctrl_phy",
    "rx_prio0_bytes",
    "rx_prio3_pause",
    "rx_prio3_pause_duration",
    "tx_prio3_pause",
    "rx_prio3_pause_transition",
    "rx0_packets",
    "rx0_xdp_drop",
    "tx7_packets",
    "ch3_events",
]


def test_the_well_known_statistics_of_mlx5() -> None:
    known = {MLX5_STATS[i]: k for i, k in nics.well_known("mlx5_core", MLX5_STATS)}
    assert known == {
        "rx_out_of_buffer": KnownStat("out_of_buffer", "rx"),
        "rx_discards_phy": KnownStat("discards", "rx"),
        "tx_discards_phy": KnownStat("discards", "tx"),
        "rx_pause_ctrl_phy": KnownStat("pause", "rx"),
        "tx_pause_ctrl_phy": KnownStat("pause", "tx"),
        "rx_prio3_pause": KnownStat("pfc", "rx", "3"),
        "tx_prio3_pause": KnownStat("pfc", "tx", "3"),
    }
    # Another driver's names mean nothing by themselves.
    assert list(nics.well_known("veth", MLX5_STATS)) == []


def test_per_queue_statistics_are_told_from_totals() -> None:
    queues = [
        "rx0_packets",
        "rx0_xdp_drop",
        "tx7_packets",
        "ch3_events",
        "rx_queue_0_drops",
        "tx_queue_0_xdp_xmit",
        "tx-0.tx_packets",
        "[0]: rx_ucast_packets",
        "queue_0_tx_cnt",
    ]
    totals = ["rx_packets", "rx_prio3_pause", "peer_ifindex", "rx_discards_phy", "rx_xdp_drops"]
    assert [n for n in queues if not nics.is_queue_stat(n)] == []
    assert [n for n in totals if nics.is_queue_stat(n)] == []


def test_sysfs_tree_links_resolve_inside_the_root(tmp_path: Path) -> None:
    tree: SysfsTree = dgx_like(tmp_path)
    link = tree.root / "sys/class/infiniband/mlx5_0/device"
    assert link.resolve().is_relative_to(tmp_path)
    assert os.readlink(tree.root / "sys/class/infiniband/mlx5_0").startswith("../../devices/")
