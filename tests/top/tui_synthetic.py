"""Deterministic synthetic recordings of a training node, for UI tests and the benchmark.

Everything is a pure function of the arguments (no randomness, no clock), so screenshots of
an app fed with these recordings are stable. Values vary smoothly from frame to frame so the
sparklines have something to draw.
"""

from __future__ import annotations

import math
from dataclasses import replace

from bpfdyno.app.catalog import CATALOG
from bpfdyno.rpc.agent import (
    AgentStatus,
    CollectorState,
    CollectorStatus,
    Label,
    MetricSpec,
    MetricsSnapshot,
    Point,
    Series,
)
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import ProcessList, ProcessRow
from bpfdyno.rpc.traces import (
    ProcessTrace,
    ProcessTraceState,
    TraceStart,
    TraceStatus,
    Trainer,
    TrainerRole,
    TrainerState,
    TriggeredProcess,
)
from bpfdyno.rpc.wire import from_pb, to_pb
from bpfdyno.tui.recorded import Frame, Recording

BASE_TS = 1_700_000_000.0
NAN = float("nan")


#: One series' value in a round: (name, label pairs, value).
MetricValue = tuple[str, tuple[tuple[str, str], ...], float]


def MetricsRound(ts: float, collector: str, values: tuple[MetricValue, ...]) -> MetricsSnapshot:
    """One streamed round: each value a one-point series."""
    series = tuple(
        Series(name, tuple(Label(k, v) for k, v in labels), (Point(ts, value),))
        for name, labels, value in values
    )
    return MetricsSnapshot(ts, collector, series)


#: What the synthetic agent declares: the daemon's own catalog, as ``ListMetricSpecs`` sends it.
SPECS = tuple(from_pb(MetricSpec, to_pb(spec, MetricSpec)) for spec in CATALOG)

GIB = 1 << 30


def wave(i: int, period: float, lo: float, hi: float, phase: float = 0.0) -> float:
    """A smooth value between ``lo`` and ``hi`` at frame ``i``."""
    return lo + (hi - lo) * (0.5 + 0.5 * math.sin(2 * math.pi * (i / period) + phase))


def host_round(i: int, ts: float, cores: int) -> MetricsRound:
    """The host collector's round at frame ``i``."""
    v: list[MetricValue] = []

    def add(name: str, value: float, **labels: str) -> None:
        v.append((name, tuple(labels.items()), value))

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
            ("agent_cpu_ratio", (), wave(i, 12, 0.004, 0.012)),
            ("agent_rss_bytes", (), 96.0 * (1 << 20) + 4096 * i),
            ("agent_threads", (), 9.0),
            ("agent_open_fds", (), 31.0),
        ),
    )


def bpf_round(i: int, ts: float, cores: int = 8) -> MetricsRound:
    """The sched collector's round: run-queue latency, switches, BPF run statistics."""
    v = [
        ("sched_runqueue_latency_seconds", (("quantile", "0.5"),), 12e-6),
        ("sched_runqueue_latency_seconds", (("quantile", "0.99"),), 1.25e-3),
        ("sched_migrations_per_second", (), 310.0),
        ("sched_execs_per_second", (), 3.0),
    ]
    v += [("sched_context_switches_per_second", (("cpu", str(c)),), 1500.0) for c in range(cores)]
    for prog, ns, runs in (("sched_switch", 92.0, 24_000.0), ("sched_wakeup", 48.0, 9_000.0)):
        labels = (("program", prog),)
        v.append(("bpf_program_run_ns_per_event", labels, ns + (i % 5)))
        v.append(("bpf_program_runs_per_second", labels, runs))
    return MetricsRound(ts, "sched", tuple(v))


def net_round(i: int, ts: float) -> MetricsRound:
    """The net collector's host-wide TCP totals."""
    return MetricsRound(
        ts,
        "net",
        (
            ("net_tcp_sent_bytes_per_second", (), wave(i, 10, 1e6, 9e7)),
            ("net_tcp_received_bytes_per_second", (), wave(i, 10, 1e6, 4e7, 1)),
            ("net_tcp_retransmits_per_second", (), 2.0 if i % 2 == 0 else 0.0),
            ("net_tcp_resets_per_second", (("direction", "sent"),), 1.0),
            ("net_tcp_resets_per_second", (("direction", "received"),), 0.0),
            ("net_drops_per_second", (("reason", "NO_SOCKET"),), 3.0),
            ("net_drops_per_second", (("reason", "TCP_CSUM"),), 1.0),
            ("net_tcp_established_connections", (), 42.0),
            ("net_tcp_srtt_seconds", (("stat", "p50"),), 85e-6),
            ("net_tcp_srtt_seconds", (("stat", "max"),), 2.5e-3),
        ),
    )


def fabric_round(i: int, ts: float, ports: int = 2) -> MetricsRound:
    """The fabric collector: ``ports`` RDMA ports (InfiniBand, then RoCE), a RoCE netdev with
    PFC pause frames."""
    v: list[MetricValue] = [("rdma_devices", (), float(ports))]
    for n in range(ports):
        roce = n % 2 == 1
        port = (("device", f"mlx5_{n}"), ("port", "1"))
        info = (
            ("link_layer", "Ethernet" if roce else "InfiniBand"),
            ("netdev", f"eth{n}" if roce else f"ib{n}"),
            ("pci", f"0000:{0x1B + n:02x}:00.0"),
            ("numa_node", str(n // 4)),
            ("gpus", str(n)),
            ("gpu_link", "PIX"),
        )
        v.append(("rdma_port_info", (*port, *info), 1.0))
        v += [
            ("rdma_port_state", port, 4.0),
            ("rdma_port_active", port, 1.0),
            ("rdma_port_rate_bits_per_second", port, 200e9 if roce else 400e9),
            ("rdma_port_bytes_per_second", (*port, ("direction", "tx")), wave(i, 8, 1e9, 2e10, n)),
            (
                "rdma_port_bytes_per_second",
                (*port, ("direction", "rx")),
                wave(i, 8, 1e9, 2e10, n + 1),
            ),
            ("rdma_port_errors_per_second", port, 0.0),
            (
                "rdma_counter_per_second",
                (*port, ("group", "counters"), ("counter", "port_xmit_wait")),
                1.5e3,
            ),
        ]
        if roce:
            for counter, rate in (("np_cnp_sent", 40.0), ("rp_cnp_handled", 12.0)):
                v.append(
                    (
                        "rdma_counter_per_second",
                        (*port, ("group", "hw_counters"), ("counter", counter)),
                        rate,
                    )
                )
            nic = (("interface", f"eth{n}"),)
            v += [
                ("nic_link_speed_bits_per_second", nic, 200e9),
                ("nic_discards_per_second", (*nic, ("direction", "rx")), 0.0),
                ("nic_pause_frames_per_second", (*nic, ("direction", "rx")), 0.0),
                (
                    "nic_pfc_pause_frames_per_second",
                    (*nic, ("direction", "rx"), ("priority", "3")),
                    120.0,
                ),
                ("nic_out_of_buffer_drops_per_second", nic, 0.0),
            ]
    return MetricsRound(ts, "fabric", tuple(v))


def irq_round(i: int, ts: float, cores: int) -> MetricsRound:
    """The interrupt collector: NET_RX mostly on CPU 1, TIMER and RCU everywhere."""
    v: list[MetricValue] = []
    for c in range(cores):
        cpu = (("cpu", str(c)),)
        net_rx = 0.2 if c == 1 else 0.01
        for name, share in (("NET_RX", net_rx), ("TIMER", 0.004), ("RCU", 0.002)):
            labels = (*cpu, ("softirq", name))
            v.append(("softirq_seconds_per_second", labels, share))
            v.append(("softirq_runs_per_second", labels, share * 1e6))
        v.append(("hardirq_seconds_per_second", cpu, 0.001))
    return MetricsRound(ts, "irq", tuple(v))


def gpu_round(i: int, ts: float, gpus: int, gpm: bool = True) -> MetricsRound:
    """Per-GPU metrics of ``gpus`` H100s."""
    v: list[MetricValue] = []
    for g in range(gpus):
        labels = (("gpu", str(g)), ("uuid", f"GPU-{g:08d}-0000-0000-0000-000000000000"))
        info = (*labels, ("name", "NVIDIA H100 80GB HBM3"), ("pci_bus_id", f"0000:{g:02x}:00.0"))
        v.append(("gpu_info", info, 1.0))
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
        v += [(k, labels, x) for k, x in values.items()]
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


def trainers(pids: tuple[int, ...], ts: float) -> tuple[Trainer, ...]:
    """Registered trainers for ``pids`` (all in job 5678)."""
    return tuple(
        Trainer(
            pid=p,
            job_id=5678,
            state=TrainerState.IDLE if n else TrainerState.TRACING,
            first_poll_unix_seconds=BASE_TS - 600,
            last_poll_unix_seconds=ts - 1,
            ancestors=(900,),
            trace_id="" if n else "t-0001",
            role=TrainerRole.WORKER,
        )
        for n, p in enumerate(pids)
    )


def events(i: int, ts: float) -> tuple[KernelEvent, ...]:
    """A few kernel events per frame."""
    ns = int(ts * 1e9)
    out = [
        KernelEvent(
            ns + 1_000_000,
            "exec",
            20_000 + i,
            20_000 + i,
            "sh",
            {"filename": "/bin/sh"},
        ),
    ]
    if i % 2 == 0:
        out.append(
            KernelEvent(
                ns + 2_000_000,
                "tcp_retransmit",
                1007,
                0,
                "python",
                {"saddr": "10.0.0.1", "sport": "41000", "daddr": "10.0.0.2", "dport": "29500"},
            )
        )
    if i % 3 == 0:
        out.append(
            KernelEvent(
                ns + 3_000_000,
                "tcp_reset_received",
                1014,
                1014,
                "worker2",
                {"daddr": "10.0.0.9", "dport": "8080"},
            )
        )
    return tuple(out)


def status(gpu_state: str = "ok", gpu_reason: str = "") -> AgentStatus:
    """The agent's status with its collectors."""
    ok = CollectorState.OK
    collectors = (
        CollectorStatus("host", ok, "", 1.0, 3725, 0, 0.0021, BASE_TS),
        CollectorStatus("self", ok, "", 1.0, 3725, 0, 0.0003, BASE_TS),
        CollectorStatus("sched", ok, "", 1.0, 3725, 0, 0.0012, BASE_TS),
        CollectorStatus("net", ok, "", 1.0, 3725, 2, 0.0009, BASE_TS),
        CollectorStatus(
            "gpu", CollectorState(gpu_state), gpu_reason, 1.0, 3725 if gpu_state == "ok" else 0
        ),
        CollectorStatus(
            "pmu", CollectorState.UNAVAILABLE, "no hardware PMU: perf_event_open ENOENT"
        ),
        CollectorStatus("fabric", ok, "", 1.0, 3725, 0, 0.0018, BASE_TS),
        CollectorStatus("irq", ok, "", 1.0, 3725, 0, 0.0004, BASE_TS),
    )
    return AgentStatus(
        version="1.0.0",
        hostname="node-a1",
        kernel_release="6.18.0",
        agent_uptime_seconds=3725.0,
        host_uptime_seconds=3 * 86400 + 4 * 3600.0,
        pid=4242,
        config_source="/etc/bpfdyno/bpfdyno.toml",
        started_unix_seconds=BASE_TS - 3725,
        collectors=collectors,
    )


def trace_script(pids: tuple[int, ...]) -> tuple[TraceStart, tuple[TraceStatus, ...]]:
    """A trace of ``pids``: started, then tracing, then written."""
    start = TraceStart(
        "t-0002",
        processes_matched=pids,
        triggered=tuple(TriggeredProcess(p, 5678, f"/tmp/trace_{p}.json") for p in pids),
    )
    out = []
    for per in (ProcessTraceState.TRACING, ProcessTraceState.WRITTEN):
        written = per is ProcessTraceState.WRITTEN
        procs = tuple(
            ProcessTrace(
                pid=p,
                job_id=5678,
                output_path=f"/tmp/trace_{p}.json",
                state=per,
                size_bytes=1_234_567 if written else -1,
                reason="" if written else "its profiler is busy with the trace",
            )
            for p in pids
        )
        out.append(TraceStatus("t-0002", processes=procs, done=written))
    return start, tuple(out)


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
    unavailable: dict[str, str] | None = None,
    gpu_state: str = "ok",
    gpu_reason: str = "",
    rdma_ports: int = 2,
) -> Recording:
    """A recording of a training node, fully determined by the arguments."""
    trainer_pids = tuple(1000 + 7 * (3 + 10 * n) for n in range(trainer_count))
    trainer_pids = tuple(p for p in trainer_pids if (p - 1000) // 7 < processes)
    out: list[Frame] = []
    for i in range(frames):
        ts = BASE_TS + i
        rounds = [
            self_round(i, ts),
            bpf_round(i, ts, cores),
            net_round(i, ts),
            fabric_round(i, ts, rdma_ports),
            irq_round(i, ts, cores),
        ]
        if with_host:
            rounds.insert(0, host_round(i, ts, cores))
        if gpus and gpu_state == "ok":
            rounds.append(gpu_round(i, ts, gpus, gpm))
        out.append(
            Frame(
                ts=ts,
                rounds=tuple(rounds),
                processes=ProcessList(process_rows(processes, i, trainer_pids), ts, 612),
                trainers=trainers(trainer_pids, ts),
                events=events(i, ts) if with_events else (),
            )
        )
    history = tuple(
        Series(
            "cpu_utilization_ratio",
            (Label("cpu", "total"),),
            tuple(Point(BASE_TS - 60 + k, wave(k, 20, 0.1, 0.9)) for k in range(60)),
        )
        for _ in range(1 if with_host else 0)
    )
    trace_start, trace = trace_script(trainer_pids)
    return Recording(
        status=status(gpu_state, gpu_reason),
        specs=SPECS,
        frames=tuple(out),
        history=history,
        interval_s=1.0,
        unavailable=dict(unavailable or {}),
        trace_start=trace_start,
        trace=trace,
    )


def with_frames(rec: Recording, count: int) -> Recording:
    """The recording cut to its first ``count`` frames."""
    return replace(rec, frames=rec.frames[:count])
