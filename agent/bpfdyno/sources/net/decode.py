"""Turning net.bpf.c's records into Python values: events, connections, names.

The numeric enums (counter slots, event kinds) are read from ``bpf/net.h`` itself, so the C
header stays the only definition; TCP state numbers are kernel ABI (``include/net/tcp_states.h``).
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from bpfdyno.core.events import AttrValue, KernelEvent, MonotonicClock
from bpfdyno.core.text import shown_c_string
from bpfdyno.ebpf.headers import header_enum, header_text

AF_INET = 2
AF_INET6 = 10

TCP_ESTABLISHED = 1
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
    12: "NEW_SYN_RECV",
}

#: net.h ``enum net_event_kind`` member -> KernelEvent.kind
_KIND_NAMES = {
    "NET_EV_CONNECT": "tcp_connect",
    "NET_EV_ACCEPT": "tcp_accept",
    "NET_EV_CLOSE": "tcp_close",
    "NET_EV_RETRANSMIT": "tcp_retransmit",
    "NET_EV_RESET_SENT": "tcp_reset_sent",
    "NET_EV_RESET_RECEIVED": "tcp_reset_received",
}
#: Every kind of event the net collector produces.
NET_EVENT_KINDS = tuple(_KIND_NAMES.values())

NET_SOCK_TUPLE = 1
NET_SOCK_PASSIVE = 2


@cache
def net_header_enums() -> tuple[dict[str, int], dict[int, str]]:
    """(counter name -> slot, event kind number -> KernelEvent kind), from ``bpf/net.h``."""
    text = header_text("net.h")
    counters = header_enum(text, "net_counter")
    kinds = {num: _KIND_NAMES[name] for name, num in header_enum(text, "net_event_kind").items()}
    return counters, kinds


def net_control_slots() -> dict[str, int]:
    """Slots of the control array ``bpfdyno_nctl`` by name, from ``bpf/net.h``."""
    return header_enum(header_text("net.h"), "net_ctl")


@lru_cache(maxsize=4096)
def format_addr(family: int, raw: bytes) -> str:
    """Printable address from a 16-byte field (IPv4 in the first 4 bytes).

    Cached: the same few addresses come back in every listing and event (ipaddress's
    formatting costs tens of microseconds).
    """
    if family == AF_INET:
        return str(ipaddress.IPv4Address(bytes(raw[:4])))
    if family == AF_INET6:
        return str(ipaddress.IPv6Address(bytes(raw[:16])))
    return ""


def family_name(family: int) -> str:
    return {AF_INET: "ipv4", AF_INET6: "ipv6"}.get(family, "")


def state_name(state: int) -> str:
    return TCP_STATES.get(state, "UNKNOWN")


@dataclass(frozen=True, slots=True)
class ProcNet:
    """Cumulative network counters of one process since the collector started."""

    tcp_tx_bytes: int
    tcp_rx_bytes: int
    udp_tx_bytes: int
    udp_rx_bytes: int
    other_tx_bytes: int  # syscall fallback only: socket bytes of unknown protocol
    other_rx_bytes: int
    tcp_retransmits: int

    def byte_counts(self) -> tuple[int, int, int, int, int, int]:
        """Every byte counter, in field order (retransmits left out)."""
        return (
            self.tcp_tx_bytes,
            self.tcp_rx_bytes,
            self.udp_tx_bytes,
            self.udp_rx_bytes,
            self.other_tx_bytes,
            self.other_rx_bytes,
        )


@dataclass(frozen=True, slots=True)
class TcpConnection:
    """One TCP socket the kernel program is tracking (a connection, or one being set up)."""

    pid: int  # the process that last used it from process context; 0 if unknown
    comm: str
    family: str  # "ipv4" / "ipv6"
    saddr: str
    sport: int
    daddr: str
    dport: int
    state: str  # TCP state name, e.g. ESTABLISHED
    tx_bytes: int  # payload bytes sent/received since the collector started
    rx_bytes: int
    retransmits: int
    srtt_s: float  # smoothed RTT from the last sampled ACK; NaN if not sampled yet
    snd_cwnd: int | None  # congestion window in segments; None if not sampled yet
    established_ts_ns: int  # wall-clock epoch ns when it reached ESTABLISHED; 0 if unknown
    passive: bool  # accepted on a listener (vs. connected out)


def proc_from_leaf(leaf: Any) -> ProcNet:
    """ProcNet from a ``struct net_proc`` ctypes value."""
    return ProcNet(
        int(leaf.tcp_tx_bytes),
        int(leaf.tcp_rx_bytes),
        int(leaf.udp_tx_bytes),
        int(leaf.udp_rx_bytes),
        int(leaf.other_tx_bytes),
        int(leaf.other_rx_bytes),
        int(leaf.tcp_retransmits),
    )


def connection_from_leaf(s: Any, clock: MonotonicClock) -> TcpConnection | None:
    """TcpConnection from a ``struct net_sock`` ctypes value; None until its tuple is known."""
    if not s.flags & NET_SOCK_TUPLE:
        return None
    return TcpConnection(
        pid=int(s.tgid),
        comm=shown_c_string(bytes(s.comm)),
        family=family_name(s.family),
        saddr=format_addr(s.family, bytes(s.saddr)),
        sport=int(s.sport),
        daddr=format_addr(s.family, bytes(s.daddr)),
        dport=int(s.dport),
        state=state_name(s.state),
        tx_bytes=int(s.tx_bytes),
        rx_bytes=int(s.rx_bytes),
        retransmits=int(s.retransmits),
        srtt_s=s.srtt_us / 1e6 if s.srtt_us else math.nan,
        snd_cwnd=int(s.snd_cwnd) if s.srtt_us else None,
        established_ts_ns=clock.to_wall_ns(s.open_ns) if s.open_ns else 0,
        passive=bool(s.flags & NET_SOCK_PASSIVE),
    )


def event_from_record(
    e: Any,
    clock: MonotonicClock,
    kinds: Mapping[int, str],
    reset_reasons: Mapping[int, str],
) -> KernelEvent:
    """KernelEvent from a ``struct net_event`` ctypes value."""
    kind = kinds.get(int(e.kind), f"net_{int(e.kind)}")
    attrs: dict[str, AttrValue] = {
        "family": family_name(e.family),
        "saddr": format_addr(e.family, bytes(e.saddr)),
        "sport": int(e.sport),
        "daddr": format_addr(e.family, bytes(e.daddr)),
        "dport": int(e.dport),
        "state": state_name(e.state),
    }
    if kind in ("tcp_connect", "tcp_accept", "tcp_close"):
        attrs["oldstate"] = state_name(e.oldstate)
    if kind == "tcp_close":
        attrs["tx_bytes"] = int(e.tx_bytes)
        attrs["rx_bytes"] = int(e.rx_bytes)
        attrs["retransmits"] = int(e.detail)
        if e.duration_ns:
            attrs["duration_ns"] = int(e.duration_ns)
    elif kind == "tcp_reset_sent":
        attrs["reason"] = reset_reasons.get(int(e.detail), str(int(e.detail)))
    return KernelEvent(
        ts_ns=clock.to_wall_ns(int(e.ts_ns)),
        kind=kind,
        pid=int(e.tgid),
        tid=int(e.tid),
        comm=shown_c_string(bytes(e.comm)),
        attrs=attrs,
    )
