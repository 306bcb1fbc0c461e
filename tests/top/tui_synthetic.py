"""Deterministic synthetic recordings of a training node, for UI tests and the benchmark.

Everything is a pure function of the arguments (no randomness, no clock), so screenshots of
an app fed with these recordings are stable. Values vary smoothly from frame to frame so the
sparklines have something to draw.
"""

from __future__ import annotations

import math
from dataclasses import replace

from bpfdyno.rpc.processes import ProcessRow
from bpfdyno.tui.recorded import Frame, Recording
from bpfdyno.tui.records import (
    AgentStatus,
    CollectorInfo,
    KernelEventInfo,
    MetricSpecInfo,
    MetricsRound,
    MetricValue,
    ProcessTable,
    SeriesPoints,
    TraceProcess,
    TraceStatus,
    TrainerInfo,
)

BASE_TS = 1_700_000_000.0
NAN = float("nan")

SPECS = (
    *(
        MetricSpecInfo(f"cpu_{s}_ratio", "ratio", "ratio", labels=("cpu",), source="host")
        for s in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    ),
    MetricSpecInfo("cpu_utilization_ratio", "ratio", "ratio", labels=("cpu",), source="host"),
    MetricSpecInfo("context_switches_per_second", "rate", "1/s", source="host"),
    MetricSpecInfo("forks_per_second", "rate", "1/s", source="host"),
    MetricSpecInfo("procs_running", "gauge", "tasks", source="host"),
    MetricSpecInfo("procs_blocked", "gauge", "tasks", source="host"),
    MetricSpecInfo("memory_total_bytes", "gauge", "bytes", source="host"),
    MetricSpecInfo("memory_used_bytes", "gauge", "bytes", source="host"),
    MetricSpecInfo("memory_available_bytes", "gauge", "bytes", source="host"),
    MetricSpecInfo("memory_cached_bytes", "gauge", "bytes", source="host"),
    MetricSpecInfo("memory_buffers_bytes", "gauge", "bytes", source="host"),
    MetricSpecInfo("swap_total_bytes", "gauge", "bytes", source="host"),
    MetricSpecInfo("swap_used_bytes", "gauge", "bytes", source="host"),
    *(
        MetricSpecInfo(f"load_average_{s}", "gauge", "tasks", source="host")
        for s in ("1m", "5m", "15m")
    ),
    MetricSpecInfo("processes_total", "gauge", "processes", source="host"),
    MetricSpecInfo("threads_total", "gauge", "threads", source="host"),
    MetricSpecInfo("uptime_seconds", "gauge", "seconds", source="host"),
    *(
        MetricSpecInfo(f"disk_{k}_per_second", "rate", u, labels=("device",), source="host")
        for k, u in (
            ("read_bytes", "bytes/s"),
            ("write_bytes", "bytes/s"),
            ("reads", "1/s"),
            ("writes", "1/s"),
        )
    ),
    MetricSpecInfo("disk_busy_ratio", "ratio", "ratio", labels=("device",), source="host"),
    *(
        MetricSpecInfo(f"net_{k}_per_second", "rate", u, labels=("interface",), source="host")
        for k, u in (
            ("rx_bytes", "bytes/s"),
            ("tx_bytes", "bytes/s"),
            ("rx_packets", "1/s"),
            ("tx_packets", "1/s"),
            ("rx_drops", "1/s"),
            ("rx_errors", "1/s"),
        )
    ),
    MetricSpecInfo("agent_cpu_ratio", "ratio", "ratio", source="self"),
    MetricSpecInfo("agent_rss_bytes", "gauge", "bytes", source="self"),
    MetricSpecInfo("agent_threads", "gauge", "threads", source="self"),
    MetricSpecInfo("agent_open_fds", "gauge", "fds", source="self"),
    MetricSpecInfo(
        "bpf_program_run_ns_per_event", "gauge", "ns", labels=("program",), source="sched"
    ),
    MetricSpecInfo(
        "bpf_program_runs_per_second", "rate", "1/s", labels=("program",), source="sched"
    ),
    MetricSpecInfo(
        "sched_runqueue_latency_seconds", "gauge", "seconds", labels=("quantile",), source="sched"
    ),
    MetricSpecInfo(
        "sched_context_switches_per_second", "rate", "1/s", labels=("cpu",), source="sched"
    ),
    MetricSpecInfo("sched_migrations_per_second", "rate", "1/s", source="sched"),
    MetricSpecInfo("sched_execs_per_second", "rate", "1/s", source="sched"),
    MetricSpecInfo("net_tcp_sent_bytes_per_second", "rate", "bytes/s", source="net"),
    MetricSpecInfo("net_tcp_received_bytes_per_second", "rate", "bytes/s", source="net"),
    MetricSpecInfo("net_tcp_retransmits_per_second", "rate", "1/s", source="net"),
    MetricSpecInfo("net_tcp_resets_per_second", "rate", "1/s", labels=("direction",), source="net"),
    MetricSpecInfo("net_drops_per_second", "rate", "1/s", labels=("reason",), source="net"),
    MetricSpecInfo("net_tcp_established_connections", "gauge", "connections", source="net"),
    MetricSpecInfo("net_tcp_srtt_seconds", "gauge", "seconds", labels=("stat",), source="net"),
    MetricSpecInfo(
        "gpu_info", "gauge", "info", labels=("gpu", "uuid", "name", "pci_bus_id"), source="gpu"
    ),
    *(
        MetricSpecInfo(name, "gauge", unit, labels=("gpu", "uuid"), source="gpu")
        for name, unit in (
            ("gpu_up", "boolean"),
            ("gpu_utilization_ratio", "ratio"),
            ("gpu_memory_used_bytes", "bytes"),
            ("gpu_memory_total_bytes", "bytes"),
            ("gpu_power_watts", "watts"),
            ("gpu_power_limit_watts", "watts"),
            ("gpu_temperature_celsius", "celsius"),
            ("gpu_sm_active_ratio", "ratio"),
            ("gpu_sm_occupancy_ratio", "ratio"),
            ("gpu_tensor_active_ratio", "ratio"),
            ("gpu_dram_bw_util_ratio", "ratio"),
        )
    ),
)

GIB = 1 << 30


def wave(i: int, period: float, lo: float, hi: float, phase: float = 0.0) -> float:
    """A smooth value between ``lo`` and ``hi`` at frame ``i``."""
    return lo + (hi - lo) * (0.5 + 0.5 * math.sin(2 * math.pi * (i / period) + phase))


def host_round(i: int, ts: float, cores: int) -> MetricsRound:
    """The host collector's round at frame ``i``."""
    v: list[MetricValue] = []

    def add(name: str, value: float, **labels: str) -> None:
        v.append(MetricValue(name, tuple(labels.items()), value))

    for c in [*(str(n) for n in range(cores)), "total"]:
        util = wave(i, 20, 0.1, 0.9, phase=0 if c == "total" else int(c))
        user, system, iowait = util * 0.7, util * 0.25, 0.02
        add("cpu_user_ratio", user, cpu=c)
        add("cpu_system_ratio", system, cpu=c)
        add("cpu_iowait_ratio", iowait, cpu=c)
        add("cpu_irq_ratio", util * 0.03, cpu=c)
        add("cpu_softirq_ratio", util * 0.02, cpu=c)
        add("cpu_steal_ratio", 0.0, cpu=c)
        add("cpu_idle_ratio", 1 - util - iowait, cpu=c)
        add("cpu_utilization_ratio", util, cpu=c)
    add("context_switches_per_second", 12_345.0 + 100 * i)
    add("forks_per_second", 3.0)
    add("procs_running", 4.0)
    add("procs_blocked", 0.0)
    add("memory_total_bytes", 64.0 * GIB)
    add("memory_used_bytes", wave(i, 30, 20, 40) * GIB)
    add("memory_available_bytes", 64.0 * GIB - wave(i, 30, 20, 40) * GIB)
    add("memory_cached_bytes", 12.5 * GIB)
    add("memory_buffers_bytes", 0.25 * GIB)
    add("swap_total_bytes", 0.0)
    add("swap_used_bytes", 0.0)
    add("load_average_1m", 3.25)
    add("load_average_5m", 2.5)
    add("load_average_15m", 1.75)
    add("processes_total", 612.0)
    add("threads_total", 2048.0)
    add("uptime_seconds", 3 * 86400 + 4 * 3600 + i)
    add("disk_read_bytes_per_second", wave(i, 15, 1e6, 50e6), device="nvme0n1")
    add("disk_write_bytes_per_second", 2.5e6, device="nvme0n1")
    add("disk_reads_per_second", 120.0, device="nvme0n1")
    add("disk_writes_per_second", 40.0, device="nvme0n1")
    add("disk_busy_ratio", wave(i, 15, 0.05, 0.6), device="nvme0n1")
    for nic, scale in (("eth0", 1e8), ("lo", 1e5)):
        add("net_rx_bytes_per_second", wave(i, 10, 0.1, 1.0) * scale, interface=nic)
        add("net_tx_bytes_per_second", wave(i, 10, 0.1, 1.0, phase=1) * scale, interface=nic)
        add("net_rx_packets_per_second", 1500.0, interface=nic)
        add("net_tx_packets_per_second", 1400.0, interface=nic)
        add("net_rx_drops_per_second", 0.0, interface=nic)
        add("net_rx_errors_per_second", 0.0, interface=nic)
    return MetricsRound(ts, "host", tuple(v))


def self_round(i: int, ts: float) -> MetricsRound:
    """The agent's own cost at frame ``i``."""
    return MetricsRound(
        ts,
        "self",
        (
            MetricValue("agent_cpu_ratio", (), wave(i, 12, 0.004, 0.012)),
            MetricValue("agent_rss_bytes", (), 96.0 * (1 << 20) + 4096 * i),
            MetricValue("agent_threads", (), 9.0),
            MetricValue("agent_open_fds", (), 31.0),
        ),
    )


def bpf_round(i: int, ts: float, cores: int = 8) -> MetricsRound:
    """The sched collector's round: run-queue latency, switches, BPF run statistics."""
    v = [
        MetricValue("sched_runqueue_latency_seconds", (("quantile", "0.5"),), 12e-6),
        MetricValue("sched_runqueue_latency_seconds", (("quantile", "0.99"),), 1.25e-3),
        MetricValue("sched_migrations_per_second", (), 310.0),
        MetricValue("sched_execs_per_second", (), 3.0),
    ]
    v += [
        MetricValue("sched_context_switches_per_second", (("cpu", str(c)),), 1500.0)
        for c in range(cores)
    ]
    for prog, ns, runs in (("sched_switch", 92.0, 24_000.0), ("sched_wakeup", 48.0, 9_000.0)):
        labels = (("program", prog),)
        v.append(MetricValue("bpf_program_run_ns_per_event", labels, ns + (i % 5)))
        v.append(MetricValue("bpf_program_runs_per_second", labels, runs))
    return MetricsRound(ts, "sched", tuple(v))


def net_round(i: int, ts: float) -> MetricsRound:
    """The net collector's host-wide TCP totals."""
    return MetricsRound(
        ts,
        "net",
        (
            MetricValue("net_tcp_sent_bytes_per_second", (), wave(i, 10, 1e6, 9e7)),
            MetricValue("net_tcp_received_bytes_per_second", (), wave(i, 10, 1e6, 4e7, 1)),
            MetricValue("net_tcp_retransmits_per_second", (), 2.0 if i % 2 == 0 else 0.0),
            MetricValue("net_tcp_resets_per_second", (("direction", "sent"),), 1.0),
            MetricValue("net_tcp_resets_per_second", (("direction", "received"),), 0.0),
            MetricValue("net_drops_per_second", (("reason", "NO_SOCKET"),), 3.0),
            MetricValue("net_drops_per_second", (("reason", "TCP_CSUM"),), 1.0),
            MetricValue("net_tcp_established_connections", (), 42.0),
            MetricValue("net_tcp_srtt_seconds", (("stat", "p50"),), 85e-6),
            MetricValue("net_tcp_srtt_seconds", (("stat", "max"),), 2.5e-3),
        ),
    )


def gpu_round(i: int, ts: float, gpus: int, gpm: bool = True) -> MetricsRound:
    """Per-GPU metrics of ``gpus`` H100s."""
    v: list[MetricValue] = []
    for g in range(gpus):
        labels = (("gpu", str(g)), ("uuid", f"GPU-{g:08d}-0000-0000-0000-000000000000"))
        info = (*labels, ("name", "NVIDIA H100 80GB HBM3"), ("pci_bus_id", f"0000:{g:02x}:00.0"))
        v.append(MetricValue("gpu_info", info, 1.0))
        values = {
            "gpu_up": 1.0,
            "gpu_utilization_ratio": wave(i, 8, 0.6, 0.98, phase=g),
            "gpu_memory_used_bytes": 71.5 * GIB,
            "gpu_memory_total_bytes": 80.0 * GIB,
            "gpu_power_watts": 512.0 + g,
            "gpu_power_limit_watts": 700.0,
            "gpu_temperature_celsius": 64.0 + g,
        }
        if gpm:
            values |= {
                "gpu_sm_active_ratio": 0.81,
                "gpu_sm_occupancy_ratio": 0.42,
                "gpu_tensor_active_ratio": 0.37,
                "gpu_dram_bw_util_ratio": 0.55,
            }
        v += [MetricValue(k, labels, x) for k, x in values.items()]
    return MetricsRound(ts, "gpu", tuple(v))


def process_rows(n: int, i: int, trainer_pids: tuple[int, ...] = ()) -> tuple[ProcessRow, ...]:
    """``n`` processes with distinct, deterministic values."""
    rows = []
    for k in range(n):
        pid = 1000 + k * 7
        trainer = pid in trainer_pids
        rows.append(
            ProcessRow(
                pid=pid,
                comm="python" if trainer else f"worker{k % 13}",
                ppid=1,
                cmdline=(
                    f"python train.py --rank {trainer_pids.index(pid)}"
                    if trainer
                    else ("" if k % 10 == 9 else f"/usr/bin/worker{k % 13} --id {k}")
                ),
                user="alice" if k % 3 else "root",
                state="R" if k % 4 == 0 else "S",
                num_threads=1 + k % 8,
                start_unix_seconds=BASE_TS - 3600 + k,
                cpu_ratio=((k * 37) % 101) / 100 + (0.01 * (i % 3)),
                rss_bytes=(k * 7919 % 997 + 1) * (1 << 20),
                oncpu_ratio=((k * 37) % 101) / 100,
                runq_wait_ratio=(k % 17) / 100,
                offcpu_blocked_ratio=(k % 23) / 50,
                tcp_tx_bytes_per_second=float((k * 104729) % 10_000_000),
                tcp_rx_bytes_per_second=float((k * 15485863) % 5_000_000),
                udp_tx_bytes_per_second=0.0,
                udp_rx_bytes_per_second=0.0,
                tcp_retransmits_per_second=float(k % 5 == 0) * (k % 7),
                tcp_tx_bytes=k * 10_000_000,
                tcp_rx_bytes=k * 5_000_000,
                tcp_retransmits=k % 11,
                oncpu_ns=k * 1_000_000_000,
                runq_wait_ns=k * 10_000_000,
                offcpu_blocked_ns=k * 500_000_000,
                gpu_memory_bytes=(35 * GIB if trainer else None),
                slurm_job_id="5678" if trainer or k % 5 == 1 else "",
                container_id=f"{k:064x}" if k % 4 == 2 else "",
                cgroup=f"/system.slice/worker{k}.service",
                pinned=trainer,
            )
        )
    return tuple(rows)


def trainers(pids: tuple[int, ...], ts: float) -> tuple[TrainerInfo, ...]:
    """Registered trainers for ``pids`` (all in job 5678)."""
    return tuple(
        TrainerInfo(
            pid=p,
            job_id="5678",
            comm="python",
            state="idle" if n else "tracing",
            first_seen_ts=BASE_TS - 600,
            last_poll_ts=ts - 1,
            ancestors=(p, 900),
            trace_id="" if n else "t-0001",
            role="worker",
        )
        for n, p in enumerate(pids)
    )


def events(i: int, ts: float) -> tuple[KernelEventInfo, ...]:
    """A few kernel events per frame."""
    ns = int(ts * 1e9)
    out = [
        KernelEventInfo(
            ns + 1_000_000,
            "exec",
            20_000 + i,
            20_000 + i,
            "sh",
            (("filename", "/bin/sh"),),
        ),
    ]
    if i % 2 == 0:
        out.append(
            KernelEventInfo(
                ns + 2_000_000,
                "tcp_retransmit",
                1007,
                0,
                "python",
                (
                    ("saddr", "10.0.0.1"),
                    ("sport", "41000"),
                    ("daddr", "10.0.0.2"),
                    ("dport", "29500"),
                ),
            )
        )
    if i % 3 == 0:
        out.append(
            KernelEventInfo(
                ns + 3_000_000,
                "tcp_reset_received",
                1014,
                1014,
                "worker2",
                (("daddr", "10.0.0.9"), ("dport", "8080")),
            )
        )
    return tuple(out)


def status(gpu_state: str = "ok", gpu_reason: str = "") -> AgentStatus:
    """The agent's status with its collectors."""
    collectors = (
        CollectorInfo("host", "ok", "", 1.0, 3725, 0, 0.0021, BASE_TS),
        CollectorInfo("self", "ok", "", 1.0, 3725, 0, 0.0003, BASE_TS),
        CollectorInfo("sched", "ok", "", 1.0, 3725, 0, 0.0012, BASE_TS),
        CollectorInfo("net", "ok", "", 1.0, 3725, 2, 0.0009, BASE_TS),
        CollectorInfo("gpu", gpu_state, gpu_reason, 1.0, 3725 if gpu_state == "ok" else 0, 0),
        CollectorInfo("pmu", "unavailable", "no hardware PMU: perf_event_open ENOENT"),
    )
    return AgentStatus(
        version="1.0.0",
        hostname="node-a1",
        kernel_release="6.18.0",
        agent_uptime_s=3725.0,
        host_uptime_s=3 * 86400 + 4 * 3600.0,
        pid=4242,
        config_source="/etc/bpfdyno/bpfdyno.toml",
        started_ts=BASE_TS - 3725,
        collectors=collectors,
    )


def trace_script(pids: tuple[int, ...]) -> tuple[TraceStatus, ...]:
    """A trace going pending -> tracing -> written for ``pids``."""
    states = (("pending", "delivered"), ("running", "tracing"), ("done", "written"))
    out = []
    for overall, per in states:
        procs = tuple(
            TraceProcess(
                pid=p,
                state=per,
                path=f"/tmp/trace_{p}.json" if per == "written" else "",
                size_bytes=1_234_567 if per == "written" else None,
                message="" if per == "written" else "waiting for the next poll",
            )
            for p in pids
        )
        out.append(TraceStatus("t-0002", overall, procs, finished=overall == "done"))
    return tuple(out)


def make_recording(
    *,
    processes: int = 40,
    frames: int = 5,
    cores: int = 8,
    gpus: int = 2,
    gpm: bool = True,
    trainer_count: int = 2,
    with_events: bool = True,
    with_host: bool = True,
    unavailable: tuple[tuple[str, str], ...] = (),
    gpu_state: str = "ok",
    gpu_reason: str = "",
) -> Recording:
    """A recording of a training node, fully determined by the arguments."""
    trainer_pids = tuple(1000 + 7 * (3 + 10 * n) for n in range(trainer_count))
    trainer_pids = tuple(p for p in trainer_pids if (p - 1000) // 7 < processes)
    out: list[Frame] = []
    for i in range(frames):
        ts = BASE_TS + i
        rounds = [self_round(i, ts), bpf_round(i, ts, cores), net_round(i, ts)]
        if with_host:
            rounds.insert(0, host_round(i, ts, cores))
        if gpus and gpu_state == "ok":
            rounds.append(gpu_round(i, ts, gpus, gpm))
        out.append(
            Frame(
                ts=ts,
                rounds=tuple(rounds),
                processes=ProcessTable(ts, process_rows(processes, i, trainer_pids), 612),
                trainers=trainers(trainer_pids, ts),
                events=events(i, ts) if with_events else (),
            )
        )
    history = tuple(
        SeriesPoints(
            "cpu_utilization_ratio",
            (("cpu", "total"),),
            tuple((BASE_TS - 60 + k, wave(k, 20, 0.1, 0.9)) for k in range(60)),
        )
        for _ in range(1 if with_host else 0)
    )
    return Recording(
        status=status(gpu_state, gpu_reason),
        specs=SPECS,
        frames=tuple(out),
        history=history,
        interval_s=1.0,
        unavailable=unavailable,
        trace=trace_script(trainer_pids),
    )


def with_frames(rec: Recording, count: int) -> Recording:
    """The recording cut to its first ``count`` frames."""
    return replace(rec, frames=rec.frames[:count])
