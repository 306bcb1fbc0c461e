"""The node behind an address a rank talks to, from this node's routes: pod networks.

On a Kubernetes pod network (flannel, Calico, ...) a job's ranks talk to each other at their
pods' addresses, where no agent listens: the agents listen on their nodes' addresses. This
node's routing table (the agent's network namespace: the node's, as a DaemonSet with the
host network runs it) says which node holds the pod behind an address:

* a route through a gateway on an ordinary or IP-in-IP device (flannel's host-gw, Calico's
  BGP and IPIP modes): the gateway is that node;
* a route through a VXLAN device (flannel's vxlan, Calico's VXLAN): the gateway is the
  remote node's address on the overlay; the neighbour table gives its link-layer address,
  and the device's forwarding database the node's own address (``dst``) it is sent to;
* no gateway (a directly attached network, this node's own pods), or the default route
  (the way out of the cluster, never a pod network's): no other node.

A gateway may also be a plain router: the caller asks the address found like any other
candidate and keeps it only if an agent there holds ranks of the job. Read with iproute2's
``ip`` and ``bridge`` (JSON output), each within a time-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
from dataclasses import dataclass
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: How long one ``ip``/``bridge`` command may take.
COMMAND_TIMEOUT_S = 2.0


class RouteError(Exception):
    """This node's routes could not be read (the text says why)."""


@dataclass(frozen=True, slots=True)
class NodeRoute:
    """Where an address's route leads.

    Attributes:
        node: the address of the node that holds it (its agent listens there).
        how: the route's kind and device, as the status names it ("gateway on eth0",
            "VXLAN flannel.1").
    """

    node: IPAddress
    how: str


async def _json(argv: list[str], timeout_s: float) -> Any:
    """The JSON an iproute2 command prints.

    Raises:
        RouteError: the command is missing, failed, took too long or printed no JSON.
    """
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            stdin=asyncio.subprocess.DEVNULL,
        )
    except OSError as e:
        raise RouteError(f"cannot run {argv[0]} ({e.strerror}): install iproute2") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise RouteError(f"{' '.join(argv)} took over {timeout_s:g} s") from None
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip().splitlines()
        raise RouteError(f"{' '.join(argv)}: {text[0] if text else f'exit {proc.returncode}'}")
    try:
        return json.loads(out or b"[]")
    except ValueError:
        raise RouteError(f"{' '.join(argv)} printed no JSON") from None


def _first(entries: Any) -> dict[str, Any]:
    return (
        entries[0] if isinstance(entries, list) and entries and isinstance(entries[0], dict) else {}
    )


async def node_behind(addr: IPAddress, timeout_s: float = COMMAND_TIMEOUT_S) -> NodeRoute | None:
    """The node this node's routes send ``addr`` to (None: no gateway, or a local address).

    Raises:
        RouteError: the routes could not be read, or a VXLAN route's node is not known.
    """
    route = _first(await _json(["ip", "-j", "route", "get", str(addr)], timeout_s))
    gateway, dev = route.get("gateway"), route.get("dev", "")
    if not gateway or route.get("type") == "local":
        return None
    defaults = await _json(["ip", "-j", "route", "show", "default"], timeout_s)
    if any(
        isinstance(d, dict) and d.get("gateway") == gateway and d.get("dev") == dev
        for d in (defaults if isinstance(defaults, list) else [])
    ):
        return None
    try:
        via = ipaddress.ip_address(gateway)
    except ValueError:
        raise RouteError(
            f"the route to {addr} has a gateway that is no address: {gateway}"
        ) from None
    link = _first(await _json(["ip", "-j", "-d", "link", "show", "dev", dev], timeout_s))
    info = link.get("linkinfo", {})
    if not isinstance(info, dict) or info.get("info_kind") != "vxlan":
        return NodeRoute(via, f"gateway on {dev}")
    # The gateway is the remote node's address on the overlay: its link-layer address is
    # sent to the node's own address.
    neigh = _first(
        await _json(["ip", "-j", "neigh", "show", "to", str(via), "dev", dev], timeout_s)
    )
    mac = str(neigh.get("lladdr", "")).lower()
    if mac:
        for entry in await _json(["bridge", "-j", "fdb", "show", "dev", dev], timeout_s):
            if isinstance(entry, dict) and str(entry.get("mac", "")).lower() == mac:
                with contextlib.suppress(ValueError):
                    return NodeRoute(ipaddress.ip_address(entry.get("dst", "")), f"VXLAN {dev}")
    # One remote for the whole device: every overlay address is sent there.
    data = info.get("info_data", {})
    remote = data.get("remote") if isinstance(data, dict) else None
    if remote:
        with contextlib.suppress(ValueError):
            return NodeRoute(ipaddress.ip_address(remote), f"VXLAN {dev}")
    raise RouteError(
        f"the route to {addr} goes through VXLAN {dev} via {via}, whose node is not in "
        f"its forwarding database{f' (link-layer address {mac})' if mac else ''}"
    )
