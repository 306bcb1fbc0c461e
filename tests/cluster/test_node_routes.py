"""The node behind a pod's address, read from a real routing table (`bpfdyno.app.node_routes`):
a network namespace with the routes the common pod networks install — a gateway on the
underlay (flannel's host-gw, Calico's BGP mode), a VXLAN device with per-node forwarding
entries (flannel's vxlan) and one with a single remote — read with the real ``ip`` and
``bridge``. Needs root (namespaces)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]

#: This node's underlay address, and the overlay's MAC of node .3's VXLAN device.
NODE = "10.231.9.1"
MAC_3 = "02:00:0a:f4:03:00"

SETUP = [
    "link add ul type veth peer name ulp",  # the underlay (its far end stays here, up)
    f"addr add {NODE}/24 dev ul",
    "link set ulp up",
    "link set ul up",
    "link set lo up",
    # host-gw: pods of node .2 are routed to it on the underlay.
    "route add 10.244.2.0/24 via 10.231.9.2 dev ul",
    # flannel's vxlan: node .3's overlay address, its MAC, and where that MAC is sent.
    f"link add fl address 02:00:0a:f4:01:00 type vxlan id 42 local {NODE} dev ul dstport 4789 "
    "nolearning",
    "addr add 10.244.1.0/32 dev fl",
    "link set fl up",
    "route add 10.244.3.0/24 via 10.244.3.0 dev fl onlink",
    f"neigh add 10.244.3.0 lladdr {MAC_3} dev fl nud permanent",
    # Node .4's overlay address with no neighbour entry: its node is not known.
    "route add 10.244.4.0/24 via 10.244.4.0 dev fl onlink",
    # A VXLAN device with one remote: everything on it goes to node .5.
    f"link add fs type vxlan id 43 remote 10.231.9.5 local {NODE} dev ul dstport 4790",
    "link set fs up",
    "route add 10.244.5.0/24 via 10.244.5.0 dev fs onlink",
    # The way out: no node behind it.
    "route add default via 10.231.9.254 dev ul",
]

#: Resolves each address given in the namespace and prints what became of it as JSON.
RESOLVE = """
import asyncio, ipaddress, json, sys
from bpfdyno.app.node_routes import RouteError, node_behind
async def main():
    out = {}
    for a in sys.argv[1:]:
        try:
            r = await node_behind(ipaddress.ip_address(a))
            out[a] = None if r is None else [str(r.node), r.how]
        except RouteError as e:
            out[a] = "error: " + str(e)
    print(json.dumps(out))
asyncio.run(main())
"""


@contextlib.contextmanager
def node_namespace() -> Iterator[str]:
    ns = f"bdnr{os.getpid() % 100000}"
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        for cmd in SETUP:
            subprocess.run(["ip", "-n", ns, *cmd.split()], check=True, capture_output=True)
        subprocess.run(
            ["ip", "netns", "exec", ns, "bridge", "fdb", "append", MAC_3, "dev", "fl", "dst",
             "10.231.9.3"],
            check=True, capture_output=True,
        )  # fmt: skip
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def resolve(ns: str, *addrs: str) -> dict[str, object]:
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", RESOLVE, *addrs],
        check=True, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return dict(json.loads(out.stdout))


def test_each_pod_network_s_route_leads_to_its_node() -> None:
    with node_namespace() as ns:
        got = resolve(
            ns,
            "10.244.2.7",
            "10.244.3.9",
            "10.244.5.2",
            "10.231.9.8",
            NODE,
            "10.244.4.4",
            "198.51.100.7",
        )
    assert got == {
        "10.244.2.7": ["10.231.9.2", "gateway on ul"],  # host-gw
        "10.244.3.9": ["10.231.9.3", "VXLAN fl"],  # the MAC's forwarding entry
        "10.244.5.2": ["10.231.9.5", "VXLAN fs"],  # the device's one remote
        "10.231.9.8": None,  # on a directly attached network: no other node
        NODE: None,  # this node's own
        "10.244.4.4": "error: the route to 10.244.4.4 goes through VXLAN fl via 10.244.4.0, "
        "whose node is not in its forwarding database",
        "198.51.100.7": None,  # the default route's
    }


def test_an_address_with_no_route_says_why() -> None:
    with node_namespace() as ns:
        subprocess.run(["ip", "-n", ns, "route", "del", "default"], check=True)
        (got,) = resolve(ns, "192.0.2.1").values()
    assert got == "error: ip -j route get 192.0.2.1: RTNETLINK answers: Network is unreachable"
