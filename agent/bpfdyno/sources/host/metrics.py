"""Metrics of the host collector (procfs) and the tables that feed them."""

from __future__ import annotations

from collections.abc import Callable

from bpfdyno.core.metrics import MetricKind, MetricSpec, MetricTable
from bpfdyno.sources.host import procfs
from bpfdyno.sources.host.procfs import DiskStats, NetDev

TABLE = MetricTable("host")
#: The agent's own footprint (the ``self`` collector).
SELF_TABLE = MetricTable("self")

_GAUGE, _RATE, _RATIO = MetricKind.GAUGE, MetricKind.RATE, MetricKind.RATIO


def _declare(
    name: str, kind: MetricKind, unit: str, help: str, labels: tuple[str, ...] = ()
) -> MetricSpec:
    return TABLE.declare(name, kind, unit, help, labels)


# --- CPU (/proc/stat) ---------------------------------------------------------------------
_CPU_STATE_HELP = {
    "user": "in user mode (guest time included)",
    "nice": "in user mode at a positive nice value (guest nice time included)",
    "system": "in kernel mode",
    "idle": "idle with no I/O outstanding",
    "iowait": "idle while waiting for I/O",
    "irq": "servicing hardware interrupts",
    "softirq": "servicing soft interrupts",
    "steal": "waiting for the hypervisor to run it (stolen by other guests)",
}
#: One ratio spec per /proc/stat CPU state, in the order of `CpuTimes`' fields.
CPU_STATE_RATIOS: tuple[MetricSpec, ...] = tuple(
    _declare(
        f"cpu_{state}_ratio",
        _RATIO,
        "ratio",
        f"Share (0..1) of the CPU time accounted in the interval that was spent {what}, "
        'per core and for cpu="total", from the tick deltas of /proc/stat.',
        ("cpu",),
    )
    for state, what in _CPU_STATE_HELP.items()
)
CPU_UTILIZATION = _declare(
    "cpu_utilization_ratio",
    _RATIO,
    "ratio",
    "Share (0..1) of the CPU time accounted in the interval that was busy (1 - idle - iowait), "
    'per core and for cpu="total", from the tick deltas of /proc/stat.',
    ("cpu",),
)
CONTEXT_SWITCHES = _declare(
    "context_switches_per_second",
    _RATE,
    "1/s",
    "Context switches per second on all CPUs over the interval, from ctxt in /proc/stat.",
)
FORKS = _declare(
    "forks_per_second",
    _RATE,
    "1/s",
    "Processes and threads created per second over the interval, from processes in /proc/stat.",
)
PROCS_RUNNING = _declare(
    "procs_running",
    _GAUGE,
    "tasks",
    "Number of runnable tasks (threads) at the time of reading, from procs_running in /proc/stat.",
)
PROCS_BLOCKED = _declare(
    "procs_blocked",
    _GAUGE,
    "tasks",
    "Number of tasks (threads) blocked waiting for I/O at the time of reading, from "
    "procs_blocked in /proc/stat.",
)

# --- Memory (/proc/meminfo) ---------------------------------------------------------------
MEMORY_TOTAL = _declare(
    "memory_total_bytes", _GAUGE, "bytes", "Usable RAM in bytes, from MemTotal in /proc/meminfo."
)
MEMORY_USED = _declare(
    "memory_used_bytes",
    _GAUGE,
    "bytes",
    "RAM in use in bytes, MemTotal - MemAvailable from /proc/meminfo (what cannot be "
    "reclaimed without swapping).",
)
MEMORY_AVAILABLE = _declare(
    "memory_available_bytes",
    _GAUGE,
    "bytes",
    "RAM in bytes the kernel estimates is available for new work without swapping, from "
    "MemAvailable in /proc/meminfo.",
)
MEMORY_FREE = _declare(
    "memory_free_bytes",
    _GAUGE,
    "bytes",
    "RAM in bytes not used for anything, from MemFree in /proc/meminfo.",
)
MEMORY_CACHED = _declare(
    "memory_cached_bytes",
    _GAUGE,
    "bytes",
    "Page cache plus reclaimable slab in bytes, Cached + SReclaimable from /proc/meminfo.",
)
MEMORY_BUFFERS = _declare(
    "memory_buffers_bytes",
    _GAUGE,
    "bytes",
    "Block device buffers in bytes, from Buffers in /proc/meminfo.",
)
SWAP_TOTAL = _declare(
    "swap_total_bytes", _GAUGE, "bytes", "Swap space in bytes, from SwapTotal in /proc/meminfo."
)
SWAP_USED = _declare(
    "swap_used_bytes",
    _GAUGE,
    "bytes",
    "Swap space in use in bytes, SwapTotal - SwapFree from /proc/meminfo.",
)

# --- Load, tasks, uptime (/proc/loadavg, /proc, /proc/uptime) ------------------------------
LOAD_1M, LOAD_5M, LOAD_15M = (
    _declare(
        f"load_average_{span}",
        _GAUGE,
        "tasks",
        f"Average number of runnable plus uninterruptible tasks over the last {what}, from "
        f"the {field} field of /proc/loadavg.",
    )
    for span, what, field in (
        ("1m", "minute", "1st"),
        ("5m", "5 minutes", "2nd"),
        ("15m", "15 minutes", "3rd"),
    )
)
THREADS = _declare(
    "threads_total",
    _GAUGE,
    "threads",
    "Number of threads on the host, kernel threads included, from the total after the slash "
    "in the 4th field of /proc/loadavg.",
)
PROCESSES = _declare(
    "processes_total",
    _GAUGE,
    "processes",
    "Number of processes on the host, kernel threads included, counted as the numeric "
    "directories of /proc.",
)
UPTIME = _declare(
    "uptime_seconds",
    _GAUGE,
    "seconds",
    "Seconds since the host booted, from the 1st field of /proc/uptime.",
)

# --- Disks (/proc/diskstats, /sys/block) ---------------------------------------------------
_DISK = (
    " over the interval on one whole block device (that has done I/O since boot), from "
    "/proc/diskstats."
)
_SECTOR = procfs.DISKSTATS_SECTOR_BYTES
_DISK_DEFS: tuple[tuple[str, str, str, Callable[[DiskStats], int]], ...] = (
    ("read_bytes", "bytes/s", "Bytes read (sectors x 512)", lambda d: d.sectors_read * _SECTOR),
    (
        "write_bytes",
        "bytes/s",
        "Bytes written (sectors x 512)",
        lambda d: d.sectors_written * _SECTOR,
    ),
    ("reads", "1/s", "Read operations completed", lambda d: d.reads),
    ("writes", "1/s", "Write operations completed", lambda d: d.writes),
)
#: (spec, counter) for each per-device rate.
DISK_RATES: tuple[tuple[MetricSpec, Callable[[DiskStats], int]], ...] = tuple(
    (
        _declare(f"disk_{key}_per_second", _RATE, unit, f"{what} per second{_DISK}", ("device",)),
        counter,
    )
    for key, unit, what, counter in _DISK_DEFS
)
DISK_BUSY = _declare(
    "disk_busy_ratio",
    _RATIO,
    "ratio",
    "Share (0..1) of the interval during which one whole block device had I/O in flight "
    "(io_ticks delta / interval), from /proc/diskstats.",
    ("device",),
)

# --- Network interfaces (/proc/net/dev) ------------------------------------------------------
_NET = " per second over the interval on one interface, from /proc/net/dev."
_NET_DEFS: tuple[tuple[str, str, str, Callable[[NetDev], int]], ...] = (
    ("rx_bytes", "bytes/s", "Bytes received", lambda d: d.rx_bytes),
    ("tx_bytes", "bytes/s", "Bytes sent", lambda d: d.tx_bytes),
    ("rx_packets", "1/s", "Packets received", lambda d: d.rx_packets),
    ("tx_packets", "1/s", "Packets sent", lambda d: d.tx_packets),
    ("rx_errors", "1/s", "Receive errors", lambda d: d.rx_errors),
    ("tx_errors", "1/s", "Transmit errors", lambda d: d.tx_errors),
    ("rx_drops", "1/s", "Received packets dropped", lambda d: d.rx_drops),
    ("tx_drops", "1/s", "Packets dropped on transmit", lambda d: d.tx_drops),
)
#: (spec, counter) for each per-interface rate.
NET_RATES: tuple[tuple[MetricSpec, Callable[[NetDev], int]], ...] = tuple(
    (_declare(f"net_{key}_per_second", _RATE, unit, what + _NET, ("interface",)), counter)
    for key, unit, what, counter in _NET_DEFS
)

SOURCE_UP = _declare(
    "host_source_up",
    _GAUGE,
    "boolean",
    "1 when the host collector read and parsed this source (a path under its root such as "
    "proc/stat) in its last round, 0 when that failed (a log line says why).",
    ("source",),
)

# --- The agent itself (/proc/self) -----------------------------------------------------------
AGENT_CPU = SELF_TABLE.declare(
    "agent_cpu_ratio",
    MetricKind.RATIO,
    "ratio",
    "CPU time (user + system, all threads) the agent used over the interval as a ratio of one "
    "core (above 1 when several threads ran at once), from CLOCK_PROCESS_CPUTIME_ID.",
)
AGENT_RSS = SELF_TABLE.declare(
    "agent_rss_bytes",
    MetricKind.GAUGE,
    "bytes",
    "Resident memory of the agent process in bytes, from /proc/self/statm.",
)
AGENT_THREADS = SELF_TABLE.declare(
    "agent_threads",
    MetricKind.GAUGE,
    "threads",
    "Number of threads in the agent process, from Threads in /proc/self/status.",
)
AGENT_OPEN_FDS = SELF_TABLE.declare(
    "agent_open_fds",
    MetricKind.GAUGE,
    "fds",
    "Number of file descriptors the agent process holds open, from /proc/self/fd.",
)
