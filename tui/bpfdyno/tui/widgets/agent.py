"""The Agent tab: the agent's own cost, its collectors' states and its BPF programs' cost."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Static

from bpfdyno.tui.fmt import fmt_bytes, fmt_duration, fmt_ns, fmt_percent, fmt_si, sparkline
from bpfdyno.tui.model import TopState

#: Terminal width from which collector reasons get their own column.
WIDE_REASONS = 120
STATE_STYLE = {
    "ok": "green",
    "starting": "cyan",
    "degraded": "yellow",
    "unavailable": "red",
    "stopped": "dim",
    "disabled": "dim",
}


class AgentSummary(Static):
    """Who the agent is and what it costs (CPU, RSS) with history."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the status and the agent_* metrics."""
        st = state.status
        m = state.metrics
        if st is None:
            self.update(Text("agent: not connected yet", style="dim"))
            return
        text = Text(f"bpfdyno {st.version}", style="bold")
        text.append(
            f" on {st.hostname} (kernel {st.kernel_release}) · pid {st.pid}"
            f" · up {fmt_duration(st.agent_uptime_seconds)} · config {st.config_source}\n"
        )
        width = max(40, self.size.width or 80)
        spark_w = max(4, min(30, (width - 50) // 2))
        cpu = m.latest("agent_cpu_ratio")
        rss = m.latest("agent_rss_bytes")
        text.append("CPU ", style="bold")
        text.append(f"{fmt_percent(cpu, 1):>6} ")
        text.append(sparkline(m.history("agent_cpu_ratio"), spark_w), style="cyan")
        text.append("  RSS ", style="bold")
        text.append(f"{fmt_bytes(rss):>6} ")
        text.append(sparkline(m.history("agent_rss_bytes"), spark_w), style="cyan")
        threads = m.latest("agent_threads")
        fds = m.latest("agent_open_fds")
        text.append(f"  threads {fmt_si(threads)} fds {fmt_si(fds)}")
        if math.isnan(cpu) and math.isnan(rss):
            text.append("\n")
            text.append(_self_reason(state), style="yellow")
        self.update(text)


def _self_reason(state: TopState) -> str:
    st = state.status.collector("self") if state.status else None
    if st is None:
        return "agent CPU/RSS: not reported (no self collector on this agent)"
    if st.state == "ok":
        return "agent CPU/RSS: waiting for the first collection"
    return f"agent CPU/RSS {st.state}: {st.reason}"


class CollectorsPanel(Static):
    """One row per collector: state, interval, rounds, errors, last duration, reason.

    On a wide terminal the reason is a column; on a narrow one the reasons follow the table
    as ``name: reason`` lines, so they wrap across the full width instead of a thin column.
    """

    def update_view(self, state: TopState) -> None:
        """Rebuild from the status."""
        st = state.status
        if st is None:
            self.update(Text(""))
            return
        wide = (self.size.width or 80) >= WIDE_REASONS
        table = Table(box=None, expand=wide, pad_edge=False, header_style="bold")
        table.add_column("COLLECTOR", no_wrap=True)
        table.add_column("STATE", no_wrap=True)
        table.add_column("EVERY", justify="right", no_wrap=True)
        table.add_column("ROUNDS", justify="right", no_wrap=True)
        table.add_column("ERR", justify="right", no_wrap=True)
        table.add_column("LAST", justify="right", no_wrap=True)
        if wide:
            table.add_column("REASON", ratio=1, overflow="fold")
        reasons = Table.grid(padding=(0, 1))
        reasons.add_column(style="bold", no_wrap=True)
        reasons.add_column(ratio=1)
        collectors = sorted(st.collectors, key=lambda c: c.name)
        for c in collectors:
            # Text, not str: reasons quote config sections like "[gpu]", not Rich markup.
            cells: list[Text | str] = [
                Text(c.name),
                Text(c.state, style=STATE_STYLE.get(c.state, "")),
                "-"
                if math.isnan(c.interval_seconds) or c.interval_seconds <= 0
                else f"{c.interval_seconds:g}s",
                str(c.collections),
                Text(str(c.errors), style="red" if c.errors else ""),
                "-"
                if c.collections == 0 or not c.last_duration_seconds > 0  # NaN, 0: unknown
                else f"{c.last_duration_seconds * 1000:.1f}ms",
            ]
            if wide:
                cells.append(Text(c.reason))
            elif c.reason:
                reasons.add_row(f"{c.name}:", Text(c.reason, style=STATE_STYLE.get(c.state, "")))
            table.add_row(*cells)
        if wide or not reasons.row_count:
            self.update(table)
        else:
            self.update(Group(table, Text(""), reasons))


class BpfPanel(Static):
    """Per BPF program: ns per event and runs per second (from the agent's BPF stats)."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the bpf_program_* metrics."""
        m = state.metrics
        programs = m.label_values("bpf_program_run_ns_per_event", "program") or m.label_values(
            "bpf_program_runs_per_second", "program"
        )
        if not programs:
            self.update(Text("BPF programs: no run statistics reported", style="dim"))
            return
        width = max(40, self.size.width or 80)
        spark_w = max(4, min(40, width - 40))
        table = Table(box=None, expand=False, pad_edge=False, header_style="bold")
        table.add_column("BPF PROGRAM", no_wrap=True)
        table.add_column("NS/EVENT", justify="right", no_wrap=True)
        table.add_column("RUNS/S", justify="right", no_wrap=True)
        table.add_column("HISTORY (ns/event)", no_wrap=True)
        for prog in programs:
            labels = (("program", prog),)
            table.add_row(
                Text(prog),
                fmt_ns(m.latest("bpf_program_run_ns_per_event", labels)),
                fmt_si(m.latest("bpf_program_runs_per_second", labels), "/s"),
                Text(sparkline(m.history("bpf_program_run_ns_per_event", labels), spark_w)),
            )
        self.update(table)


class AgentView(VerticalScroll):
    """The Agent tab."""

    def compose(self) -> ComposeResult:
        """Summary, collectors, BPF programs."""
        yield AgentSummary(id="agent-summary", classes="panel")
        yield CollectorsPanel(id="collectors-panel", classes="panel")
        yield BpfPanel(id="bpf-panel", classes="panel")

    def update_view(self, state: TopState) -> None:
        """Rebuild every panel."""
        self.query_one(AgentSummary).update_view(state)
        self.query_one(CollectorsPanel).update_view(state)
        self.query_one(BpfPanel).update_view(state)
