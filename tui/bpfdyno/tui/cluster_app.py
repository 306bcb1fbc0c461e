"""`bpfdyno top --job-id` / ``--hosts``: the job's nodes, one row each; any node's full view.

`ClusterApp` is `TopApp` with the cluster screen on top. A poll worker asks every node's
agent at the refresh rate (`ClusterDataSource.summaries`) while that screen is shown. Enter
on a node drills into it: the app's data source becomes that node's agent and the usual tabs
show it, narrowed to the job (``c`` comes back). ``T`` traces the whole job through the same
fan-out as ``bpfdyno gputrace --job-id``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.binding import Binding, BindingType

from bpfdyno.client.cluster import JobTraceResult
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.app import TopApp
from bpfdyno.tui.cluster_model import ClusterState
from bpfdyno.tui.cluster_source import ClusterDataSource
from bpfdyno.tui.messages import (
    ClusterDetectionUpdated,
    JobTraceUpdated,
    NodesUpdated,
    OpenNode,
    OpenTraceForm,
)
from bpfdyno.tui.model import Connection, TopState
from bpfdyno.tui.screens.cluster import ClusterScreen
from bpfdyno.tui.screens.job_trace import JobTraceScreen
from bpfdyno.tui.screens.trace import TraceSubmitted

#: Worker groups of a node's full view, cancelled when leaving it.
NODE_GROUPS = (
    "connection",
    "events",
    "trace",
    "poll-status",
    "poll-processes",
    "poll-trainers",
    "poll-detection",
)


class ClusterApp(TopApp):
    """The cluster view over a job's agents, with each node's full view a key away.

    Args:
        cluster: the job's agents.
        refresh_s: seconds between polls of every node (and screen refreshes).
        retry_s: first and longest wait between reconnections of a node's view.
        clock: wall clock (injectable for stable screenshots).
    """

    CSS_PATH = ["app.tcss", "cluster.tcss"]  # type: ignore[assignment]  # TopApp has one file

    BINDINGS: ClassVar[list[BindingType]] = [
        *TopApp.BINDINGS,
        Binding("c", "cluster", "Cluster"),
    ]

    def __init__(
        self,
        cluster: ClusterDataSource,
        *,
        refresh_s: float = 1.0,
        retry_s: tuple[float, float] = (0.5, 5.0),
        clock: Callable[[], float] = time.time,
    ) -> None:
        # The first node's source stands in until a node is opened (it connects lazily).
        super().__init__(
            cluster.node_source(cluster.nodes[0]), refresh_s=refresh_s, retry_s=retry_s, clock=clock
        )
        self.cluster = cluster
        self.cluster_state = ClusterState(
            job=cluster.job, origin=cluster.origin, node_count=len(cluster.nodes)
        )
        self.cluster_screen = ClusterScreen(
            str(cluster.job_id) if cluster.job_id else "", [n.name for n in cluster.nodes]
        )
        self.node_open = False

    # -- data ----------------------------------------------------------------------------

    def start_data(self) -> None:
        """Show the cluster screen and poll every node; a node's view connects when opened."""
        # Installed, so that it survives being popped for a node's view and pushed again.
        self.install_screen(self.cluster_screen, name="cluster")
        self.push_screen("cluster")
        self._poll_nodes()

    @work(exclusive=True, group="cluster")
    async def _poll_nodes(self) -> None:
        """Ask every node for its row at the refresh rate, while the cluster screen shows."""
        while True:
            started = time.monotonic()
            if not self.node_open:
                nodes, detection = await asyncio.gather(
                    self.cluster.summaries(), self.cluster.detection()
                )
                self.post_message(ClusterDetectionUpdated(detection))
                self.post_message(NodesUpdated(nodes))
            await asyncio.sleep(max(0.0, self.refresh_s - (time.monotonic() - started)))

    def on_nodes_updated(self, msg: NodesUpdated) -> None:
        """Take the newest rows and show them: what the screen says is what the state holds
        (a poll comes once per refresh, as the tick does)."""
        self.cluster_state.nodes = msg.nodes
        self.cluster_state.updated_ts = self.clock()
        self.cluster_state.polls += 1
        self.render_views()

    def on_cluster_detection_updated(self, msg: ClusterDetectionUpdated) -> None:
        """Take every node's newest detection events (rendered with the rows)."""
        self.cluster_state.detection = {
            r.node.target: tuple(r.value) for r in msg.results if r.value is not None
        }
        self.cluster_state.detection_errors = {
            r.node.target: str(r.error) for r in msg.results if r.error is not None
        }

    def render_views(self) -> None:
        """The cluster screen while it shows; else the node's view."""
        if self._top_screen() is self.cluster_screen:
            self.cluster_screen.update_view(self.cluster_state)
            return
        super().render_views()

    # -- a node's full view ------------------------------------------------------------

    async def on_open_node(self, msg: OpenNode) -> None:
        """Drill into a node: its agent becomes the data source of the usual tabs."""
        await self._close_node()
        node = msg.node.node
        self.source = self.cluster.node_source(node)
        self.state = TopState(Connection(node.target), job_id=self.cluster.node_job_id(node))
        self.node_open = True
        self.pop_screen()
        self._connection_loop()
        self.render_views()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """``c`` only where there is a node's view to leave."""
        if action == "cluster":
            return self.node_open
        return True

    async def action_cluster(self) -> None:
        """Back to the cluster view (the node's connection is closed)."""
        if not self.node_open:
            return
        while self._top_screen() is not None and len(self.screen_stack) > 1:
            self.pop_screen()
        await self._close_node()
        self.push_screen("cluster")
        self.render_views()

    async def _close_node(self) -> None:
        for group in NODE_GROUPS:
            self.workers.cancel_group(self, group)
        self._in_flight.clear()
        self.node_open = False
        await self.source.close()

    # -- tracing the whole job ---------------------------------------------------------

    # Textual runs the handlers of every class in the MRO: TopApp's (a node's own trace)
    # run after these unless prevent_default() says the message was for the whole job.

    def on_open_trace_form(self, msg: OpenTraceForm) -> None:
        """From the cluster screen: the job-wide form (in a node's view: TopApp's)."""
        if self._top_screen() is self.cluster_screen:
            msg.prevent_default()
            self.push_screen(JobTraceScreen(msg.job_id, len(self.cluster.nodes)))

    def on_trace_submitted(self, msg: TraceSubmitted) -> None:
        """A job-wide request goes to every node (a node's own: TopApp's handler)."""
        if isinstance(self._top_screen(), JobTraceScreen):
            msg.prevent_default()
            self._trace_job(msg.request)

    @work(exclusive=True, group="job-trace")
    async def _trace_job(self, request: TraceSpec) -> None:
        """Trace every node and follow each host's part to its end."""

        def progress(trace: JobTraceResult) -> None:
            self.post_message(JobTraceUpdated(trace))

        self.post_message(JobTraceUpdated(await self.cluster.trace_job(request, progress), True))

    def on_job_trace_updated(self, msg: JobTraceUpdated) -> None:
        """Show the job trace's progress in the form (if open) and the cluster screen."""
        self.cluster_state.trace = msg.trace
        self.cluster_state.trace_finished = msg.finished
        screen = self._top_screen()
        if isinstance(screen, JobTraceScreen):
            screen.show_job(msg.trace, msg.finished)
        self.render_views()

    async def on_unmount(self) -> None:
        """Release every node's channel (TopApp's handler closes the node view's source)."""
        await self.cluster.close()


def run_cluster_top(cluster: ClusterDataSource, refresh_s: float = 1.0) -> int:
    """Run the cluster view until the user quits; the ``bpfdyno top --job-id`` command."""
    result = ClusterApp(cluster, refresh_s=refresh_s).run()
    return result if isinstance(result, int) else 0
