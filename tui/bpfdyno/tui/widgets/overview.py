"""The Overview tab: CPU per core, memory, load, disks, NICs, the kernel's view, the fabric
(RDMA ports, NIC drops and pause frames, softirq time) and one panel per GPU.

Each panel is a `Static` rebuilt from the metrics model on the refresh tick; widths adapt to
the terminal (sparklines take the room left over, per-core bars wrap into columns), so the
tab works at 80x24 and fills a 200-column terminal. A panel whose collector is not running
says so, with the agent's reason, instead of showing zeros.
"""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from bpfdyno.tui.fmt import (
    bar,
    fmt_bytes,
    fmt_duration,
    fmt_percent,
    fmt_seconds,
    fmt_si,
    sparkline,
)
from bpfdyno.tui.model import MetricsModel, TopState

TOTAL = (("cpu", "total"),)
#: Width of one per-core cell, "  12 ██████████  45%", and the gap between cells.
CORE_CELL = 20
CORE_GAP = 2
LABEL = 6
#: Longest sparkline: a minute at the default 1 s interval reads well; more is noise.
MAX_SPARK = 60


def no_wrap(text: Text) -> Text:
    """Crop instead of wrapping: a wrapped line would break the panel's columns."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


def level_style(ratio: float) -> str:
    """Green, yellow or red by how full something is."""
    if math.isnan(ratio):
        return "dim"
    if ratio >= 0.9:
        return "bold red"
    if ratio >= 0.7:
        return "yellow"
    return "green"


def unavailable_reason(state: TopState, collector: str, what: str) -> Text:
    """Why nothing is shown for ``what``: from the collector's status, or the connection."""
    st = state.status.collector(collector) if state.status else None
    if state.status is None:
        return Text(f"{what}: no data yet (not connected to the agent)", style="dim")
    if st is None:
        return Text(f"{what}: not reported by this agent", style="dim")
    if st.state in ("ok", "starting"):
        return Text(f"{what}: waiting for the first collection", style="dim")
    return Text(f"{st.state}: {st.reason or 'no reason given'}", style="yellow")


def label_grid() -> Table:
    """Two columns: a bold label, then text that wraps under itself (hanging indent)."""
    grid = Table.grid()
    grid.add_column(width=LABEL, style="bold", no_wrap=True)
    grid.add_column(ratio=1)
    return grid


def unavailable_line(label: str, state: TopState, collector: str, what: str) -> Table:
    """``LABEL why-not`` for a panel with nothing to show."""
    grid = label_grid()
    grid.add_row(label, unavailable_reason(state, collector, what))
    return grid


class CpuPanel(Static):
    """Total CPU with history, its split by state, and one bar per core."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the model."""
        m = state.metrics
        width = max(40, self.size.width or 80)
        util = m.latest("cpu_utilization_ratio", TOTAL)
        if math.isnan(util):
            self.update(unavailable_line("CPU", state, "host", "CPU"))
            return
        parts = [
            ("usr", m.latest("cpu_user_ratio", TOTAL)),
            ("sys", m.latest("cpu_system_ratio", TOTAL)),
            ("iow", m.latest("cpu_iowait_ratio", TOTAL)),
            ("irq", m.latest("cpu_irq_ratio", TOTAL) + m.latest("cpu_softirq_ratio", TOTAL)),
            ("stl", m.latest("cpu_steal_ratio", TOTAL)),
        ]
        tail = " ".join(f"{k} {fmt_percent(v):>4}" for k, v in parts)
        rates = (
            f"  ctx {fmt_si(m.latest('context_switches_per_second'), '/s')}"
            f" fork {fmt_si(m.latest('forks_per_second'), '/s')}"
        )
        if width - LABEL - 6 - len(tail) - len(rates) >= 12:
            tail += rates
        spark_w = max(4, min(MAX_SPARK, width - LABEL - 6 - len(tail) - 2))
        text = Text("CPU".ljust(LABEL), style="bold")
        text.append(f"{fmt_percent(util):>4} ", style=level_style(util))
        text.append(sparkline(m.history("cpu_utilization_ratio", TOTAL), spark_w, top=1.0))
        text.append("  " + tail)
        cores = [c for c in m.label_values("cpu_utilization_ratio", "cpu") if c != "total"]
        per_row = max(1, (width + CORE_GAP) // (CORE_CELL + CORE_GAP))
        for i, cpu in enumerate(cores):
            text.append("\n" if i % per_row == 0 else "  ")
            r = m.latest("cpu_utilization_ratio", (("cpu", cpu),))
            text.append(f"{cpu:>4} ")
            text.append(bar(r, 10), style=level_style(r))
            text.append(f" {fmt_percent(r):>4}")
        self.update(no_wrap(text))


class MemoryPanel(Static):
    """Memory, swap, load averages, tasks and uptime."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the model."""
        m = state.metrics
        width = max(40, self.size.width or 80)
        total = m.latest("memory_total_bytes")
        used = m.latest("memory_used_bytes")
        if math.isnan(total) or math.isnan(used):
            self.update(unavailable_line("MEM", state, "host", "memory"))
            return
        ratio = used / total if total > 0 else math.nan
        text = Text("MEM".ljust(LABEL), style="bold")
        text.append(f"{fmt_bytes(used)}/{fmt_bytes(total)} ")
        text.append(bar(ratio, 10), style=level_style(ratio))
        text.append(f" {fmt_percent(ratio):>4}")
        text.append(
            f"  avail {fmt_bytes(m.latest('memory_available_bytes'))}"
            f" cache {fmt_bytes(m.latest('memory_cached_bytes'))}"
            f" buf {fmt_bytes(m.latest('memory_buffers_bytes'))}"
        )
        swap_total = m.latest("swap_total_bytes")
        swap = (
            f"  swap {fmt_bytes(m.latest('swap_used_bytes'))}/{fmt_bytes(swap_total)}"
            if not math.isnan(swap_total)
            else ""
        )
        if text.cell_len + len(swap) <= width:
            text.append(swap)
        text.append("\n" + "LOAD".ljust(LABEL), style="bold")
        loads = [m.latest(f"load_average_{s}") for s in ("1m", "5m", "15m")]
        text.append(" ".join("-" if math.isnan(v) else f"{v:.2f}" for v in loads))
        text.append(
            f"  run {fmt_si(m.latest('procs_running'))} blk {fmt_si(m.latest('procs_blocked'))}"
            f"  procs {fmt_si(m.latest('processes_total'))}"
            f" thr {fmt_si(m.latest('threads_total'))}"
            f"  up {fmt_duration(m.latest('uptime_seconds'))}"
        )
        self.update(no_wrap(text))


def _device_lines(
    m: MetricsModel,
    label: str,
    metric: str,
    key: str,
    cells: list[tuple[str, str]],
    spark_metric: str,
    width: int,
) -> Text | None:
    """One line per device: name, formatted cells, and a sparkline of ``spark_metric``."""
    devices = m.label_values(metric, key)
    if not devices:
        return None
    text = Text()
    for i, dev in enumerate(devices):
        labels = ((key, dev),)
        if i:
            text.append("\n")
        text.append((label if i == 0 else "").ljust(LABEL), style="bold")
        text.append(f"{dev[:10]:<10} ")
        line = " ".join(f"{title} {m.show(name, labels):>7}" for title, name in cells)
        text.append(line)
        spark_w = min(MAX_SPARK, width - LABEL - 11 - len(line) - 2)
        if spark_w >= 6:
            text.append("  ")
            text.append(sparkline(m.history(spark_metric, labels), spark_w), style="cyan")
    return no_wrap(text)


class _DevicePanel(Static):
    """One line per device (a disk, a NIC) of a metric with a device label: cells of its
    metrics and a sparkline; more cells on a wide terminal.

    Class attributes: ``LABEL`` (the panel's label), ``WHAT`` (the devices, in words),
    ``BY`` (the device label), ``FIRST`` (the metric whose series list the devices),
    ``SPARK`` (the metric of the sparkline), ``CELLS`` and ``WIDE_CELLS`` ((title, metric)
    pairs, for terminals narrower and wider than 100 columns).
    """

    LABEL = WHAT = BY = FIRST = SPARK = ""
    CELLS: tuple[tuple[str, str], ...] = ()
    WIDE_CELLS: tuple[tuple[str, str], ...] = ()

    def update_view(self, state: TopState) -> None:
        """Rebuild from the model."""
        width = max(40, self.size.width or 80)
        cells = list(self.WIDE_CELLS if width >= 100 else self.CELLS)
        text = _device_lines(
            state.metrics, self.LABEL, self.FIRST, self.BY, cells, self.SPARK, width
        )
        self.update(
            text if text is not None else unavailable_line(self.LABEL, state, "host", self.WHAT)
        )


class DiskPanel(_DevicePanel):
    """Per whole disk: read/write throughput and operations, busy ratio."""

    LABEL, WHAT, BY = "DISK", "disks", "device"
    FIRST, SPARK = "disk_read_bytes_per_second", "disk_busy_ratio"
    CELLS = (("R", FIRST), ("W", "disk_write_bytes_per_second"), ("busy", SPARK))
    WIDE_CELLS = (
        *CELLS[:2],
        ("r", "disk_reads_per_second"),
        ("w", "disk_writes_per_second"),
        CELLS[2],
    )


class NetPanel(_DevicePanel):
    """Per NIC: receive/transmit throughput, packets, errors and drops."""

    LABEL, WHAT, BY = "NET", "NICs", "interface"
    FIRST = SPARK = "net_rx_bytes_per_second"
    CELLS = (("RX", FIRST), ("TX", "net_tx_bytes_per_second"))
    WIDE_CELLS = (
        *CELLS,
        ("pkt in", "net_rx_packets_per_second"),
        ("out", "net_tx_packets_per_second"),
        ("drop", "net_rx_drops_per_second"),
        ("err", "net_rx_errors_per_second"),
    )


class KernelPanel(Static):
    """What the BPF and PMU collectors see host-wide: scheduler, TCP, instructions per cycle."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the sched_*, net_* and pmu_* metrics; each line degrades alone."""
        m = state.metrics
        lines = label_grid()
        if m.series("sched_runqueue_latency_seconds"):
            q = {d.get("quantile"): v for d, v in m.series("sched_runqueue_latency_seconds")}
            p50, p99 = fmt_seconds(q.get("0.5")), fmt_seconds(q.get("0.99"))
            switches = sum(v for _, v in m.series("sched_context_switches_per_second"))
            lines.add_row(
                "SCHED",
                no_wrap(
                    Text(
                        f"runq wait p50 {p50} p99 {p99}"
                        f" · switches {fmt_si(switches, '/s')}"
                        f" · migrations {fmt_si(m.latest('sched_migrations_per_second'), '/s')}"
                        f" · execs {fmt_si(m.latest('sched_execs_per_second'), '/s')}"
                    )
                ),
            )
        else:
            lines.add_row("SCHED", unavailable_reason(state, "sched", "scheduler telemetry"))
        if m.series("net_tcp_sent_bytes_per_second") or m.series("net_tcp_retransmits_per_second"):
            resets = sum(v for _, v in m.series("net_tcp_resets_per_second"))
            drops = sum(v for _, v in m.series("net_drops_per_second"))
            srtt = {d.get("stat"): v for d, v in m.series("net_tcp_srtt_seconds")}
            lines.add_row(
                "TCP",
                no_wrap(
                    Text(
                        f"tx {m.show('net_tcp_sent_bytes_per_second')}"
                        f" rx {m.show('net_tcp_received_bytes_per_second')}"
                        f" · retx {fmt_si(m.latest('net_tcp_retransmits_per_second'), '/s')}"
                        f" · resets {fmt_si(resets, '/s')} · drops {fmt_si(drops, '/s')}"
                        f" · conns {fmt_si(m.latest('net_tcp_established_connections'))}"
                        f" · srtt p50 {fmt_seconds(srtt.get('p50'))}"
                    )
                ),
            )
        else:
            lines.add_row("TCP", unavailable_reason(state, "net", "network telemetry"))
        ipc = {d.get("cpu"): v for d, v in m.series("pmu_instructions_per_cycle")}
        if ipc:
            mips = {d.get("cpu"): v for d, v in m.series("pmu_million_instructions_per_second")}
            lines.add_row(
                "PMU",
                f"IPC {ipc.get('all', math.nan):.2f} · {fmt_si(mips.get('all'))} MIPS",
            )
        else:
            lines.add_row("PMU", unavailable_reason(state, "pmu", "hardware counters"))
        self.update(lines)


#: An RDMA port's logical states (rdma_port_state) and link layers, in words.
PORT_STATES = {1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
LINK_LAYERS = {"InfiniBand": "IB", "Ethernet": "RoCE"}
#: More RDMA ports than this get one line for all, and one more per port in trouble.
MAX_PORT_LINES = 4
#: The NIC statistics that explain drops the socket layer never sees, as (title, metric).
NIC_PROBLEMS = (
    ("discards", "nic_discards_per_second"),
    ("pause", "nic_pause_frames_per_second"),
    ("pfc", "nic_pfc_pause_frames_per_second"),
    ("no buffer", "nic_out_of_buffer_drops_per_second"),
)


class FabricPanel(Static):
    """The fabric: per RDMA port its link, traffic, errors and congestion; NICs whose driver
    counts discards, pause or PFC frames; the CPU time softirqs and interrupts take."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the rdma_*, nic_*, softirq_* and hardirq_* metrics; each part alone."""
        m = state.metrics
        wide = (self.size.width or 80) >= 120
        lines = label_grid()
        ports = sorted(
            (d for d, _ in m.series("rdma_port_info")),
            key=lambda d: (d.get("device", ""), d.get("port", "")),
        )
        shown = ports
        if len(ports) > MAX_PORT_LINES:  # a big node: the total, then only the ports in trouble
            lines.add_row("RDMA", _ports_total(m, ports))
            shown = [p for p in ports if _in_trouble(m, p)]
        for info in shown:
            lines.add_row("RDMA" if not lines.row_count else "", _port_line(m, info, wide))
        if not ports:
            devices = m.latest("rdma_devices")
            if devices == 0:
                lines.add_row("RDMA", Text("none on this node", style="dim"))
            else:
                lines.add_row("RDMA", unavailable_reason(state, "fabric", "RDMA ports"))
        for i, ifname in enumerate(_nics_with_problems(m)):
            lines.add_row("NIC" if i == 0 else "", _nic_line(m, ifname))
        lines.add_row("IRQ", _irq_line(m, state))
        self.update(lines)


def _port_line(m: MetricsModel, info: dict[str, str], wide: bool) -> Text:
    """``mlx5_0:1 IB ACTIVE 200G tx 1.2GB/s rx 1.1GB/s err 0/s cnp 0/s wait 0/s``."""
    device, port = info.get("device", ""), info.get("port", "")
    key = _port_key(info)
    state = m.latest("rdma_port_state", key)
    active = m.latest("rdma_port_active", key) == 1.0
    errors = m.latest("rdma_port_errors_per_second", key)

    def counter(name: str) -> float:
        return sum(
            v
            for _, v in m.series("rdma_counter_per_second", device=device, port=port, counter=name)
        )

    cnp = [counter(c) for c in ("np_cnp_sent", "rp_cnp_handled")]
    text = Text(f"{device}:{port} ")
    text.append(f"{LINK_LAYERS.get(info.get('link_layer', ''), '?'):<4} ")
    words = PORT_STATES.get(int(state), "?") if not math.isnan(state) else "?"
    text.append(f"{words:<6} ", style="" if active else "bold red")
    text.append(f"{fmt_si(m.latest('rdma_port_rate_bits_per_second', key), 'b'):>5}")
    for direction in ("tx", "rx"):
        rate = m.latest("rdma_port_bytes_per_second", (*key, ("direction", direction)))
        text.append(f" {direction} {fmt_bytes(rate):>6}/s")
    text.append(" err ")
    text.append(fmt_si(errors, "/s"), style="bold red" if errors > 0 else "")
    if any(m.series("rdma_counter_per_second", device=device, port=port, counter="np_cnp_sent")):
        text.append(f" cnp {fmt_si(sum(cnp), '/s')}")
    if wide:
        text.append(f" wait {fmt_si(counter('port_xmit_wait'), '/s')}")
        if info.get("netdev"):
            text.append(f"  {info['netdev']}", style="dim")
        if info.get("gpus"):
            text.append(f" GPU {info['gpus']} {info.get('gpu_link', '')}", style="dim")
    return no_wrap(text)


def _port_key(info: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return (("device", info.get("device", "")), ("port", info.get("port", "")))


def _in_trouble(m: MetricsModel, info: dict[str, str]) -> bool:
    """A port not ACTIVE, or with errors in the last interval."""
    key = _port_key(info)
    return (
        m.latest("rdma_port_active", key) != 1.0 or m.latest("rdma_port_errors_per_second", key) > 0
    )


def _ports_total(m: MetricsModel, ports: list[dict[str, str]]) -> Text:
    """``8 ports, 8 ACTIVE tx 9.6GB/s rx 9.1GB/s err 0/s``."""
    active = sum(m.latest("rdma_port_active", _port_key(p)) == 1.0 for p in ports)
    text = Text(f"{len(ports)} ports, ")
    text.append(f"{active} ACTIVE", style="" if active == len(ports) else "bold red")
    for direction in ("tx", "rx"):
        rate = sum(v for _, v in m.series("rdma_port_bytes_per_second", direction=direction))
        text.append(f" {direction} {fmt_bytes(rate)}/s")
    errors = sum(v for _, v in m.series("rdma_port_errors_per_second"))
    text.append(" err ")
    text.append(fmt_si(errors, "/s"), style="bold red" if errors > 0 else "")
    return no_wrap(text)


def _nics_with_problems(m: MetricsModel) -> list[str]:
    """Interfaces whose driver reports the well-known drop and pause counters."""
    names = {d.get("interface", "") for _, metric in NIC_PROBLEMS for d, _ in m.series(metric)}
    return sorted(n for n in names if n)


def _nic_line(m: MetricsModel, ifname: str) -> Text:
    """``eth2 100G discards 0/s pause 0/s pfc 12/s no buffer 0/s``."""
    speed = m.latest("nic_link_speed_bits_per_second", (("interface", ifname),))
    text = Text(f"{ifname} {fmt_si(speed, 'b')}")
    for title, metric in NIC_PROBLEMS:
        rate = sum(v for _, v in m.series(metric, interface=ifname))
        text.append(f" {title} ")
        text.append(fmt_si(rate, "/s"), style="yellow" if rate > 0 else "")
    return no_wrap(text)


def _irq_line(m: MetricsModel, state: TopState) -> Text:
    """The CPU time softirqs and device interrupts take, the largest softirqs, the busiest
    CPU: ``softirq 3.6% of CPU (NET_RX 3.4%, TIMER 0.4%) · hardirq 0.1% · busiest CPU 1 21.6%``.
    """
    soft = m.series("softirq_seconds_per_second")
    if not soft:
        return unavailable_reason(state, "irq", "softirq time")
    hard = m.series("hardirq_seconds_per_second")
    cpus = {d.get("cpu", "") for d, _ in hard} | {d.get("cpu", "") for d, _ in soft}
    n = max(1, len(cpus))
    by_name: dict[str, float] = {}
    by_cpu: dict[str, float] = {}
    for d, v in soft:
        by_name[d.get("softirq", "")] = by_name.get(d.get("softirq", ""), 0.0) + v
        by_cpu[d.get("cpu", "")] = by_cpu.get(d.get("cpu", ""), 0.0) + v
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:3]
    text = Text(f"softirq {fmt_percent(sum(by_name.values()) / n, 1)} of CPU (")
    text.append(", ".join(f"{name} {fmt_percent(v / n, 1)}" for name, v in top) + ")")
    text.append(f" · hardirq {fmt_percent(sum(v for _, v in hard) / n, 1)}")
    cpu, busiest = max(by_cpu.items(), key=lambda kv: kv[1])
    text.append(f" · busiest CPU {cpu} ")
    text.append(fmt_percent(busiest, 1), style=level_style(busiest))
    return no_wrap(text)


GPM_FIELDS = (
    ("SM", "gpu_sm_active_ratio"),
    ("occ", "gpu_sm_occupancy_ratio"),
    ("tensor", "gpu_tensor_active_ratio"),
    ("DRAM", "gpu_dram_bw_util_ratio"),
)


class GpuPanel(Static):
    """One block per GPU: utilization with history, memory, power, temperature, GPM."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the model."""
        m = state.metrics
        width = max(40, self.size.width or 80)
        gpus = m.label_values("gpu_utilization_ratio", "gpu") or m.label_values(
            "gpu_memory_used_bytes", "gpu"
        )
        if not gpus:
            self.update(unavailable_line("GPU", state, "gpu", "GPUs"))
            return
        names = {d.get("gpu", ""): d.get("name", "") for d, _ in m.series("gpu_info")}
        text = Text()
        for i, gpu in enumerate(gpus):
            if i:
                text.append("\n")
            match = [(k, v) for k, v in _gpu_labels(m, gpu)]
            util = m.latest("gpu_utilization_ratio", match)
            used = m.latest("gpu_memory_used_bytes", match)
            total = m.latest("gpu_memory_total_bytes", match)
            head = f"GPU{gpu}".ljust(LABEL)
            text.append(head, style="bold")
            if m.latest("gpu_up", match) == 0.0:
                text.append(f"{names.get(gpu, '')} lost: NVML no longer answers", style="red")
                continue
            text.append(f"{fmt_percent(util):>4} ", style=level_style(util))
            tail = (
                f" mem {fmt_bytes(used)}/{fmt_bytes(total)}"
                f" {m.show('gpu_power_watts', match)}/{m.show('gpu_power_limit_watts', match)}"
                f" {m.show('gpu_temperature_celsius', match)}"
            )
            spark_w = max(4, min(MAX_SPARK, width - LABEL - 5 - len(tail) - 1))
            text.append(sparkline(m.history("gpu_utilization_ratio", match), spark_w, top=1.0))
            text.append(tail)
            name = names.get(gpu, "")
            gpm = [(t, m.latest(n, match)) for t, n in GPM_FIELDS]
            second = Text(" " * LABEL)
            if name:
                second.append(name[:24] + "  ", style="dim")
            if all(math.isnan(v) for _, v in gpm):
                paused = m.latest("gpu_profiling_paused", match) == 1.0
                second.append(
                    "GPM paused (a trace or dcgm-pause)" if paused else "GPM n/a (Hopper+ only)"
                )
            else:
                second.append(" ".join(f"{t} {fmt_percent(v)}" for t, v in gpm))
            text.append("\n")
            text.append(second)
        self.update(no_wrap(text))


def _gpu_labels(m: MetricsModel, gpu: str) -> list[tuple[str, str]]:
    """The full label set (gpu, uuid) of one GPU's utilization series."""
    for name in ("gpu_utilization_ratio", "gpu_memory_used_bytes"):
        for labels, _ in m.series(name, gpu=gpu):
            return [(k, v) for k, v in labels.items()]
    return [("gpu", gpu)]


class OverviewView(VerticalScroll):
    """The Overview tab's panels, top to bottom: the GPUs first on a host that has them (GPU
    people read them first, and an 80x24 terminal shows little more than the CPU panel of a
    big node), else last, where a host without GPUs says so."""

    #: Whether the GPU panel is at the top now.
    gpus_first = False

    def compose(self) -> ComposeResult:
        """The panels."""
        yield CpuPanel(id="cpu-panel", classes="panel")
        yield MemoryPanel(id="memory-panel", classes="panel")
        yield DiskPanel(id="disk-panel", classes="panel")
        yield NetPanel(id="net-panel", classes="panel")
        yield KernelPanel(id="kernel-panel", classes="panel")
        yield FabricPanel(id="fabric-panel", classes="panel")
        yield GpuPanel(id="gpu-panel", classes="panel")

    def update_view(self, state: TopState) -> None:
        """Rebuild every panel from the state."""
        has_gpus = bool(
            state.metrics.label_values("gpu_utilization_ratio", "gpu")
            or state.metrics.label_values("gpu_memory_used_bytes", "gpu")
        )
        if has_gpus != self.gpus_first:
            gpu_panel = self.query_one("#gpu-panel", GpuPanel)
            if has_gpus:
                self.move_child(gpu_panel, before=0)
            else:
                self.move_child(gpu_panel, after=len(self.children) - 1)
            self.gpus_first = has_gpus
        for panel in self.query(".panel"):
            if isinstance(
                panel,
                CpuPanel
                | MemoryPanel
                | DiskPanel
                | NetPanel
                | KernelPanel
                | FabricPanel
                | GpuPanel,
            ):
                panel.update_view(state)
