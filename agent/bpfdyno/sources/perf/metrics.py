"""Metrics of the per-CPU perf counter collectors: ``pmu`` (hardware) and ``perf_sw`` (software)."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable

PMU_TABLE = MetricTable("pmu")
PERF_SW_TABLE = MetricTable("perf_sw")
_TABLES = {t.source: t for t in (PMU_TABLE, PERF_SW_TABLE)}


def _declare(name: str, kind: MetricKind, unit: str, help: str, source: str) -> MetricSpec:
    return _TABLES[source].declare(name, kind, unit, help, labels=("cpu",))


IPC = _declare(
    "pmu_instructions_per_cycle",
    MetricKind.GAUGE,
    "instructions/cycle",
    'Instructions retired per CPU cycle over the interval (hardware PMU); cpu="all" is the '
    "host-wide ratio.",
    "pmu",
)
MIPS = _declare(
    "pmu_million_instructions_per_second",
    MetricKind.RATE,
    "1e6/s",
    "Millions of instructions retired per second (MIPS) over the interval (hardware PMU).",
    "pmu",
)
CYCLES = _declare(
    "pmu_cycles_per_second",
    MetricKind.RATE,
    "1/s",
    "CPU cycles per second (hardware PMU; excludes halted time).",
    "pmu",
)
CACHE_MISSES = _declare(
    "pmu_cache_misses_per_second",
    MetricKind.RATE,
    "1/s",
    "Last-level cache misses per second (hardware PMU; NaN where the PMU lacks the event).",
    "pmu",
)
PAGE_FAULTS = _declare(
    "perf_page_faults_per_second",
    MetricKind.RATE,
    "1/s",
    "Page faults (minor and major) per second on one CPU (perf software counter).",
    "perf_sw",
)
MAJOR_FAULTS = _declare(
    "perf_major_page_faults_per_second",
    MetricKind.RATE,
    "1/s",
    "Major page faults (needing I/O) per second on one CPU (perf software counter).",
    "perf_sw",
)
CTX_SWITCHES = _declare(
    "perf_context_switches_per_second",
    MetricKind.RATE,
    "1/s",
    "Context switches per second on one CPU (perf software counter).",
    "perf_sw",
)
MIGRATIONS = _declare(
    "perf_cpu_migrations_per_second",
    MetricKind.RATE,
    "1/s",
    "Task migrations to this CPU per second (perf software counter).",
    "perf_sw",
)
CPU_CLOCK = _declare(
    "perf_cpu_clock_seconds_per_second",
    MetricKind.RATE,
    "s/s",
    "Time the cpu-clock counter ran per second; about 1 when counting works (system-wide it "
    "runs at wall-clock speed), less if the CPU was offline.",
    "perf_sw",
)
