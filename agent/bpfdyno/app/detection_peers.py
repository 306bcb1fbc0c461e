"""The pull of a job's other agents' rank signals, so every agent compares all of the job's
ranks, not only those on its node (docs/detection.md, "Across nodes").

Which agents: the configured ``[detection] peers`` when the list is not empty (an override),
else the other nodes of the SLURM jobs this node's ranks belong to (`SlurmPeers`: the rank's
``$SLURM_JOB_ID`` → the job's nodes, as ``bpfdyno gputrace --job-id`` finds them, each
reached at this agent's own gRPC TCP port), and for a job known only by torchrun's run id or
its rendezvous address, the agents at the addresses its ranks' own TCP connections lead to
that hold ranks of the same job (`bpfdyno.app.rank_peers.ConnectionPeers`, under the trust
rule of `PeerTrust`).

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
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from bpfdyno.app.rank_peers import Candidate, ConnectionPeers
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
#: Addresses that are not peers named in status at most (the rest counted).
MAX_LISTED = 8


@dataclass(frozen=True, slots=True)
class Peer:
    """An agent to pull from, and why: a node of a job, or a configured target."""

    target: str
    name: str  # the node's name, or the target as configured
    job_id: str = ""  # the job it was found from ("" when configured)
    #: The addresses the job's ranks talk to that lead to this node (its pods'; () when
    #: they talk to the node itself or it was not found from connections).
    via: tuple[str, ...] = ()


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
    #: Addresses a job's ranks talk to that are not its peers, and why (connections only).
    ignored: tuple[Candidate, ...] = ()
    note: str = ""  # what a bounded lookup left out
    #: Lookups in a row that found no peer (connections only: they back off).
    misses: int = 0


def _listed(items: Sequence[str], most: int = 3) -> str:
    """``items`` joined, the first ``most`` named and the rest counted."""
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


async def ask_ranks(target: str, job_id: str, timeout_s: float) -> int:
    """How many ranks of ``job_id`` the agent at ``target`` holds (the normal client, the
    agent's TLS and token environment)."""
    async with AgentClient(target, timeout_s=timeout_s) as client:
        return len(await asyncio.wait_for(client.rank_signals(job_id), timeout_s))


class PeerSignals:
    """A component: pulls the peers' rank signals every ``interval_s``.

    Args:
        targets: configured peers; when not empty they are the peers and nothing is looked up.
        interval_s: the detection's interval.
        jobs: the job ids of this node's ranks (for discovery).
        discovery: where a SLURM job's other nodes come from (None: not looked up).
        rank_pids: the pids of this node's ranks by job id (for ``connections``).
        connections: where the other agents of a job no scheduler names come from (its
            ranks' connections; None: not looked up).
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
        rank_pids: Callable[[], Mapping[str, Collection[int]]] = dict,
        connections: ConnectionPeers | None = None,
    ) -> None:
        self._configured = [Peer(t, t) for t in targets]
        self._interval_s = interval_s
        self._timeout_s = max(1.0, interval_s / 2)
        self._jobs = jobs
        self._discovery = discovery if not targets else None
        self._rank_pids = rank_pids
        self._connections = connections if not targets else None
        self._rediscover_s = rediscover_s
        self._lookups: dict[str, _Lookup] = {}  # job id -> its last lookup
        self._peers: list[Peer] = list(self._configured)
        #: Per peer target: (monotonic time of the answer, its ranks).
        self._got: dict[str, tuple[float, list[RankSignals]]] = {}
        self._failing: dict[str, str] = {}
        self._pulls = 0
        self._task: asyncio.Task[None] | None = None
        #: Connection lookups under way, by job (their probes can take seconds).
        self._looking: dict[str, asyncio.Task[_Lookup]] = {}

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

    def job_peer_pids(self, job_id: str) -> dict[str, list[int]]:
        """Per peer target, the pids of its ranks of ``job_id`` in its latest answer (at most
        two intervals old), as that peer's agent knows them (any thread may ask)."""
        fresh_after = time.monotonic() - 2 * self._interval_s
        out: dict[str, list[int]] = {}
        for target, (at, signals) in dict(self._got).items():
            pids = sorted(s.pid for s in signals if s.job_id == job_id)
            if at >= fresh_after and pids:
                out[target] = pids
        return out

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="detection-peers")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in self._looking.values():
            task.cancel()
        await asyncio.gather(*self._looking.values(), return_exceptions=True)
        self._looking.clear()

    def statuses(self) -> list[PartStatus]:
        peers = self._peers
        lookups = sorted(self._lookups.items())
        problems = [f"{t}: {e}" for t, e in sorted(self._failing.items())]
        problems += [f"job {j}: {lk.error}" for j, lk in lookups if lk.error]
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
        # An address that failed the trust rule's check degrades the part: either an agent
        # is misconfigured or something else answers where the job's ranks talk.
        refused = any(c.refused for _, lk in lookups for c in lk.ignored)
        return [
            PartStatus(
                self.name,
                PartState.DEGRADED if refused else PartState.OK,
                self._describe(peers),
                self._interval_s,
                self._pulls,
            )
        ]

    def _describe(self, peers: list[Peer]) -> str:
        if self._configured:
            return f"pulling rank signals from {len(peers)} peers"
        if self._discovery is None and self._connections is None:
            return "no peers configured: only this node's ranks are compared"
        lookups = sorted(self._lookups.items())
        ignored = [f"{c.target} ({c.reason})" for _, lk in lookups for c in lk.ignored]
        if len(ignored) > MAX_LISTED:
            ignored[MAX_LISTED:] = [f"{len(ignored) - MAX_LISTED} more"]
        notes = [f"job {j}: {lk.note}" for j, lk in lookups if lk.note]
        tail = "".join(
            f"; {what}"
            for what in (
                f"not peers: {', '.join(ignored)}" if ignored else "",
                "; ".join(notes),
            )
            if what
        )
        if not peers:
            if not any(not SlurmPeers.is_slurm_job(j) for j, _ in lookups):
                return "no peers: this node's ranks are in no SLURM job that has other nodes" + tail
            return (
                "no peers: no agent at the addresses this node's ranks talk to holds "
                "ranks of their jobs" + tail
            )
        got = dict(self._got)
        each = ", ".join(
            f"{p.name}{f', the node of {_listed(p.via)}' if p.via else ''}: "
            f"{len(got.get(p.target, (0.0, []))[1])} ranks"
            for p in peers
        )
        jobs = sorted({p.job_id for p in peers})
        slurm = [j for j in jobs if SlurmPeers.is_slurm_job(j)]
        other = [j for j in jobs if not SlurmPeers.is_slurm_job(j)]
        named = ([f"SLURM job {', '.join(slurm)}"] if slurm else []) + (
            [f"job {', '.join(other)} (found from its ranks' connections)"] if other else []
        )
        return (
            f"pulling rank signals from {len(peers)} peers of {' and '.join(named)} ({each}){tail}"
        )

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
        """The configured peers, else the other nodes of this node's ranks' jobs: from SLURM
        for SLURM jobs, from the ranks' connections for the others."""
        if self._discovery is None and self._connections is None:
            return list(self._configured)
        slurm_jobs = (
            {j for j in self._jobs() if SlurmPeers.is_slurm_job(j)}
            if self._discovery is not None
            else set()
        )
        # A job no scheduler names: its ranks' pids here (a rank without a job key is in no
        # job its peers could name).
        other_jobs = (
            {
                j: tuple(pids)
                for j, pids in self._rank_pids().items()
                if j and not SlurmPeers.is_slurm_job(j)
            }
            if self._connections is not None
            else {}
        )
        self._lookups = {
            j: lk for j, lk in self._lookups.items() if j in slurm_jobs or j in other_jobs
        }
        now = time.monotonic()
        for job in sorted(slurm_jobs):
            last = self._lookups.get(job)
            if last is not None and now - last.at < self._rediscover_s:
                continue
            assert self._discovery is not None
            self._lookups[job] = await self._slurm_lookup(self._discovery, job, last, now)
        for job in set(self._looking) - set(other_jobs):
            self._looking.pop(job).cancel()
        self._harvest()
        for job, pids in sorted(other_jobs.items()):
            last = self._lookups.get(job)
            if job in self._looking or (
                last is not None and now - last.at < self._retry_after(last)
            ):
                continue
            assert self._connections is not None
            # Addresses that do not answer take seconds to give up on: the lookup runs beside
            # the pulls, which wait for it at most a second (the usual lookup takes
            # milliseconds) and take its result in a later round otherwise.
            self._looking[job] = asyncio.create_task(
                self._connection_lookup(self._connections, job, pids, last, now),
                name=f"detection-peers-lookup-{job}",
            )
        if self._looking:
            await asyncio.wait(self._looking.values(), timeout=min(1.0, self._interval_s / 2))
            self._harvest()
        unique: dict[str, Peer] = {}
        for lk in self._lookups.values():
            for p in lk.peers:
                unique.setdefault(p.target, p)
        return list(unique.values())

    def _harvest(self) -> None:
        """Take the results of the connection lookups that have ended."""
        for job, task in list(self._looking.items()):
            if not task.done():
                continue
            del self._looking[job]
            error = task.exception()
            if error is None:
                self._lookups[job] = task.result()
                continue
            # A fault of the lookup itself must not end the pulls: named, retried later.
            log.error("detection: looking up job %s's other agents failed: %r", job, error)
            self._lookups[job] = _Lookup(time.monotonic(), (), f"lookup failed: {error!r}")

    def _retry_after(self, last: _Lookup) -> float:
        """A job's connections are looked at again after ``rediscover_s``; while they lead
        to no peer, sooner, backing off: 5 s (three intervals, when longer), then twice as
        long each time up to ``rediscover_s`` (the other agents may not have seen their
        ranks' first interval, or answered in time, when this one looked; a job whose
        addresses hold no agent is not probed every few seconds for ever)."""
        if last.peers:
            return self._rediscover_s
        first = max(5.0, 3 * self._interval_s)
        return min(self._rediscover_s, first * float(2 ** max(0, last.misses - 1)))

    async def _slurm_lookup(
        self, discovery: SlurmPeers, job: str, last: _Lookup | None, now: float
    ) -> _Lookup:
        try:
            # SLURM's commands block: not on the event loop.
            found = await asyncio.to_thread(discovery.peers, job)
        except NodeResolutionError as e:
            if last is None or not last.error:
                log.warning("detection: the nodes of job %s are unknown: %s", job, e)
            return _Lookup(now, (), str(e))
        if last is None or last.peers != tuple(found):
            log.info(
                "detection: job %s's other nodes: %s",
                job,
                ", ".join(f"{p.name} ({p.target})" for p in found) or "none",
            )
        return _Lookup(now, tuple(found))

    async def _connection_lookup(
        self,
        connections: ConnectionPeers,
        job: str,
        pids: Sequence[int],
        last: _Lookup | None,
        now: float,
    ) -> _Lookup:
        candidates, note = await connections.candidates(job, pids)
        found = tuple(
            Peer(c.target, c.target.rpartition(":")[0].strip("[]"), job, c.via)
            for c in candidates
            if not c.reason
        )
        ignored = tuple(c for c in candidates if c.reason)
        if last is None or last.peers != found or last.ignored != ignored:
            log.info(
                "detection: job %s's other agents, from its ranks' connections: %s%s",
                job,
                ", ".join(
                    p.target + (f" (the node of {_listed(p.via)})" if p.via else "") for p in found
                )
                or "none",
                "".join(f"; {c.target} {c.reason}" for c in ignored),
            )
        for c in ignored:
            if c.refused and (last is None or c not in last.ignored):
                log.warning("detection: job %s: %s %s", job, c.target, c.reason)
        misses = 0 if found else (last.misses + 1 if last is not None else 1)
        return _Lookup(now, found, ignored=ignored, note=note, misses=misses)

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
