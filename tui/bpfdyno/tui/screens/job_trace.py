"""The trace form for a whole job, then each host's progress.

The single-node form (`TraceScreen`), with the job fixed and no pids (they are per
machine); once sent, the panel follows every host: its clock offset, the outcome, each
process's file.
"""

from __future__ import annotations

from textual.widgets import Input, Label

from bpfdyno.client.cluster import JobTraceResult
from bpfdyno.tui.cluster_model import lines_text, trace_lines
from bpfdyno.tui.screens.trace import TraceScreen


class JobTraceScreen(TraceScreen):
    """The form of `TraceScreen` for every node of a job.

    Args:
        job_id: the job (its id on nodes that list none of their own).
        nodes: how many nodes will be asked.
    """

    def __init__(self, job_id: str, nodes: int) -> None:
        super().__init__((), job_id or "0")
        self._node_count = nodes

    def on_mount(self) -> None:
        """Fix the job and leave the pids out: a job-wide trace takes every rank."""
        super().on_mount()
        self.query_one("#trace-title", Label).update(
            f"Trace every rank of the job on {self._node_count} node(s)"
        )
        pids = self.query_one("#trace-pids", Input)
        pids.placeholder = "every rank of the job"
        for box in (pids, self.query_one("#trace-job", Input)):
            box.disabled = True
        self.query_one("#trace-amount", Input).focus()

    def show_job(self, trace: JobTraceResult, finished: bool) -> None:
        """Show each host's progress."""
        self._progress(lines_text(trace_lines(trace, finished)))
