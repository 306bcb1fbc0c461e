"""`ClusterDataSource`: the cluster view's data, from every agent of a job at once.

Built on the client library (`bpfdyno.client.cluster`): one `FanOut` for the session (one
kept client per agent), a summary row per node per poll, and job-wide traces through the
same `trace_job` as ``bpfdyno gputrace --job-id``. A node's full view uses an
`AgentDataSource` of its own, opened when the user drills into it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.cluster import FanOut, HostResult, JobTraceResult, Node, trace_job
from bpfdyno.client.cluster.fanout import DEFAULT_CONCURRENCY, DEFAULT_HOST_TIMEOUT_S
from bpfdyno.client.cluster.jobtrace import KINETO_POLL_INTERVAL_S
from bpfdyno.client.cluster.summary import NodeSummary, SummaryPoller
from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.datasource import AgentDataSource


class ClusterDataSource:
    """The agents of one job's nodes.

    Args:
        nodes: the job's nodes.
        job: the job as the user named it (for titles; "" when only hosts were given).
        job_id: the job id asked for on nodes that list none of their own (0: none).
        origin: where the nodes came from (``SLURM``, ``--hosts``...).
        timeout_s: deadline of each node's answer.
        concurrency: most nodes asked at once.
        poll_interval_s: the trainers' config poll interval (for a common start time).

    Raises:
        ClientSetupError: the TLS/token environment variables are unusable.
    """

    def __init__(
        self,
        nodes: Sequence[Node],
        *,
        job: str = "",
        job_id: int = 0,
        origin: str = "",
        timeout_s: float = DEFAULT_HOST_TIMEOUT_S,
        concurrency: int = DEFAULT_CONCURRENCY,
        poll_interval_s: float = KINETO_POLL_INTERVAL_S,
    ) -> None:
        self.nodes = tuple(nodes)
        self.job = job
        self.job_id = job_id
        self.origin = origin
        self.poll_interval_s = poll_interval_s
        self._fanout = FanOut(self.nodes, timeout_s=timeout_s, concurrency=concurrency)
        self._poller = SummaryPoller(self._fanout, job_id or None)

    async def summaries(self) -> list[NodeSummary]:
        """Every node's row; a node that does not answer carries why."""
        return await self._poller.poll()

    async def detection(self) -> list[HostResult[list[DetectionEvent]]]:
        """Every node's detection events of the job, oldest first; a node that does not
        answer (or serves no detection) carries why."""

        async def ask(node: Node, agent: AgentClient) -> list[DetectionEvent]:
            jobs = self.node_job_ids(node)
            events = await agent.detection_events(next(iter(jobs)) if len(jobs) == 1 else "")
            return [e for e in events if not jobs or e.job_id in jobs]

        return await self._fanout.map(ask)

    def node_job_ids(self, node: Node) -> set[str]:
        """The job ids the job's ranks carry on a node (empty: all of the node's)."""
        if node.job_ids:
            return {str(j) for j in node.job_ids}
        return {str(self.job_id)} if self.job_id else set()

    def node_job_id(self, node: Node) -> str:
        """The job id a node's full view is narrowed to ("" when it runs several or none)."""
        if len(node.job_ids) == 1:
            return str(node.job_ids[0])
        if not node.job_ids and self.job_id:
            return str(self.job_id)
        return ""

    def node_source(self, node: Node) -> AgentDataSource:
        """A data source for one node's full view."""
        return AgentDataSource(node.target)

    async def trace_job(
        self, spec: TraceSpec, on_progress: Callable[[JobTraceResult], None]
    ) -> JobTraceResult:
        """Trace every node with ``spec`` (job id set per node), following it to the end."""
        return await trace_job(
            self._fanout,
            spec,
            wait=True,
            wait_s=spec.timeout_seconds or 120.0,
            poll_interval_s=self.poll_interval_s,
            on_progress=on_progress,
        )

    async def close(self) -> None:
        """Close every agent's channel."""
        await self._fanout.close()
