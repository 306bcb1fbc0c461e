"""Metrics bpfdyno reports about its own BPF programs (run statistics)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricTable

TABLE = MetricTable("bpf")

BPF_RUN_NS_PER_EVENT = TABLE.declare(
    "bpf_program_run_ns_per_event",
    MetricKind.GAUGE,
    "ns",
    "Mean kernel run time of one invocation of a bpfdyno BPF program over the last "
    "run-statistics window (kernel BPF run stats, which add ~20 ns themselves).",
    labels=("program",),
)
BPF_RUNS_PER_SECOND = TABLE.declare(
    "bpf_program_runs_per_second",
    MetricKind.RATE,
    "1/s",
    "Invocations per second of a bpfdyno BPF program over the last run-statistics window.",
    labels=("program",),
)
