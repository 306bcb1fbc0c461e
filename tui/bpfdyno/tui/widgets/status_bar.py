"""The top line: which agent, connected or not, and what happens next."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from bpfdyno.tui.fmt import fmt_duration
from bpfdyno.tui.model import TopState


class StatusBar(Static):
    """``● host · bpfdyno 1.0 · up 2h · target`` or, in red, why the agent is unreachable."""

    def update_view(self, state: TopState) -> None:
        """Rebuild from the connection state and the last status."""
        conn = state.connection
        st = state.status
        if conn.connected:
            self.remove_class("-disconnected")
            text = Text("● ", style="bold green")
            if st is not None:
                text.append(st.hostname, style="bold")
            if conn.message:
                # First, so a narrow terminal cuts the details rather than the news.
                text.append(f" · {conn.message}", style="bold yellow")
            if st is not None:
                text.append(
                    f" · bpfdyno {st.version} · kernel {st.kernel_release}"
                    f" · agent up {fmt_duration(st.agent_uptime_seconds)}"
                )
            if state.job_id:
                text.append(f" · job {state.job_id}", style="bold")
            text.append(f" · {conn.target}", style="dim")
        else:
            self.add_class("-disconnected")
            text = Text("✖ ", style="bold")
            text.append(conn.message)
        self.update(text)
