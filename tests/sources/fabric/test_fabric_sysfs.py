"""The fabric collector's RDMA part on sysfs trees of mlx5 adapters (mlx5_sysfs.py): ports,
where they sit, counters with their units, wraps and resets, absent and unreadable counters,
devices that disappear, and link-down events."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest
from mlx5_sysfs import IB_COUNTERS, MLX5_IB_HW_COUNTERS, MLX5_ROCE_HW_COUNTERS, SysfsTree, dgx_like

from bpfdyno.core.events import KernelEvent
from bpfdyno.core.metrics import Sample
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.fabric.collector import FabricCollector


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Events:
    def __init__(self) -> None:
        self.events: list[KernelEvent] = []

    def __call__(self, events: Sequence[KernelEvent]) -> None:
        self.events.extend(events)


def values(
    samples: Sequence[Sample], name: str, **labels: str
) -> dict[tuple[tuple[str, str], ...], float]:
    """label tuples -> value of the samples of metric ``name`` whose labels include ``labels``."""
    return {
        s.labels: s.value
        for s in samples
        if s.spec.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())
    }


def one(samples: Sequence[Sample], name: str, **labels: str) -> float:
    found = values(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return next(iter(found.values()))


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return dgx_like(tmp_path)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def fabric(tree: SysfsTree, clock: Clock, events: Events) -> FabricCollector:
    c = FabricCollector(events, root=tree.root, ethtool=False, clock=clock)
    c.start()
    return c


def test_each_port_with_its_link_netdev_pci_numa_and_closest_gpus(fabric: FabricCollector) -> None:
    out = fabric.collect()
    assert one(out, "rdma_devices") == 2
    info = {dict(k)["device"]: dict(k) for k in values(out, "rdma_port_info")}
    assert info == {
        "mlx5_0": {
            "device": "mlx5_0",
            "port": "1",
            "link_layer": "InfiniBand",
            "netdev": "ib0",
            "pci": "0000:04:00.0",
            "numa_node": "0",
            "gpus": "0,1",
            "gpu_link": "PIX",
        },
        "mlx5_1": {
            "device": "mlx5_1",
            "port": "1",
            "link_layer": "Ethernet",
            "netdev": "eth2",
            "pci": "0000:84:00.0",
            "numa_node": "1",
            "gpus": "2",
            "gpu_link": "PIX",
        },
    }
    for device, rate in (("mlx5_0", 200e9), ("mlx5_1", 100e9)):
        port = {"device": device, "port": "1"}
        assert one(out, "rdma_port_state", **port) == 4
        assert one(out, "rdma_port_active", **port) == 1
        assert one(out, "rdma_port_physical_state", **port) == 5
        assert one(out, "rdma_port_rate_bits_per_second", **port) == rate
        assert one(out, "rdma_port_width_lanes", **port) == 4
    state, reason = fabric.health() or (None, "")
    assert state is PartState.OK
    assert reason.startswith(
        "2 RDMA device(s): mlx5_0:1 (ib0) InfiniBand, GPUs 0,1 PIX ACTIVE 200 Gb/s; "
        "mlx5_1:1 (eth2) Ethernet, GPUs 2 PIX ACTIVE 100 Gb/s"
    )


def test_every_counter_the_port_has_and_no_other(fabric: FabricCollector) -> None:
    out = fabric.collect()
    for device, hw in (("mlx5_0", MLX5_IB_HW_COUNTERS), ("mlx5_1", MLX5_ROCE_HW_COUNTERS)):
        totals = values(out, "rdma_counter_total", device=device)
        got = {(dict(k)["group"], dict(k)["counter"]) for k in totals}
        # lifespan is a setting of hw_counters/, not a counter.
        assert got == {("counters", c) for c in IB_COUNTERS} | {("hw_counters", c) for c in hw}
    # The InfiniBand port has no congestion counters: absent, never 0.
    assert values(out, "rdma_counter_total", device="mlx5_0", counter="np_cnp_sent") == {}
    assert one(out, "rdma_counter_total", device="mlx5_1", counter="np_cnp_sent") == 0


def test_rates_in_their_units_data_in_bytes_from_4_byte_words(
    tree: SysfsTree, fabric: FabricCollector, clock: Clock
) -> None:
    fabric.collect()
    clock.t += 2.0
    tree.add("mlx5_0", 1, "counters", "port_xmit_data", 1_000_000)  # words
    tree.add("mlx5_0", 1, "counters", "port_rcv_data", 250_000)
    tree.add("mlx5_0", 1, "counters", "port_xmit_packets", 4_000)
    tree.add("mlx5_0", 1, "counters", "port_rcv_packets", 1_000)
    tree.add("mlx5_0", 1, "counters", "symbol_error", 3)
    tree.add("mlx5_0", 1, "counters", "port_xmit_wait", 500)
    tree.add("mlx5_1", 1, "hw_counters", "packet_seq_err", 5)
    tree.add("mlx5_1", 1, "hw_counters", "local_ack_timeout_err", 1)
    tree.add("mlx5_1", 1, "hw_counters", "np_cnp_sent", 40)
    out = fabric.collect()
    ib = {"device": "mlx5_0", "port": "1"}
    assert one(out, "rdma_port_bytes_per_second", **ib, direction="tx") == 2_000_000
    assert one(out, "rdma_port_bytes_per_second", **ib, direction="rx") == 500_000
    assert one(out, "rdma_port_packets_per_second", **ib, direction="tx") == 2_000
    assert one(out, "rdma_port_packets_per_second", **ib, direction="rx") == 500
    assert one(out, "rdma_port_errors_per_second", **ib) == 1.5
    # The generic series keep the device's own units: words, ticks.
    assert one(out, "rdma_counter_per_second", **ib, counter="port_xmit_data") == 500_000
    assert one(out, "rdma_counter_per_second", **ib, counter="port_xmit_wait") == 250
    assert one(out, "rdma_counter_total", **ib, counter="port_xmit_data") == 1_000_000
    roce = {"device": "mlx5_1", "port": "1"}
    assert one(out, "rdma_port_errors_per_second", **roce) == 3.0
    assert one(out, "rdma_counter_per_second", **roce, counter="np_cnp_sent") == 20
    assert one(out, "rdma_port_bytes_per_second", **roce, direction="tx") == 0


def test_a_32_bit_counter_that_wraps_and_a_counter_that_was_reset(
    tree: SysfsTree, fabric: FabricCollector, clock: Clock
) -> None:
    # mlx5's q counters (out_of_buffer...) are 32 bits wide in the firmware.
    tree.set_counter("mlx5_1", 1, "hw_counters", "out_of_buffer", 2**32 - 10)
    tree.set_counter("mlx5_1", 1, "hw_counters", "duplicate_request", 1_000)
    # A 64-bit data counter past 2**32.
    tree.set_counter("mlx5_1", 1, "counters", "port_rcv_data", 2**40)
    fabric.collect()
    clock.t += 1.0
    tree.add("mlx5_1", 1, "hw_counters", "out_of_buffer", 25, width=32)
    tree.set_counter("mlx5_1", 1, "hw_counters", "duplicate_request", 7)  # cleared
    tree.add("mlx5_1", 1, "counters", "port_rcv_data", 1_000)
    out = fabric.collect()
    roce = {"device": "mlx5_1", "port": "1"}
    assert one(out, "rdma_counter_total", **roce, counter="out_of_buffer") == 15
    assert one(out, "rdma_counter_per_second", **roce, counter="out_of_buffer") == 25
    # A reset gives no rate for that interval (never a negative or a huge one) ...
    assert values(out, "rdma_counter_per_second", **roce, counter="duplicate_request") == {}
    assert one(out, "rdma_port_errors_per_second", **roce) == 25  # out_of_buffer only
    assert one(out, "rdma_port_bytes_per_second", **roce, direction="rx") == 4_000
    # ... and the next interval has one again.
    clock.t += 1.0
    tree.add("mlx5_1", 1, "hw_counters", "duplicate_request", 3)
    out = fabric.collect()
    assert one(out, "rdma_counter_per_second", **roce, counter="duplicate_request") == 3


def test_counters_that_disappear_or_cannot_be_read_are_absent_never_0(
    tree: SysfsTree, fabric: FabricCollector, clock: Clock
) -> None:
    fabric.collect()
    clock.t += 1.0
    port = tree.port_dir("mlx5_0", 1)
    tree.unreadable(port / "counters" / "port_xmit_wait")  # EIO, as a refused firmware query
    (port / "counters" / "symbol_error").write_text("N/A (no PMA)\n")  # older kernels' text
    tree.remove_counter("mlx5_0", 1, "hw_counters", "out_of_sequence")
    tree.add("mlx5_0", 1, "counters", "link_error_recovery", 2)
    out = fabric.collect()
    ib = {"device": "mlx5_0", "port": "1"}
    for counter in ("port_xmit_wait", "symbol_error", "out_of_sequence"):
        assert values(out, "rdma_counter_total", **ib, counter=counter) == {}
        assert values(out, "rdma_counter_per_second", **ib, counter=counter) == {}
    assert one(out, "rdma_unreadable_counters", **ib) == 2
    assert one(out, "rdma_unreadable_counters", device="mlx5_1", port="1") == 0
    assert one(out, "rdma_counter_per_second", **ib, counter="link_error_recovery") == 2
    assert one(out, "rdma_port_errors_per_second", **ib) == 2
    assert len(values(out, "rdma_counter_total", **ib)) == (
        len(IB_COUNTERS) + len(MLX5_IB_HW_COUNTERS) - 3
    )


def test_a_device_that_disappears_and_comes_back(
    tree: SysfsTree, fabric: FabricCollector, clock: Clock
) -> None:
    fabric.collect()
    tree.remove_hca("mlx5_1")
    clock.t += 1.0
    out = fabric.collect()
    assert one(out, "rdma_devices") == 1
    assert {dict(k)["device"] for k in values(out, "rdma_port_info")} == {"mlx5_0"}
    assert not [s for s in out if dict(s.labels).get("device") == "mlx5_1"]
    _, reason = fabric.health() or (None, "")
    assert reason.startswith("1 RDMA device(s): mlx5_0:1 (ib0) InfiniBand")
    # Back (a driver reload): reported again, rates from its second reading.
    sw1 = ("pci0000:80", "0000:80:01.0", "0000:81:00.0")
    tree.hca(
        "mlx5_1", (*sw1, "0000:82:10.0", "0000:84:00.0"), 1, link_layer="Ethernet", netdev="eth2"
    )
    clock.t += 1.0
    out = fabric.collect()
    assert one(out, "rdma_devices") == 2
    assert one(out, "rdma_port_active", device="mlx5_1", port="1") == 1
    assert values(out, "rdma_counter_per_second", device="mlx5_1") == {}
    clock.t += 1.0
    assert values(fabric.collect(), "rdma_counter_per_second", device="mlx5_1")


def test_a_device_vanishing_between_the_listing_and_the_read(
    tree: SysfsTree, fabric: FabricCollector
) -> None:
    fabric.collect()
    # The class link is still listed but the device's directory is gone (mid-unplug).
    target = (tree.root / "sys/class/infiniband/mlx5_0").resolve()
    shutil.rmtree(target / "ports")
    out = fabric.collect()
    assert one(out, "rdma_devices") == 2
    assert {dict(k)["device"] for k in values(out, "rdma_port_info")} == {"mlx5_1"}


def test_link_down_and_up_are_events(
    tree: SysfsTree, fabric: FabricCollector, clock: Clock, events: Events
) -> None:
    fabric.collect()
    clock.t += 1.0
    tree.set_link("mlx5_0", 1, "1: DOWN", "3: Disabled", "10 Gb/sec (4X SDR)")
    tree.add("mlx5_0", 1, "counters", "link_downed", 1)
    out = fabric.collect()
    assert one(out, "rdma_port_active", device="mlx5_0", port="1") == 0
    assert one(out, "rdma_port_state", device="mlx5_0", port="1") == 1
    assert one(out, "rdma_port_physical_state", device="mlx5_0", port="1") == 3
    [down] = events.events
    assert (down.kind, down.pid, down.tid) == ("rdma_link_down", 0, 0)
    assert down.attrs == {
        "device": "mlx5_0",
        "port": 1,
        "state": "DOWN",
        "phys_state": "Disabled",
        "link_layer": "InfiniBand",
        "link_downed": 1,
        "netdev": "ib0",
    }
    clock.t += 1.0
    tree.set_link("mlx5_0", 1, "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)")
    fabric.collect()
    assert [e.kind for e in events.events] == ["rdma_link_down", "rdma_link_up"]
    # Down and up again between two readings: only link_downed says so.
    clock.t += 1.0
    tree.add("mlx5_1", 1, "counters", "link_downed", 1)
    fabric.collect()
    flap = events.events[-1]
    assert (flap.kind, flap.attrs["device"], flap.attrs["recovered"]) == (
        "rdma_link_down",
        "mlx5_1",
        1,
    )
    assert flap.attrs["state"] == "ACTIVE"
    clock.t += 1.0
    fabric.collect()
    assert len(events.events) == 3


def test_a_machine_without_rdma_devices_says_so_and_is_ok(tmp_path: Path) -> None:
    (tmp_path / "sys/class/net").mkdir(parents=True)
    c = FabricCollector(root=tmp_path, ethtool=False)
    c.start()
    out = c.collect()
    assert [(s.spec.name, s.value) for s in out] == [("rdma_devices", 0)]
    assert c.health() == (
        PartState.OK,
        "no RDMA devices (/sys/class/infiniband is empty or absent); 0 interface(s)",
    )


def test_without_sysfs_the_collector_is_unavailable_with_the_fix(tmp_path: Path) -> None:
    c = FabricCollector(root=tmp_path, ethtool=False)
    with pytest.raises(CollectorUnavailable, match="mount -t sysfs sysfs"):
        c.start()
