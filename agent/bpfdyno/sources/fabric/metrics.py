"""Metrics of the fabric collector: RDMA ports (sysfs) and NIC driver statistics (ethtool)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable
from bpfdyno.sources.fabric.rdma import ERROR_COUNTERS

TABLE = MetricTable("fabric")

_PORT = ("device", "port")


def _declare(name: str, kind: MetricKind, unit: str, help: str, *labels: str) -> MetricSpec:
    return TABLE.declare(name, kind, unit, help, labels)


RDMA_DEVICES = _declare(
    "rdma_devices",
    MetricKind.GAUGE,
    "devices",
    "RDMA devices (InfiniBand or RoCE host channel adapters) in /sys/class/infiniband; 0 on "
    "a machine without any.",
)
PORT_INFO = _declare(
    "rdma_port_info",
    MetricKind.GAUGE,
    "1",
    "Always 1: what an RDMA port is and where it sits. link_layer InfiniBand or Ethernet "
    "(RoCE); netdev its network interface; pci the adapter's PCI address; numa_node; gpus "
    "the indices of the GPUs closest to it on the PCIe tree and gpu_link how they connect "
    "(PIX one switch, PXB several bridges, PHB the host bridge, NODE one NUMA node, SYS "
    "across nodes; as nvidia-smi topo says).",
    *_PORT,
    "link_layer",
    "netdev",
    "pci",
    "numa_node",
    "gpus",
    "gpu_link",
)
PORT_ACTIVE = _declare(
    "rdma_port_active",
    MetricKind.GAUGE,
    "1",
    "1 when the port's state is ACTIVE (it carries traffic), else 0.",
    *_PORT,
)
PORT_STATE = _declare(
    "rdma_port_state",
    MetricKind.GAUGE,
    "state",
    "The port's logical state: 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, 5 ACTIVE_DEFER.",
    *_PORT,
)
PORT_PHYS_STATE = _declare(
    "rdma_port_physical_state",
    MetricKind.GAUGE,
    "state",
    "The port's physical state: 1 Sleep, 2 Polling, 3 Disabled, 4 PortConfigurationTraining, "
    "5 LinkUp, 6 LinkErrorRecovery, 7 Phy Test.",
    *_PORT,
)
PORT_RATE = _declare(
    "rdma_port_rate_bits_per_second",
    MetricKind.GAUGE,
    "bits/s",
    "The port's active rate (all lanes), e.g. 200e9 for '200 Gb/sec (4X HDR)'.",
    *_PORT,
)
PORT_WIDTH = _declare(
    "rdma_port_width_lanes",
    MetricKind.GAUGE,
    "lanes",
    "The port's active link width (1X, 2X, 4X, 8X, 12X).",
    *_PORT,
)
PORT_BYTES = _declare(
    "rdma_port_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "Data through the port, all virtual lanes: counters port_xmit_data (tx) and "
    "port_rcv_data (rx), which count 4-byte words, times 4.",
    *_PORT,
    "direction",
)
PORT_PACKETS = _declare(
    "rdma_port_packets_per_second",
    MetricKind.RATE,
    "1/s",
    "Packets through the port: counters port_xmit_packets (tx) and port_rcv_packets (rx).",
    *_PORT,
    "direction",
)
PORT_ERRORS = _declare(
    "rdma_port_errors_per_second",
    MetricKind.RATE,
    "1/s",
    "Link, transport and drop errors of the port per second, summed over those of these "
    f"counters it has: counters/ {', '.join(ERROR_COUNTERS['counters'])}; hw_counters/ "
    f"{', '.join(ERROR_COUNTERS['hw_counters'])}.",
    *_PORT,
)
COUNTER_TOTAL = _declare(
    "rdma_counter_total",
    MetricKind.COUNTER,
    "counter's",
    "Every counter of the port as the device reports it: group 'counters' (the InfiniBand "
    "PMA counters; port_xmit_data and port_rcv_data in 4-byte words, port_xmit_wait in the "
    "device's ticks) and 'hw_counters' (the driver's: mlx5 np_cnp_sent, rp_cnp_handled, "
    "out_of_sequence, ...). A counter the device lacks is absent, never 0.",
    *_PORT,
    "group",
    "counter",
)
COUNTER_RATE = _declare(
    "rdma_counter_per_second",
    MetricKind.RATE,
    "counter's/s",
    "rdma_counter_total per second over the interval (a 32- or 64-bit wrap accounted for; "
    "no value for an interval in which the counter was reset).",
    *_PORT,
    "group",
    "counter",
)
UNREADABLE = _declare(
    "rdma_unreadable_counters",
    MetricKind.GAUGE,
    "counters",
    "Counter files of the port whose read failed this round (the firmware refused the "
    "query): they are left out, not read as 0.",
    *_PORT,
)

NIC_INFO = _declare(
    "nic_info",
    MetricKind.GAUGE,
    "1",
    "Always 1: a network interface's driver (ETHTOOL_GDRVINFO) and bus address ('' for a "
    "virtual one).",
    "interface",
    "driver",
    "bus",
)
NIC_CARRIER = _declare(
    "nic_carrier_up",
    MetricKind.GAUGE,
    "1",
    "1 when the interface has a carrier (link up), 0 when not or set down.",
    "interface",
)
NIC_CARRIER_CHANGES = _declare(
    "nic_carrier_changes_total",
    MetricKind.COUNTER,
    "changes",
    "Link ups and downs of the interface since it was created (sysfs carrier_changes).",
    "interface",
)
NIC_SPEED = _declare(
    "nic_link_speed_bits_per_second",
    MetricKind.GAUGE,
    "bits/s",
    "The interface's negotiated speed; absent while the driver does not know it.",
    "interface",
)
NIC_DUPLEX = _declare(
    "nic_link_full_duplex",
    MetricKind.GAUGE,
    "1",
    "1 for full duplex, 0 for half; absent while the driver does not know it.",
    "interface",
)
NIC_DISCARDS = _declare(
    "nic_discards_per_second",
    MetricKind.RATE,
    "1/s",
    "Frames the port itself discarded (no buffer, policy), from the driver's statistics "
    "(mlx5 rx_discards_phy / tx_discards_phy): drops the socket layer never sees.",
    "interface",
    "direction",
)
NIC_PAUSE = _declare(
    "nic_pause_frames_per_second",
    MetricKind.RATE,
    "1/s",
    "802.3x pause frames received (rx: the peer asked this port to stop) and sent (tx), "
    "from the driver's statistics (mlx5 rx_pause_ctrl_phy / tx_pause_ctrl_phy).",
    "interface",
    "direction",
)
NIC_PFC = _declare(
    "nic_pfc_pause_frames_per_second",
    MetricKind.RATE,
    "1/s",
    "Priority flow control pause frames of one priority (RoCE traffic class), received and "
    "sent, from the driver's statistics (mlx5 rx_prio<N>_pause / tx_prio<N>_pause).",
    "interface",
    "direction",
    "priority",
)
NIC_OUT_OF_BUFFER = _declare(
    "nic_out_of_buffer_drops_per_second",
    MetricKind.RATE,
    "1/s",
    "Packets dropped because no receive buffer was posted (the host did not keep up), from "
    "the driver's statistics (mlx5 rx_out_of_buffer).",
    "interface",
)
NIC_DRIVER_STAT = _declare(
    "nic_driver_statistic",
    MetricKind.GAUGE,
    "statistic's",
    "Every statistic of the interface's driver (ETHTOOL_GSTATS), named as the driver names "
    "it; most are cumulative counters (a few, like veth's peer_ifindex, are not). Per-queue "
    "ones only with [fabric] nic_queue_stats, at most [fabric] max_stats_per_interface.",
    "interface",
    "statistic",
)
NIC_STATS_OMITTED = _declare(
    "nic_driver_statistics_omitted",
    MetricKind.GAUGE,
    "statistics",
    "Driver statistics of the interface left out of nic_driver_statistic: per-queue ones "
    "([fabric] nic_queue_stats = false) and those over [fabric] max_stats_per_interface.",
    "interface",
)
