"""Metrics of the network collector (``bpf/net.bpf.c``)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable

TABLE = MetricTable("net")


def _rate(name: str, help: str, labels: tuple[str, ...] = ()) -> MetricSpec:
    return TABLE.declare(name, MetricKind.RATE, "1/s", help, labels)


TCP_SENT = TABLE.declare(
    "net_tcp_sent_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "TCP payload bytes sent by all processes (sock:sock_send_length; NaN on the syscall "
    "fallback, where the protocol is unknown).",
)
TCP_RECEIVED = TABLE.declare(
    "net_tcp_received_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "TCP payload bytes received by all processes (sock:sock_recv_length, MSG_PEEK excluded).",
)
UDP_SENT = TABLE.declare(
    "net_udp_sent_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "UDP payload bytes sent by all processes (sock:sock_send_length).",
)
UDP_RECEIVED = TABLE.declare(
    "net_udp_received_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "UDP payload bytes received by all processes (sock:sock_recv_length).",
)
OTHER_SENT = TABLE.declare(
    "net_other_sent_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "Socket bytes sent through sendto/sendmsg, protocol unknown: only on kernels without "
    "sock:sock_send_length (syscall fallback); NaN otherwise.",
)
OTHER_RECEIVED = TABLE.declare(
    "net_other_received_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "Socket bytes received through recvfrom/recvmsg, protocol unknown (syscall fallback only).",
)
RETRANSMITS = _rate(
    "net_tcp_retransmits_per_second", "TCP segments retransmitted (tcp:tcp_retransmit_skb)."
)
RESETS = _rate(
    "net_tcp_resets_per_second",
    "TCP resets sent or received (tcp:tcp_send_reset, tcp:tcp_receive_reset).",
    ("direction",),
)
OPENED = _rate(
    "net_tcp_connections_opened_per_second",
    "TCP connections established, active (connect) or passive (accept).",
    ("direction",),
)
CLOSED = _rate("net_tcp_connections_closed_per_second", "TCP sockets that reached TCP_CLOSE.")
DROPS = _rate(
    "net_drops_per_second",
    "Packets dropped by the kernel, by drop reason (skb:kfree_skb, enum skb_drop_reason).",
    ("reason",),
)
ESTABLISHED = TABLE.declare(
    "net_tcp_established_connections",
    MetricKind.GAUGE,
    "connections",
    "Tracked TCP connections currently in ESTABLISHED state (at most [net] max_socks sockets "
    "are tracked).",
)
SRTT = TABLE.declare(
    "net_tcp_srtt_seconds",
    MetricKind.GAUGE,
    "seconds",
    "Smoothed RTT across tracked connections (p50 and max of each connection's last sampled "
    "tcp:tcp_probe value; 1 in [net] probe_sample_every events is sampled per CPU).",
    labels=("stat",),
)
EVENTS_LOST = TABLE.declare(
    "net_events_lost_total",
    MetricKind.COUNTER,
    "events",
    "Network events lost because the BPF ring buffer was full (raise [net] ringbuf_pages).",
)
PROC_MAP_FULL = TABLE.declare(
    "net_process_map_full_total",
    MetricKind.COUNTER,
    "updates",
    "Per-process counter updates lost because the per-process map was full (raise [net] "
    "max_procs).",
)
