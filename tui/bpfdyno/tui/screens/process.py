"""One process in detail: identity, placement (job, container), and its recent history."""

from __future__ import annotations

import math
from typing import ClassVar

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from bpfdyno.rpc.processes import ProcessRow, threads_text
from bpfdyno.tui.fmt import fmt_bytes, fmt_clock, fmt_percent, fmt_si, sparkline
from bpfdyno.tui.messages import OpenTraceForm
from bpfdyno.tui.model import ProcessHistory, TopState


def _secs(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1e9:.1f}s"


def process_details(row: ProcessRow, history: ProcessHistory, width: int) -> Table:
    """The detail table of one process, with sparklines ``width``-aware."""
    # As wide as the history so far (it grows to the right), at most what fits.
    spark_w = max(1, min(60, width - 30, len(history.cpu)))
    t = Table(box=None, show_header=False, pad_edge=False, expand=True)
    t.add_column(style="bold", no_wrap=True)
    t.add_column(ratio=1, overflow="fold")
    # Text, not str: a command like "[kworker/0:1]" must not be read as Rich markup.
    t.add_row("command", Text(row.command))
    t.add_row(
        "process",
        Text(
            f"pid {row.pid} · parent {row.ppid} · user {row.user or '-'} · state {row.state or '-'}"
            f" · threads {fmt_si(row.num_threads)} · started {fmt_clock(row.start_unix_seconds)}"
        ),
    )
    t.add_row(
        "placement",
        Text(
            f"job {row.slurm_job_id or '-'} · container {row.container_id[:12] or '-'}"
            f" · cgroup {row.cgroup or '-'}"
        ),
    )
    cpu = Text(f"{fmt_percent(row.cpu_ratio):>6} ")
    cpu.append(sparkline(list(history.cpu), spark_w), style="cyan")
    t.add_row("CPU", cpu)
    rss = Text(f"{fmt_bytes(row.rss_bytes):>6} ")
    rss.append(sparkline(list(history.rss), spark_w), style="cyan")
    t.add_row("RSS", rss)
    t.add_row(
        "scheduler",
        Text(
            f"threads on a CPU {threads_text(row.oncpu_ratio)} · waiting for one "
            f"{threads_text(row.runq_wait_ratio)} · blocked "
            f"{threads_text(row.offcpu_blocked_ratio)}"
            f" (totals: on {_secs(row.oncpu_ns)}, waiting {_secs(row.runq_wait_ns)},"
            f" blocked {_secs(row.offcpu_blocked_ns)})"
        ),
    )
    net = Text(
        f"TX {fmt_bytes(row.tcp_tx_bytes_per_second)}/s RX "
        f"{fmt_bytes(row.tcp_rx_bytes_per_second)}/s · UDP TX "
        f"{fmt_bytes(row.udp_tx_bytes_per_second)}/s RX "
        f"{fmt_bytes(row.udp_rx_bytes_per_second)}/s · retransmits "
        f"{fmt_si(row.tcp_retransmits_per_second, '/s')} (total {fmt_si(row.tcp_retransmits)}) "
    )
    if any(not math.isnan(v) for v in history.net):
        net.append(sparkline(list(history.net), spark_w), style="cyan")
    t.add_row("TCP", net)
    t.add_row(
        "TCP totals",
        Text(f"sent {fmt_bytes(row.tcp_tx_bytes)} · received {fmt_bytes(row.tcp_rx_bytes)}"),
    )
    t.add_row("GPU memory", Text(fmt_bytes(row.gpu_memory_bytes)))
    return t


class ProcessScreen(Screen[None]):
    """Details of one pid, refreshed with every process table."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("t", "trace", "Trace"),
    ]

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid
        self.history = ProcessHistory(pid)
        self._row: ProcessRow | None = None
        # Made here, not queried: the app may render into them before they are mounted.
        self._title = Static("", id="process-title")
        self._body = Static("", id="process-body")

    def compose(self) -> ComposeResult:
        """Title and details."""
        with VerticalScroll(id="process-detail"):
            yield self._title
            yield self._body
        yield Footer()

    def update_view(self, state: TopState) -> None:
        """Show the newest row of this pid."""
        title, body = self._title, self._body
        table = state.processes
        if table is not None:
            self.history.add(table)
            row = next((r for r in table.processes if r.pid == self.pid), None)
            if row is not None:
                self._row = row
        if self._row is None:
            title.update(Text(f"process {self.pid}", style="bold"))
            body.update(
                Text(
                    f"pid {self.pid} is not in the agent's process table (it exited, or is not "
                    "among the most active processes the agent reports)",
                    style="yellow",
                )
            )
            return
        head = Text(f"{self._row.pid} ", style="bold")
        head.append(self._row.comm, style="bold cyan")
        if table is not None and all(r.pid != self.pid for r in table.processes):
            head.append("  (gone from the table: showing its last values)", style="yellow")
        title.update(head)
        body.update(process_details(self._row, self.history, self.size.width))

    def action_back(self) -> None:
        """Back to the process list."""
        self.dismiss(None)

    def action_trace(self) -> None:
        """Open the trace form for this process."""
        job = self._row.slurm_job_id if self._row is not None else ""
        self.post_message(OpenTraceForm(pids=(self.pid,), job_id=job))
