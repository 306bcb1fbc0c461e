"""Metrics of the scheduler collector (``bpf/sched.bpf.c``)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable

TABLE = MetricTable("sched")


def _declare(name: str, kind: MetricKind, unit: str, help: str, *labels: str) -> MetricSpec:
    return TABLE.declare(name, kind, unit, help, labels)


SWITCHES = _declare(
    "sched_context_switches_per_second",
    MetricKind.RATE,
    "1/s",
    "Context switches on one CPU (sched:sched_switch).",
    "cpu",
)
CPU_BUSY = _declare(
    "sched_cpu_busy_ratio",
    MetricKind.RATIO,
    "ratio",
    "Fraction of the interval one CPU ran non-idle threads, from the run queue's clock at "
    "each switch (time of periods that ended in the interval).",
    "cpu",
)
MIGRATIONS = _declare(
    "sched_migrations_per_second",
    MetricKind.RATE,
    "1/s",
    "Task migrations between CPUs, all CPUs (sched:sched_migrate_task).",
)
RUNQ_LATENCY = _declare(
    "sched_runqueue_latency_seconds",
    MetricKind.GAUGE,
    "seconds",
    "Run-queue latency quantile over the interval: time from wakeup or preemption until "
    "the thread ran (the kernel's own sched_info wait), interpolated within log2 buckets.",
    "quantile",
)
RUNQ_HISTOGRAM = _declare(
    "sched_runqueue_latency_histogram_seconds",
    MetricKind.HISTOGRAM,
    "seconds",
    "Run-queue latency of every wait since the collector started (time from wakeup or "
    "preemption until the thread ran): the kernel's log2 buckets, bound 2**(k+1) ns for "
    "slot k, waits over 2**36 ns (68.7 s) in +Inf. Exporters only (Prometheus, OTLP).",
)
RUNQ_MEAN = _declare(
    "sched_runqueue_latency_mean_seconds",
    MetricKind.GAUGE,
    "seconds",
    "Mean run-queue latency over the interval (exact: from the sum and count).",
)
RUNQ_WAITS = _declare(
    "sched_runqueue_waits_per_second",
    MetricKind.RATE,
    "1/s",
    "Run-queue waits (wakeups and preemptions) that ended with the thread running.",
)
ONCPU = _declare(
    "sched_oncpu_seconds_per_second",
    MetricKind.RATE,
    "s/s",
    "On-CPU time of all threads per second (busy cores), from the run queue's clock at each "
    "switch.",
)
OFFCPU = _declare(
    "sched_offcpu_seconds_per_second",
    MetricKind.RATE,
    "s/s",
    "Off-CPU thread-seconds per second, summed over all threads (so it exceeds the CPU "
    "count when many threads sleep): 'runnable' is time waiting in a run queue (run-queue "
    "waits that ended in the interval), 'blocked' the rest of the off-CPU time (sleep, I/O, "
    "locks) of the processes alive at both ends of the interval.",
    "state",
)
EXECS = _declare("sched_execs_per_second", MetricKind.RATE, "1/s", "Successful execve calls.")
EXITS = _declare("sched_process_exits_per_second", MetricKind.RATE, "1/s", "Processes exited.")
TRACKED_THREADS = _declare(
    "sched_tracked_threads",
    MetricKind.GAUGE,
    "threads",
    "Live threads the last collection read the kernel's scheduler accounting of.",
)
DROPPED = _declare(
    "sched_dropped_total",
    MetricKind.COUNTER,
    "1",
    "Kernel-side losses since start: exit_map_full (an exited thread's times were lost; raise "
    "[sched] max_exits), ringbuf_full (an exec/exit event was dropped; raise [sched] "
    "ringbuf_pages), task_storage (no task-local storage for a thread's state, so the "
    "blocked time reported for it may go back by a few microseconds between two reads; rare: "
    "the kernel refuses it when short of memory or when another task-storage call is in "
    "progress on that CPU).",
    "reason",
)
