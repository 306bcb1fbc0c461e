"""Metrics of the interrupt collector (``bpf/irq.bpf.c`` and ``/proc/interrupts``)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricTable

TABLE = MetricTable("irq")

SOFTIRQ_TIME = TABLE.declare(
    "softirq_seconds_per_second",
    MetricKind.RATE,
    "s/s",
    "Time one CPU spent running one softirq (NET_RX, NET_TX, BLOCK, TIMER, ...) per second, "
    "measured in the kernel from irq:softirq_entry to softirq_exit, less the device "
    "interrupts that interrupted it; in ksoftirqd as well as on interrupt exit. A (CPU, "
    "softirq) pair is reported from its first run since the agent started.",
    ("cpu", "softirq"),
)
SOFTIRQ_RUNS = TABLE.declare(
    "softirq_runs_per_second",
    MetricKind.RATE,
    "1/s",
    "Runs of one softirq on one CPU per second (counted as /proc/softirqs counts them); "
    "reported for the same pairs as softirq_seconds_per_second.",
    ("cpu", "softirq"),
)
HARDIRQ_TIME = TABLE.declare(
    "hardirq_seconds_per_second",
    MetricKind.RATE,
    "s/s",
    "Time one CPU spent in device interrupt handlers per second (irq:irq_handler_entry to "
    "irq_handler_exit; the local timer and inter-processor interrupts do not go through "
    "them: irq_interrupts_per_second counts those).",
    ("cpu",),
)
HARDIRQ_RUNS = TABLE.declare(
    "hardirq_handler_runs_per_second",
    MetricKind.RATE,
    "1/s",
    "Device interrupt handler runs on one CPU per second (one per handler of a shared line).",
    ("cpu",),
)
INTERRUPTS = TABLE.declare(
    "irq_interrupts_per_second",
    MetricKind.RATE,
    "1/s",
    "Interrupts per second of one IRQ, all CPUs together (/proc/interrupts): numbered lines "
    "with the device's handlers as 'name' (e.g. mlx5_comp3@pci:0000:3b:00.0, nvidia), and "
    "the architecture's own lines (LOC, RES, CAL, TLB, ...) with their description.",
    ("irq", "name"),
)
CPU_INTERRUPTS = TABLE.declare(
    "irq_cpu_interrupts_per_second",
    MetricKind.RATE,
    "1/s",
    "Interrupts per second of one IRQ on one CPU (/proc/interrupts). A pair is reported once "
    "that IRQ has had interrupts on that CPU (since boot), at most [irq] max_irq_cpu_series "
    "pairs (irq_cpu_series_omitted counts the rest).",
    ("irq", "cpu"),
)
CPU_SERIES_OMITTED = TABLE.declare(
    "irq_cpu_series_omitted",
    MetricKind.GAUGE,
    "pairs",
    "(IRQ, CPU) pairs with interrupts that irq_cpu_interrupts_per_second leaves out because "
    "[irq] max_irq_cpu_series pairs are reported already.",
)
