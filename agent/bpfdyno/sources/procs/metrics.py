"""Metrics describing the process table itself (its rows are served by the Kernel API)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricTable

TABLE = MetricTable("procs")

TABLE_ROWS = TABLE.declare(
    "process_table_rows",
    MetricKind.GAUGE,
    "rows",
    "Processes in the process table (the most active ones plus pinned trainers).",
)
REFRESH_SECONDS = TABLE.declare(
    "process_table_refresh_seconds",
    MetricKind.GAUGE,
    "seconds",
    "Time the last process table refresh took (reading /proc and joining BPF data).",
)
CACHE_ENTRIES = TABLE.declare(
    "process_table_cache_entries",
    MetricKind.GAUGE,
    "entries",
    "Entries in each of the process table's internal caches (flat under process churn).",
    labels=("cache",),
)

# Per-process families: one series per row of the process table (its ``top_n`` most active
# processes plus registered trainers), so their number is bounded however many processes
# come and go. The exporters read them from the table when they export
# (`bpfdyno.sources.procs.samples`); the API serves the same rows as ListProcesses.
PROCESS_LABELS = ("pid", "comm", "user", "slurm_job_id", "k8s_pod_uid")

PROCESS_CPU = TABLE.declare(
    "process_cpu_ratio",
    MetricKind.RATIO,
    "ratio",
    "CPU time of one process per second of the last refresh, all threads (above 1 on "
    "several cores); from /proc/<pid>/stat. Exporters only; the API has it in ListProcesses.",
    PROCESS_LABELS,
)
PROCESS_RSS = TABLE.declare(
    "process_rss_bytes",
    MetricKind.GAUGE,
    "bytes",
    "Resident memory of one process. Exporters only; the API has it in ListProcesses.",
    PROCESS_LABELS,
)
PROCESS_THREADS = TABLE.declare(
    "process_threads",
    MetricKind.GAUGE,
    "threads",
    "Threads of one process. Exporters only; the API has it in ListProcesses.",
    PROCESS_LABELS,
)
PROCESS_ONCPU = TABLE.declare(
    "process_oncpu_seconds_total",
    MetricKind.COUNTER,
    "seconds",
    "On-CPU time of one process since the sched collector started (BPF).",
    PROCESS_LABELS,
)
PROCESS_RUNQ_WAIT = TABLE.declare(
    "process_runqueue_wait_seconds_total",
    MetricKind.COUNTER,
    "seconds",
    "Time the threads of one process waited runnable for a CPU, since the sched collector "
    "started (BPF).",
    PROCESS_LABELS,
)
PROCESS_OFFCPU_BLOCKED = TABLE.declare(
    "process_offcpu_blocked_seconds_total",
    MetricKind.COUNTER,
    "seconds",
    "Time the threads of one process spent blocked (sleeping, I/O), since the sched "
    "collector started (BPF).",
    PROCESS_LABELS,
)
PROCESS_TCP_SENT = TABLE.declare(
    "process_tcp_sent_bytes_total",
    MetricKind.COUNTER,
    "bytes",
    "TCP payload bytes one process sent, since the net collector started (BPF).",
    PROCESS_LABELS,
)
PROCESS_TCP_RECEIVED = TABLE.declare(
    "process_tcp_received_bytes_total",
    MetricKind.COUNTER,
    "bytes",
    "TCP payload bytes one process received, since the net collector started (BPF).",
    PROCESS_LABELS,
)
PROCESS_UDP_SENT = TABLE.declare(
    "process_udp_sent_bytes_total",
    MetricKind.COUNTER,
    "bytes",
    "UDP payload bytes one process sent, since the net collector started (BPF).",
    PROCESS_LABELS,
)
PROCESS_UDP_RECEIVED = TABLE.declare(
    "process_udp_received_bytes_total",
    MetricKind.COUNTER,
    "bytes",
    "UDP payload bytes one process received, since the net collector started (BPF).",
    PROCESS_LABELS,
)
PROCESS_TCP_RETRANSMITS = TABLE.declare(
    "process_tcp_retransmits_total",
    MetricKind.COUNTER,
    "segments",
    "TCP segments of one process retransmitted, since the net collector started (BPF).",
    PROCESS_LABELS,
)
