"""One row of live numbers per node: what ``bpfdyno top --job-id`` shows for a whole job.

Each poll asks every agent, concurrently, for the latest value of a few metrics and its
registered trainers (and, now and then, its status: small unary calls on the node's kept
channel), and boils them down to a `NodeSummary`. A value the node does not have (no GPU,
no BPF) is NaN, never 0; a node that does not answer has its `HostError` instead.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.cluster.fanout import FanOut
from bpfdyno.client.cluster.nodes import Node
from bpfdyno.client.errors import AgentError
from bpfdyno.rpc.agent import AgentStatus, CollectorState, Label, MetricsSnapshot
from bpfdyno.rpc.traces import Trainer, TrainerState

NAN = float("nan")

#: Interfaces left out of a node's network rates (traffic that never leaves the machine).
LOOPBACK_INTERFACES = frozenset({"lo"})


@dataclass(frozen=True, slots=True)
class _RowMetric:
    """Which series of a metric add up to a field of the row."""

    field: str
    #: The label that decides (empty: every series counts)...
    label: str = ""
    #: ...a series counts when its value of it is one of these...
    only: frozenset[str] = frozenset()
    #: ...and not one of these.
    skip: frozenset[str] = frozenset()

    def counts(self, labels: Iterable[Label]) -> bool:
        if not self.label:
            return True
        value = next((lab.value for lab in labels if lab.name == self.label), "")
        return (not self.only or value in self.only) and value not in self.skip


_ROW_METRICS = {
    "cpu_utilization_ratio": _RowMetric("cpu_ratio", "cpu", only=frozenset({"total"})),
    "memory_used_bytes": _RowMetric("memory_used_bytes"),
    "memory_total_bytes": _RowMetric("memory_total_bytes"),
    "gpu_utilization_ratio": _RowMetric("gpu_utilization_ratio"),
    "gpu_memory_used_bytes": _RowMetric("gpu_memory_used_bytes"),
    "gpu_memory_total_bytes": _RowMetric("gpu_memory_total_bytes"),
    "gpu_power_watts": _RowMetric("gpu_power_watts"),
    "net_rx_bytes_per_second": _RowMetric(
        "net_rx_bytes_per_second", "interface", skip=LOOPBACK_INTERFACES
    ),
    "net_tx_bytes_per_second": _RowMetric(
        "net_tx_bytes_per_second", "interface", skip=LOOPBACK_INTERFACES
    ),
    "net_tcp_retransmits_per_second": _RowMetric("tcp_retransmits_per_second"),
    "rdma_port_bytes_per_second": _RowMetric("rdma_bytes_per_second"),
    "rdma_port_errors_per_second": _RowMetric("rdma_errors_per_second"),
    "sched_runqueue_latency_seconds": _RowMetric(
        "runqueue_p99_seconds", "quantile", only=frozenset({"0.99"})
    ),
}
#: The metrics a summary needs (only these are asked for, to keep every poll small).
SUMMARY_METRICS = tuple(_ROW_METRICS)
#: Collector states that make the agent's state "degraded" or "starting".
_PROBLEM_STATES = {CollectorState.DEGRADED, CollectorState.STARTING}


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """One node's live numbers, or why there are none.

    Attributes:
        node: the node.
        error: why the agent did not answer; None when it did.
        hostname: the agent's host name.
        version: the agent's version.
        agent_state: ``ok``, ``starting`` (a collector has not delivered yet) or
            ``degraded`` (a collector is failing); ``down`` when the agent did not answer.
        problems: ``collector: state: reason`` of each collector that is not ok.
        unavailable: collectors this node cannot run (no GPU, no BPF...): their columns are
            unknown.
        ts: the agent's time of the numbers (epoch seconds).
        cpu_ratio: CPU busy, all cores, 0..1.
        memory_used_bytes, memory_total_bytes: RAM.
        gpus: GPUs reporting utilization (0: none).
        gpu_utilization_ratio: mean over the GPUs, 0..1.
        gpu_memory_used_bytes, gpu_memory_total_bytes: summed over the GPUs.
        gpu_power_watts: summed over the GPUs.
        net_rx_bytes_per_second, net_tx_bytes_per_second: summed over the NICs but loopback.
        tcp_retransmits_per_second: TCP segments retransmitted.
        rdma_bytes_per_second: RDMA traffic, sent and received, summed over the ports (NaN:
            no RDMA port, or the fabric collector is not running).
        rdma_errors_per_second: RDMA link, transport and drop errors, summed over the ports.
        runqueue_p99_seconds: run-queue latency, 99th percentile over the last interval.
        trainers: PyTorch processes of the job registered with the agent (None: unknown).
        tracing: of those, the ones tracing or holding a trace config now.
        elapsed_s: how long the node took to answer.
    """

    node: Node
    error: AgentError | None = None
    hostname: str = ""
    version: str = ""
    agent_state: str = "down"
    problems: tuple[str, ...] = ()
    unavailable: tuple[str, ...] = ()
    ts: float = NAN
    cpu_ratio: float = NAN
    memory_used_bytes: float = NAN
    memory_total_bytes: float = NAN
    gpus: int = 0
    gpu_utilization_ratio: float = NAN
    gpu_memory_used_bytes: float = NAN
    gpu_memory_total_bytes: float = NAN
    gpu_power_watts: float = NAN
    net_rx_bytes_per_second: float = NAN
    net_tx_bytes_per_second: float = NAN
    tcp_retransmits_per_second: float = NAN
    rdma_bytes_per_second: float = NAN
    rdma_errors_per_second: float = NAN
    runqueue_p99_seconds: float = NAN
    trainers: int | None = None
    tracing: int = 0
    elapsed_s: float = NAN

    @property
    def up(self) -> bool:
        """Whether the agent answered."""
        return self.error is None


def _sum(values: Iterable[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return math.fsum(known) if known else NAN


def _mean(values: Iterable[float]) -> float:
    known = [v for v in values if not math.isnan(v)]
    return math.fsum(known) / len(known) if known else NAN


def summarize_node(
    node: Node,
    status: AgentStatus,
    snapshot: MetricsSnapshot,
    trainers: Sequence[Trainer] | None,
    job_ids: Iterable[int] = (),
    elapsed_s: float = NAN,
) -> NodeSummary:
    """Boil one agent's answers down to its row.

    Args:
        node: the node.
        status, snapshot, trainers: the agent's answers (``trainers`` None: not served).
        job_ids: count only trainers of these jobs (empty: every trainer).
        elapsed_s: how long the node took to answer.
    """
    # One pass, no per-series dictionaries: a big node sends ~100 series per poll (every
    # core's CPU among them) and only a dozen make the row.
    values: dict[str, list[float]] = {}
    for series in snapshot.series:
        row = _ROW_METRICS.get(series.name)
        if row is not None and series.points and row.counts(series.labels):
            values.setdefault(row.field, []).append(series.value)

    def total(field: str) -> float:
        return _sum(values.get(field, ()))

    gpu_util = values.get("gpu_utilization_ratio", [])
    problems = tuple(
        f"{c.name}: {c.state}: {c.reason or 'no reason given'}"
        for c in status.collectors
        if c.state in _PROBLEM_STATES
    )
    states = {c.state for c in status.collectors if c.state in _PROBLEM_STATES}
    state = "degraded" if CollectorState.DEGRADED in states else "starting" if states else "ok"
    wanted = set(job_ids)
    registered: int | None = None
    tracing = 0
    if trainers is not None:
        mine = [t for t in trainers if not wanted or t.job_id in wanted]
        registered = len(mine)
        tracing = sum(t.state is not TrainerState.IDLE for t in mine)
    return NodeSummary(
        node=node,
        hostname=status.hostname,
        version=status.version,
        agent_state=state,
        problems=problems,
        unavailable=tuple(
            c.name for c in status.collectors if c.state is CollectorState.UNAVAILABLE
        ),
        ts=snapshot.unix_seconds,
        cpu_ratio=total("cpu_ratio"),
        memory_used_bytes=total("memory_used_bytes"),
        memory_total_bytes=total("memory_total_bytes"),
        gpus=len(gpu_util),
        gpu_utilization_ratio=_mean(gpu_util),
        gpu_memory_used_bytes=total("gpu_memory_used_bytes"),
        gpu_memory_total_bytes=total("gpu_memory_total_bytes"),
        gpu_power_watts=total("gpu_power_watts"),
        net_rx_bytes_per_second=total("net_rx_bytes_per_second"),
        net_tx_bytes_per_second=total("net_tx_bytes_per_second"),
        tcp_retransmits_per_second=total("tcp_retransmits_per_second"),
        rdma_bytes_per_second=total("rdma_bytes_per_second"),
        rdma_errors_per_second=total("rdma_errors_per_second"),
        runqueue_p99_seconds=total("runqueue_p99_seconds"),
        trainers=registered,
        tracing=tracing,
        elapsed_s=elapsed_s,
    )


#: Polls between two status requests to a node that answers (its collectors' states change
#: rarely; its metrics, every poll, also tell whether it is up).
STATUS_EVERY = 5


class SummaryPoller:
    """Every node's row, asked concurrently, poll after poll.

    Each poll asks every node for the row's metrics and its trainers; the agent's status
    (version, collectors' states) only at the first poll, every `STATUS_EVERY` polls after,
    and again after the node was down — a third fewer calls at 1 Hz.

    Args:
        fanout: the nodes' agents.
        job_id: count trainers of this job on nodes that list no job ids of their own (None:
            count every trainer there).
        status_every: polls between two status requests to a node.
    """

    def __init__(
        self, fanout: FanOut, job_id: int | None = None, status_every: int = STATUS_EVERY
    ) -> None:
        self.fanout = fanout
        self.job_id = job_id
        self.status_every = max(1, status_every)
        self._polls = 0
        self._status: dict[str, AgentStatus] = {}

    async def poll(self) -> list[NodeSummary]:
        """Every node's row; a node that does not answer carries why."""
        due = self._polls % self.status_every == 0
        self._polls += 1

        async def ask(
            node: Node, agent: AgentClient
        ) -> tuple[AgentStatus, MetricsSnapshot, list[Trainer] | None]:
            known = self._status.get(node.target)
            calls = [agent.metrics(SUMMARY_METRICS), agent.trainers()]
            if due or known is None:
                calls.append(agent.status())
            answers: list[object] = await asyncio.gather(*calls, return_exceptions=True)
            for answer in answers:
                if isinstance(answer, BaseException) and not isinstance(answer, AgentError):
                    raise answer  # cancelled, or a bug
            snapshot, listed, *asked = answers
            if isinstance(snapshot, AgentError):
                raise snapshot
            if asked and isinstance(asked[0], AgentError):
                raise asked[0]
            status = asked[0] if asked else known
            assert isinstance(snapshot, MetricsSnapshot)
            assert isinstance(status, AgentStatus)
            # Tracing off there: the trainers column is unknown, not 0.
            trainers = listed if isinstance(listed, list) else None
            return status, snapshot, trainers

        out = []
        for r in await self.fanout.map(ask):
            if r.value is None:
                self._status.pop(r.node.target, None)  # ask again once it is back
                out.append(NodeSummary(r.node, error=r.error, elapsed_s=r.elapsed_s))
                continue
            status, snapshot, trainers = r.value
            self._status[r.node.target] = status
            ids = r.node.job_ids or (() if self.job_id is None else (self.job_id,))
            out.append(summarize_node(r.node, status, snapshot, trainers, ids, r.elapsed_s))
        return out


async def poll_summaries(fanout: FanOut, job_id: int | None = None) -> list[NodeSummary]:
    """Every node's row, asked once (status included); see `SummaryPoller` to poll on."""
    return await SummaryPoller(fanout, job_id, status_every=1).poll()
