"""Detection peers of a job on a pod network: each rank in a pod (a network namespace of its
own behind its node's), the two nodes' pods joined by a VXLAN overlay as flannel's vxlan
mode builds it (per-node overlay addresses, static neighbour and forwarding entries), an
agent on each node listening on the node's address (as a DaemonSet with the host network).
The ranks talk to each other's pod addresses, where no agent listens: each agent finds the
other's node behind that address from its own routes, asks it under the trust rule (TLS, a
token, no peers configured) and pulls its rank."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import Pki, cleanup, make_pki
from test_torch_peers import RUN_ID, processes, start_rank, started_agents, wait_for_peer_parts

from bpfdyno.rpc.v1 import agent_pb2

pytestmark = pytest.mark.slow

#: The nodes' own addresses (the underlay), and their pods'.
NODE_A, NODE_B = "10.231.8.1", "10.231.8.2"
POD_A, POD_B = "10.244.1.2", "10.244.2.2"
PORT = 50652  # the agents' port (fresh namespaces: free)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def pod_network() -> Iterator[tuple[str, str, str, str]]:
    """Nodes A and B (namespaces joined by a veth pair), a pod behind each (a veth pair to
    its node, which forwards), and the VXLAN overlay between the nodes. Yields the nodes'
    namespaces and the pods' namespaces."""
    tag = str(os.getpid() % 100000)
    na, nb, pa, pb = (f"bdpp{tag}{x}" for x in ("na", "nb", "pa", "pb"))
    made: list[str] = []
    try:
        for ns in (na, nb, pa, pb):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", na, "link", "add", "ul", "type", "veth", "peer", "name", "ul", "netns", nb)
        nodes = ((na, NODE_A, pa, POD_A, 1), (nb, NODE_B, pb, POD_B, 2))
        for node_ns, node, pod_ns, pod, n in nodes:
            _ip("-n", node_ns, "addr", "add", f"{node}/24", "dev", "ul")
            _ip("-n", node_ns, "link", "set", "ul", "up")
            subprocess.run(
                ["ip", "netns", "exec", node_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"],
                check=True, capture_output=True,
            )  # fmt: skip
            # The pod: eth0 on the node's pod subnet, its MTU under the overlay's.
            _ip("-n", node_ns, "link", "add", "veth0", "type", "veth", "peer", "name", "eth0",
                "netns", pod_ns)  # fmt: skip
            _ip("-n", node_ns, "addr", "add", f"10.244.{n}.1/24", "dev", "veth0")
            _ip("-n", node_ns, "link", "set", "veth0", "up")
            _ip("-n", pod_ns, "addr", "add", f"{pod}/24", "dev", "eth0")
            _ip("-n", pod_ns, "link", "set", "eth0", "mtu", "1400", "up")
            _ip("-n", pod_ns, "route", "add", "default", "via", f"10.244.{n}.1")
            # The overlay: this node's VXLAN address 10.244.N.0, its MAC 02:00:0a:f4:0N:00.
            _ip("-n", node_ns, "link", "add", "flannel.1", "address", f"02:00:0a:f4:0{n}:00",
                "type", "vxlan", "id", "1", "local", node, "dev", "ul", "dstport", "8472",
                "nolearning")  # fmt: skip
            _ip("-n", node_ns, "addr", "add", f"10.244.{n}.0/32", "dev", "flannel.1")
            _ip("-n", node_ns, "link", "set", "flannel.1", "up")
        for node_ns, other, other_node in ((na, 2, NODE_B), (nb, 1, NODE_A)):
            mac = f"02:00:0a:f4:0{other}:00"
            _ip("-n", node_ns, "route", "add", f"10.244.{other}.0/24", "via",
                f"10.244.{other}.0", "dev", "flannel.1", "onlink")  # fmt: skip
            _ip("-n", node_ns, "neigh", "add", f"10.244.{other}.0", "lladdr", mac, "dev",
                "flannel.1", "nud", "permanent")  # fmt: skip
            subprocess.run(
                ["ip", "netns", "exec", node_ns, "bridge", "fdb", "append", mac, "dev",
                 "flannel.1", "dst", other_node],
                check=True, capture_output=True,
            )  # fmt: skip
        yield na, nb, pa, pb
    finally:
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def test_each_agent_finds_the_other_at_the_node_behind_its_rank_s_pod_peer(
    torch_python: str,
) -> None:
    base = Path(tempfile.mkdtemp(prefix="bdpp-", dir="/tmp"))
    base.chmod(0o755)
    try:
        pki: Pki = make_pki(base / "pki", [NODE_A, NODE_B])
        trace_dir = base / "traces"
        trace_dir.mkdir()
        env = {"BPFDYNO_TLS_CA": str(pki.ca), "BPFDYNO_TOKEN_FILE": str(pki.token)}
        with pod_network() as (na, nb, pa, pb), processes() as procs:
            nodes = {"a": (NODE_A, na), "b": (NODE_B, nb)}
            with started_agents(nodes, PORT, base, pki, trace_dir, env) as agents:
                logs = [base / "rank-0.log", base / "rank-1.log"]
                start_rank(procs, pa, "eth0", 0, agents["a"], logs[0], master=POD_A)
                start_rank(procs, pb, "eth0", 1, agents["b"], logs[1], master=POD_A)
                found = "found from its ranks' connections"
                expected = {
                    "a": (
                        agent_pb2.COLLECTOR_STATE_OK,
                        f"pulling rank signals from 1 peers of job {RUN_ID} ({found}) "
                        f"({NODE_B}, the node of {POD_B}: 1 ranks)",
                    ),
                    "b": (
                        agent_pb2.COLLECTOR_STATE_OK,
                        f"pulling rank signals from 1 peers of job {RUN_ID} ({found}) "
                        f"({NODE_A}, the node of {POD_A}: 1 ranks)",
                    ),
                }
                wait_for_peer_parts(agents, expected, logs)
    finally:
        cleanup(base)
