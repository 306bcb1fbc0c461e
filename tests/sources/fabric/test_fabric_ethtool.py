"""NIC driver statistics through the kernel's ethtool ioctls, on real interfaces: veth pairs
(their driver has statistics: peer_ifindex and per-queue XDP counters) and a bridge (none),
checked against what `ethtool -S` reads from the same kernel."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.core.events import KernelEvent
from bpfdyno.core.metrics import Sample
from bpfdyno.sources.fabric.collector import FabricCollector
from bpfdyno.sources.fabric.ethtool import Ethtool

pytestmark = pytest.mark.root

QUEUES = 2


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    """A veth pair with two queues each, named after this process (tests run in parallel)."""
    a, b = f"fbt{os.getpid() % 100000}a", f"fbt{os.getpid() % 100000}b"
    q = ("numtxqueues", str(QUEUES), "numrxqueues", str(QUEUES))
    ip("link", "add", a, *q, "type", "veth", "peer", "name", b, *q)
    try:
        yield a, b
    finally:
        subprocess.run(["ip", "link", "del", a], capture_output=True)


@pytest.fixture
def bridge() -> Iterator[str]:
    name = f"fbb{os.getpid() % 100000}"
    ip("link", "add", name, "type", "bridge")
    try:
        yield name
    finally:
        subprocess.run(["ip", "link", "del", name], capture_output=True)


def ethtool_s(ifname: str) -> dict[str, int]:
    """`ethtool -S IFNAME`: statistic -> value, as the ethtool program reads them."""
    out = subprocess.run(["ethtool", "-S", ifname], check=True, capture_output=True, text=True)
    stats = {}
    for line in out.stdout.splitlines()[1:]:
        name, _, value = line.strip().rpartition(": ")
        stats[name] = int(value)
    return stats


def by_stat(samples: list[Sample], ifname: str) -> dict[str, float]:
    return {
        dict(s.labels)["statistic"]: s.value
        for s in samples
        if s.spec.name == "nic_driver_statistic" and dict(s.labels)["interface"] == ifname
    }


def metric(samples: list[Sample], name: str, ifname: str) -> list[float]:
    return [
        s.value for s in samples if s.spec.name == name and dict(s.labels)["interface"] == ifname
    ]


def ifindex(ifname: str) -> int:
    return int(Path(f"/sys/class/net/{ifname}/ifindex").read_text())


def test_every_driver_statistic_as_ethtool_reads_it(veth: tuple[str, str]) -> None:
    a, b = veth
    c = FabricCollector(nic_interfaces=[a, b], nic_queue_stats=True)
    c.start()
    try:
        out = list(c.collect())
    finally:
        c.close()
    for me, peer in ((a, b), (b, a)):
        stats = by_stat(out, me)
        assert stats == ethtool_s(me)
        assert stats["peer_ifindex"] == ifindex(peer)
        # One set of XDP counters per queue, as the veth driver names them.
        assert {n for n in stats if n.startswith("rx_queue_")} == {
            f"rx_queue_{q}_{what}"
            for q in range(QUEUES)
            for what in (
                "xdp_packets",
                "xdp_bytes",
                "drops",
                "xdp_redirect",
                "xdp_drops",
                "xdp_tx",
                "xdp_tx_errors",
            )
        }
        assert metric(out, "nic_driver_statistics_omitted", me) == [0]
        [info] = [s for s in out if s.spec.name == "nic_info" and dict(s.labels)["interface"] == me]
        assert (dict(info.labels)["driver"], dict(info.labels)["bus"], info.value) == (
            "veth",
            "",
            1,
        )


def test_per_queue_statistics_are_left_out_by_default(veth: tuple[str, str]) -> None:
    a, b = veth
    c = FabricCollector(nic_interfaces=[a])
    c.start()
    try:
        out = list(c.collect())
    finally:
        c.close()
    assert by_stat(out, a) == {"peer_ifindex": ifindex(b)}
    assert metric(out, "nic_driver_statistics_omitted", a) == [len(ethtool_s(a)) - 1]
    assert by_stat(out, b) == {}  # not in nic_interfaces


def test_at_most_max_stats_per_interface(veth: tuple[str, str]) -> None:
    a, _ = veth
    c = FabricCollector(nic_interfaces=[a], nic_queue_stats=True, max_stats_per_interface=3)
    c.start()
    try:
        out = list(c.collect())
    finally:
        c.close()
    every = ethtool_s(a)
    assert list(by_stat(out, a)) == list(every)[:3]
    assert metric(out, "nic_driver_statistics_omitted", a) == [len(every) - 3]


def test_link_speed_duplex_carrier_and_carrier_events(veth: tuple[str, str]) -> None:
    a, b = veth
    events: list[KernelEvent] = []
    c = FabricCollector(events.extend, nic_interfaces=[a, b])
    c.start()
    try:
        out = list(c.collect())
        # Both set down: the kernel refuses their carrier (EINVAL): 0, not absent.
        assert metric(out, "nic_carrier_up", a) == [0]
        assert metric(out, "nic_link_speed_bits_per_second", a) == []  # unknown while down
        ip("link", "set", a, "up")
        ip("link", "set", b, "up")
        out = list(c.collect())
        assert metric(out, "nic_carrier_up", a) == [1]
        assert metric(out, "nic_link_speed_bits_per_second", a) == [10_000e6]  # veth: 10 Gb/s
        assert metric(out, "nic_link_full_duplex", a) == [1]
        assert [e.kind for e in events] == ["nic_carrier_up", "nic_carrier_up"]
        changes = int(Path(f"/sys/class/net/{a}/carrier_changes").read_text())
        assert metric(out, "nic_carrier_changes_total", a) == [changes]
        ip("link", "set", b, "down")  # a loses its carrier, b is set down
        out = list(c.collect())
        assert metric(out, "nic_carrier_up", a) == [0]
        down = {e.attrs["interface"]: e for e in events[2:]}
        assert {i: e.kind for i, e in down.items()} == {
            a: "nic_carrier_down",
            b: "nic_carrier_down",
        }
        assert down[a].attrs["carrier_changes"] == changes + 1
    finally:
        c.close()


def test_a_bridge_has_no_driver_statistics_and_loopback_is_not_reported(bridge: str) -> None:
    c = FabricCollector(nic_interfaces=[bridge, "lo"])
    c.start()
    try:
        out = list(c.collect())
    finally:
        c.close()
    assert by_stat(out, bridge) == {}
    assert metric(out, "nic_driver_statistics_omitted", bridge) == []
    assert [dict(s.labels)["driver"] for s in out if s.spec.name == "nic_info"] == ["bridge"]
    assert not [s for s in out if dict(s.labels).get("interface") == "lo"]
    with Ethtool() as e:
        assert e.stat_count(bridge) == 0
        assert e.stat_count("lo") == 0


def test_a_read_the_driver_answers_with_more_than_asked_fails_cleanly(
    veth: tuple[str, str],
) -> None:
    a, _ = veth
    with Ethtool() as e:
        count = e.stat_count(a)
        assert count == len(ethtool_s(a))
        # The kernel writes every statistic whatever was asked: the guard page after the
        # buffer turns that into EFAULT (None here) instead of corrupting memory.
        assert e.stat_values(a, 1) is None
        assert e.stat_names(a, count - 1) is None
        assert e.stat_values(a, count) is not None
        with pytest.raises(OSError) as gone:
            e.stat_count("fbtnosuch0")
        assert gone.value.errno == errno.ENODEV
