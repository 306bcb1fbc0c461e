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
