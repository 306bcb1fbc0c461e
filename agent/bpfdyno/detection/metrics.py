"""The detection's metrics: each rank's always-on signal and what the detector decided, for
fleets that alert from Prometheus (deploy/prometheus/bpfdyno-rules.yml).

The job's label is ``job_id``: Prometheus gives every scraped series a ``job`` of its own
(the scrape job), which would rename ours."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricTable

TABLE = MetricTable("detection")

RANK_CPU_WAIT = TABLE.declare(
    "rank_cpu_wait_ratio",
    MetricKind.RATIO,
    "ratio",
    "Thread-seconds per second a training rank's threads were runnable but not on a CPU "
    "(run-queue wait, CPU-quota throttling included) over the last detection interval; "
    "ranks are registered trainers whose environment names a RANK.",
    ("job_id", "rank"),
)
RANK_PEER_WAIT = TABLE.declare(
    "rank_peer_wait_ratio",
    MetricKind.RATIO,
    "ratio",
    "Thread-seconds per second a gloo training rank's threads waited for their peers' data "
    "in gloo's collectives over the last detection interval (absent without gloo's probes): "
    "its job's straggler waits least, the peers waiting for it most.",
    ("job_id", "rank"),
)
RANK_INTERRUPT = TABLE.declare(
    "rank_interrupt_ratio",
    MetricKind.RATIO,
    "ratio",
    "The share of the time of the CPUs a training rank's threads ran on that went to device "
    "interrupt handlers and softirqs over the last detection interval, weighted by how long "
    "its threads ran on each (estimated from /proc/stat's ticks while the irq collector's "
    "BPF part is off or detached; absent without the irq collector).",
    ("job_id", "rank"),
)
RANK_IO = TABLE.declare(
    "rank_io_bytes_per_second",
    MetricKind.RATE,
    "bytes/s",
    "Bytes a training rank's read and write calls moved per second (sockets included) over "
    "the last detection interval: 0 for all of a job's ranks while it hangs.",
    ("job_id", "rank"),
)
RANK_NET_RTT = TABLE.declare(
    "rank_net_rtt_seconds",
    MetricKind.GAUGE,
    "seconds",
    "A training rank's network RTT score over the last detection interval: the least "
    "smoothed TCP RTT among its links to its job's other ranks that moved bytes (high only "
    "when every such link is slow); NaN without TCP connection data (the net collector off, "
    "a job on RDMA).",
    ("job_id", "rank"),
)
RANK_NET_RETRANSMITS = TABLE.declare(
    "rank_net_retransmits_per_second",
    MetricKind.RATE,
    "retransmits/s",
    "A training rank's network loss score over the last detection interval: the fewest TCP "
    "retransmits per second (both ends' sockets) among its links to its job's other ranks "
    "that moved bytes; NaN without TCP connection data.",
    ("job_id", "rank"),
)
SUSPECTED = TABLE.declare(
    "straggler_suspected",
    MetricKind.GAUGE,
    "boolean",
    "1 while the detector holds this rank suspected or confirmed as its job's straggler "
    "(it stood out from the job's median in enough of the last intervals), 0 otherwise.",
    ("job_id", "rank"),
)
CONFIRMED = TABLE.declare(
    "straggler_confirmed",
    MetricKind.GAUGE,
    "boolean",
    "1 while the detector holds this rank confirmed as its job's straggler, 0 otherwise.",
    ("job_id", "rank"),
)
HANG = TABLE.declare(
    "job_hang",
    MetricKind.GAUGE,
    "boolean",
    "1 while this job's ranks on this node have moved no bytes for [detection] "
    "hang_after_s or longer, 0 otherwise.",
    ("job_id",),
)
EVENTS = TABLE.declare(
    "detection_events_total",
    MetricKind.COUNTER,
    "events",
    "Detection events since the agent started, by kind (suspected, confirmed, cleared, hang, "
    "traced).",
    ("kind",),
)
