"""The pull of a job's other agents' rank signals, so every agent compares all of the job's
ranks, not only those on its node (docs/detection.md, "Across nodes").

Which agents: the configured ``[detection] peers`` when the list is not empty (an override),
else the other nodes of the SLURM jobs this node's ranks belong to (`SlurmPeers`: the rank's
``$SLURM_JOB_ID`` → the job's nodes, as ``bpfdyno gputrace --job-id`` finds them, each
reached at this agent's own gRPC TCP port). A job known only by torchrun's run id or its
rendezvous address names no other node, so it has no discovered peers.

Every interval, each peer is asked `Detection.GetRankSignals` with the client every tool uses
(`bpfdyno.client.agent.AgentClient`: a Unix socket, or TCP with the TLS and token its
environment names, under the peer's same authorisation). What came back is kept until it is
older than two intervals; the detection collector reads it on its thread (the list is swapped
whole). A peer that does not answer, or a job whose nodes cannot be looked up, is named in
``bpfdyno status`` and left out until it does; the local comparison goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from bpfdyno.client.agent import AgentClient
from bpfdyno.client.cluster.clock import measure_clock
from bpfdyno.client.cluster.nodes import (
    DEFAULT_AGENT_PORT,
    JobRef,
    Node,
    NodeResolutionError,
    resolve_slurm_job,
)
from bpfdyno.client.errors import AgentError
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.detection.signals import RankSignals, from_record

log = logging.getLogger(__name__)

#: How long a job's node list is used before SLURM is asked again (a running job keeps its
#: nodes; this catches a lookup that failed, and a job id reused after a restart).
REDISCOVER_S = 60.0


@dataclass(frozen=True, slots=True)
class Peer:
    """An agent to pull from, and why: a node of a job, or a configured target."""

    target: str
    name: str  # the node's name, or the target as configured
    job_id: str = ""  # the job it was found from ("" when configured)


def own_port(tcp: str) -> int:
    """The port of this agent's ``[grpc] tcp`` listener, which its peers share (the default
    port when it has none)."""
    _, sep, port = tcp.rpartition(":")
    return int(port) if sep and port.isdigit() else DEFAULT_AGENT_PORT


class SlurmPeers:
    """The other nodes of a SLURM job, from SLURM itself (``squeue``, ``scontrol``).

    Args:
        port: the agents' gRPC TCP port (this agent's own: a cluster runs one config).
        own_targets: this agent's ``host:port`` addresses (its node is not its own peer).
        own_names: this machine's names (a node named so is this one).
        resolve: the lookup (SLURM's; tests may give a job's nodes by hand).
    """

    def __init__(
        self,
        port: int,
        own_targets: Collection[str] = (),
        own_names: Collection[str] | None = None,
        resolve: Callable[[JobRef, int], Sequence[Node]] | None = None,
    ) -> None:
        self.port = port
        self._own_targets = frozenset(own_targets)
        if own_names is None:
            host = socket.gethostname()
            own_names = {host, host.split(".", 1)[0]}
        self._own_names = frozenset(own_names)
        self._resolve = resolve or (lambda ref, port: resolve_slurm_job(ref, port).nodes)

    @staticmethod
    def is_slurm_job(job_id: str) -> bool:
        """Whether a rank's job id is a SLURM job id (torchrun's run ids and rendezvous
        addresses are not)."""
        return job_id.isdigit() and job_id != "0"

    def peers(self, job_id: str) -> list[Peer]:
        """The job's other nodes' agents (blocking: SLURM's commands run).

        Raises:
            NodeResolutionError: SLURM does not answer, or does not know the job.
        """
        nodes = self._resolve(JobRef.parse(job_id), self.port)
        return [
            Peer(n.target, n.name, job_id)
            for n in nodes
            if n.target not in self._own_targets and n.name not in self._own_names
        ]


@dataclass(frozen=True, slots=True)
class _Lookup:
    at: float  # monotonic time of the lookup
    peers: tuple[Peer, ...]
    error: str = ""


class PeerSignals:
    """A component: pulls the peers' rank signals every ``interval_s``.

    Args:
        targets: configured peers; when not empty they are the peers and nothing is looked up.
        interval_s: the detection's interval.
        jobs: the job ids of this node's ranks (for discovery).
        discovery: where a job's other nodes come from (None: only configured peers).
    """

    name = "detection_peers"

    def __init__(
        self,
        targets: Sequence[str],
        interval_s: float,
        *,
        jobs: Callable[[], Iterable[str]] = tuple,
        discovery: SlurmPeers | None = None,
        rediscover_s: float = REDISCOVER_S,
    ) -> None:
        self._configured = [Peer(t, t) for t in targets]
        self._interval_s = interval_s
        self._timeout_s = max(1.0, interval_s / 2)
        self._jobs = jobs
        self._discovery = discovery if not targets else None
        self._rediscover_s = rediscover_s
        self._lookups: dict[str, _Lookup] = {}  # job id -> its last lookup
        self._peers: list[Peer] = list(self._configured)
        #: Per peer target: (monotonic time of the answer, its ranks).
        self._got: dict[str, tuple[float, list[RankSignals]]] = {}
        self._failing: dict[str, str] = {}
        self._pulls = 0
        self._task: asyncio.Task[None] | None = None

    def signals(self) -> list[RankSignals]:
        """The peers' ranks from answers at most two intervals old (any thread may ask)."""
        fresh_after = time.monotonic() - 2 * self._interval_s
        got = dict(self._got)
        return [s for at, signals in got.values() if at >= fresh_after for s in signals]

    def peers(self) -> list[Peer]:
        """The peers pulled from in the last round."""
        return list(self._peers)

    def job_peers(self, job_id: str) -> list[tuple[Peer, int]]:
        """The peers whose latest answer (at most two intervals old) holds ranks of
        ``job_id``, each with how many: the job's other nodes, as the detection compares
        them (any thread may ask)."""
        fresh_after = time.monotonic() - 2 * self._interval_s
        known = {p.target: p for p in self._peers}
        out = []
        for target, (at, signals) in dict(self._got).items():
            ranks = sum(1 for s in signals if s.job_id == job_id)
            if at >= fresh_after and ranks:
                out.append((known.get(target, Peer(target, target, job_id)), ranks))
        return out

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="detection-peers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def statuses(self) -> list[PartStatus]:
        peers = self._peers
        problems = [f"{t}: {e}" for t, e in sorted(self._failing.items())]
        problems += [f"job {j}: {lk.error}" for j, lk in sorted(self._lookups.items()) if lk.error]
        if problems:
            failing = len(self._failing)
            head = f"{failing} of {len(peers)} peers not answering" if failing else "peers unknown"
            return [
                PartStatus(
                    self.name,
                    PartState.DEGRADED,
                    f"{head} ({'; '.join(problems)})",
                    self._interval_s,
                    self._pulls,
                )
            ]
        return [
            PartStatus(
                self.name, PartState.OK, self._describe(peers), self._interval_s, self._pulls
            )
        ]

    def _describe(self, peers: list[Peer]) -> str:
        if self._configured:
            return f"pulling rank signals from {len(peers)} peers"
        if self._discovery is None:
            return "no peers configured: only this node's ranks are compared"
        if not peers:
            return "no peers: this node's ranks are in no SLURM job that has other nodes"
        got = dict(self._got)
        each = ", ".join(f"{p.name}: {len(got.get(p.target, (0.0, []))[1])} ranks" for p in peers)
        jobs = ", ".join(sorted({p.job_id for p in peers}))
        return f"pulling rank signals from {len(peers)} peers of SLURM job {jobs} ({each})"

    async def _run(self) -> None:
        while True:
            peers = await self._find_peers()
            wanted = {p.target for p in peers}
            for gone in set(self._got) - wanted:
                del self._got[gone]
            for gone in set(self._failing) - wanted:
                del self._failing[gone]
            self._peers = peers
            await asyncio.gather(*(self._pull(p.target) for p in peers))
            self._pulls += 1
            await asyncio.sleep(self._interval_s)

    async def _find_peers(self) -> list[Peer]:
        """The configured peers, else the other nodes of this node's ranks' SLURM jobs."""
        if self._discovery is None:
            return list(self._configured)
        discovery = self._discovery
        jobs = {j for j in self._jobs() if discovery.is_slurm_job(j)}
        self._lookups = {j: lk for j, lk in self._lookups.items() if j in jobs}
        now = time.monotonic()
        for job in sorted(jobs):
            last = self._lookups.get(job)
            if last is not None and now - last.at < self._rediscover_s:
                continue
            try:
                # SLURM's commands block: not on the event loop.
                found = await asyncio.to_thread(discovery.peers, job)
            except NodeResolutionError as e:
                if last is None or not last.error:
                    log.warning("detection: the nodes of job %s are unknown: %s", job, e)
                self._lookups[job] = _Lookup(now, (), str(e))
                continue
            if last is None or last.peers != tuple(found):
                log.info(
                    "detection: job %s's other nodes: %s",
                    job,
                    ", ".join(f"{p.name} ({p.target})" for p in found) or "none",
                )
            self._lookups[job] = _Lookup(now, tuple(found))
        unique: dict[str, Peer] = {}
        for lk in self._lookups.values():
            for p in lk.peers:
                unique.setdefault(p.target, p)
        return list(unique.values())

    async def _pull(self, target: str) -> None:
        try:
            async with AgentClient(target) as client:
                records = await asyncio.wait_for(client.rank_signals(), self._timeout_s)
                # NCCL arrivals are compared on our clock: the peer's offset, measured as a
                # job trace measures it (best of two round trips), when it sent any.
                offset_ns = 0
                if any(r.arrivals_known for r in records):
                    clock = await measure_clock(client, timeout_s=self._timeout_s)
                    offset_ns = round(clock.offset_s * 1e9)
        except (AgentError, TimeoutError, OSError) as e:
            if target not in self._failing:
                log.warning("detection: peer %s does not answer: %s", target, e)
            self._failing[target] = str(e) or type(e).__name__
            return
        if self._failing.pop(target, None) is not None:
            log.info("detection: peer %s answers again", target)
        self._got[target] = (time.monotonic(), [from_record(r, offset_ns) for r in records])
