"""The Kernel service's records (``kernel.proto``) besides the process table's: events and
TCP connections. Process rows and the table are in `bpfdyno.rpc.processes`.
"""

from __future__ import annotations

from dataclasses import field

from bpfdyno.rpc.v1 import kernel_pb2 as pb
from bpfdyno.rpc.wire import record

#: An event attribute's value.
AttrValue = int | float | str


@record(pb.KernelEvent)
class KernelEvent:
    """One kernel (or GPU) event: a retransmit, a drop, a reset, an exec, an XID...

    Attributes:
        unix_ns: wall-clock time, ns since the epoch.
        kind: what happened (``tcp_retransmit``, ``exec``...).
        pid, tid: the process and thread it is attributed to; 0 if unknown.
        comm: the process name as the kernel saw it.
        attrs: kind-specific details (addresses, ports, states, counts).
    """

    unix_ns: int
    kind: str
    pid: int = 0
    tid: int = 0
    comm: str = ""
    attrs: dict[str, AttrValue] = field(default_factory=dict)

    def detail(self) -> str:
        """The attributes as ``key=value`` words, by name."""
        return " ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.attrs.items()
        )


@record(pb.GetEventsResponse)
class EventsPage:
    """Events still held by the agent's flight recorder, oldest first, and what it evicted."""

    events: tuple[KernelEvent, ...] = ()
    evicted_age: int = 0
    evicted_memory: int = 0
    oldest_unix_ns: int = 0


@record(pb.TcpConnection)
class TcpConnection:
    """One TCP connection the net collector tracks (unknown RTT and window: None)."""

    pid: int
    comm: str = ""
    family: str = ""
    saddr: str = ""
    sport: int = 0
    daddr: str = ""
    dport: int = 0
    state: str = ""
    tx_bytes: int = 0
    rx_bytes: int = 0
    retransmits: int = 0
    srtt_seconds: float | None = None
    snd_cwnd: int | None = None
    established_unix_ns: int = 0
    passive: bool = False
