"""NCCL late arrival compared across nodes, end to end: two real agents (``bpfdyno serve`` at
two node addresses, on TCP with TLS and a token, each configured with the other as its
detection peer) and six ranks of one job that load the NCCL profiler plugin and reach the
same collectives on the wall clock's beat. Each rank's communicator is a pair split across
the nodes (ranks 0-2 on n1, 3-5 on n2; rank r and r + 3 share one, as pipeline or
data-parallel pairs do), so no rank has a communicator peer on its own node: compared per
node, nobody is ever late. Rank 2 (on n1) and rank 4 (on n2) arrive 40 ms late at each of
their collectives; each agent confirms its late rank against the arrivals pulled from the
other node, and nothing else."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import ADDRESSES, NodeAgent, Pki, free_port, trainer_env, wait_for

from bpfdyno.client.agent import AgentClient
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind, RankSignal
from bpfdyno.sources.nccl_profiler.build import build_plugin

pytestmark = pytest.mark.slow

RANK = Path(__file__).resolve().parent / "nccl_rank.py"
LATE_MS = 40
#: What its peer waits for a late rank per second: 40 ms at each of five collectives a second.
LATE_SHARE = 0.2
#: The job as the agents name it without SLURM: the rendezvous address its ranks share.
MASTER = ("127.0.0.1", "29517")
JOB = f"{MASTER[0]}:{MASTER[1]}"
#: The pair communicators' ids (NCCL's commHash): rank r's is PAIR_COMM + r % 3.
PAIR_COMM = 0x5EED_0000_C0FF_EE00
LATE_RANKS = {2: "n1", 4: "n2"}
#: Rounds of each rank whose late time is summed.
ROUNDS = 5


def _agent(name: str, port: int, peer: str, base: Path, pki: Pki, trace_dir: Path) -> NodeAgent:
    return NodeAgent(
        name,
        ADDRESSES[name],
        port,
        base,
        pki,
        trace_dir,
        # The client side of the agents' TLS: what its pulls reach the peer with.
        env={"BPFDYNO_TLS_CA": str(pki.ca), "BPFDYNO_TOKEN_FILE": str(pki.token)},
        extra_config=(
            "[detection]",
            f'peers = ["{peer}"]',
            "gloo_peer_waits = false",
        ),
    )


def _rank(agent: NodeAgent, library: Path, python: str, rank: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))}
    env.pop("BPFDYNO_NCCL_SHM_DIR", None)  # the plugin's files where the agents look
    env.update(trainer_env())
    env.update(
        KINETO_IPC_SOCKET_DIR=str(agent.socket_dir),
        RANK=str(rank),
        MASTER_ADDR=MASTER[0],
        MASTER_PORT=MASTER[1],
    )
    late = LATE_MS if rank in LATE_RANKS else 0
    comm = f"{PAIR_COMM + rank % 3:x}"
    argv = [python, str(RANK), str(library), comm, str(rank // 3), "2", str(late), "600"]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


@pytest.fixture
def two_agents(
    cluster_base: Path, pki: Pki, trace_dir: Path
) -> Iterator[tuple[NodeAgent, NodeAgent]]:
    """The two nodes' agents, configured but not started (the test starts them while its
    ranks start: six PyTorch imports are most of its time); stopped after it."""
    base = cluster_base / "nccl-late"
    port = free_port([ADDRESSES["n1"], ADDRESSES["n2"]])
    n1 = _agent("n1", port, f"{ADDRESSES['n2']}:{port}", base, pki, trace_dir)
    n2 = _agent("n2", port, f"{ADDRESSES['n1']}:{port}", base, pki, trace_dir)
    try:
        yield n1, n2
    finally:
        for a in (n1, n2):
            a.stop()


async def _events(agent: NodeAgent) -> list[DetectionEvent]:
    async with AgentClient(str(agent.sock)) as client:
        return await client.detection_events(JOB)


async def _signals(agent: NodeAgent) -> list[RankSignal]:
    async with AgentClient(str(agent.sock)) as client:
        return await client.rank_signals(JOB)


# Six PyTorch processes start on a machine that may be loaded.
@pytest.mark.timeout(600)
def test_each_agent_confirms_its_rank_late_against_its_communicator_peer_on_the_other_node(
    two_agents: tuple[NodeAgent, NodeAgent], tmp_path: Path, torch_python: str
) -> None:
    n1, n2 = two_agents
    nodes = {"n1": n1, "n2": n2}
    library = build_plugin(tmp_path / "plugin")
    ranks = [_rank(n1 if r < 3 else n2, library, torch_python, r) for r in range(6)]
    try:
        # The ranks register on Kineto's first poll that finds their agent up.
        for a in (n1, n2):
            a.start()
        for a in (n1, n2):
            a.wait_ready()
        for p in ranks:
            assert p.stdout is not None
            line = p.stdout.readline()
            assert line.startswith("ready "), line
        wait_for(
            lambda: len(n1.trainers()) == 3 and len(n2.trainers()) == 3,
            120,
            "the ranks to register with their nodes' agents",
            step=0.5,
        )

        def confirmed() -> bool:
            return all(
                (DetectionKind.CONFIRMED, r) in {(e.kind, e.rank) for e in asyncio.run(_events(a))}
                for r, a in ((2, n1), (4, n2))
            )

        wait_for(confirmed, 120, "each agent to confirm its late rank", step=0.5)
        events = {name: asyncio.run(_events(a)) for name, a in nodes.items()}
        # The rounds served after the confirmation, ROUNDS of each agent's (one round's
        # count depends on which collectives became countable in it; several average out).
        rounds: dict[tuple[int, float], RankSignal] = {}

        def served_rounds() -> bool:
            for a in (n1, n2):
                rounds.update({(s.rank, s.end_unix_seconds): s for s in asyncio.run(_signals(a))})
            return all(sum(1 for r, _ in rounds if r == rank) >= ROUNDS for rank in range(6))

        wait_for(served_rounds, 60, f"{ROUNDS} rounds of every rank", step=0.3)
    finally:
        for p in ranks:
            p.terminate()
        for p in ranks:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    for rank, name in LATE_RANKS.items():
        confirmation = next(e for e in events[name] if e.kind is DetectionKind.CONFIRMED)
        assert (confirmation.rank, confirmation.pid) == (rank, ranks[rank].pid)
        late = next(e for e in confirmation.evidence if e.name == "late_share")
        assert late.value > 0.05 > late.job_median, late  # over the score's floor, the job under
        # No other rank is named late (the machine's other load may make a rank wait for a
        # CPU: that is another score's business).
        named_late = {
            e.rank for e in events[name] if any(x.name == "late_share" for x in e.evidence)
        }
        assert named_late == {rank}, events[name]
    by_rank: dict[int, list[RankSignal]] = {r: [] for r in range(6)}
    for (r, _), s in sorted(rounds.items(), key=lambda kv: kv[0][1]):
        assert s.arrivals_known and s.late_seconds is not None, s
        by_rank[r].append(s)
    for r, signals in by_rank.items():
        # 40 ms late at each of five collectives a second: 0.2 of each second. Each round
        # counts the collectives whose arrivals from both nodes came in by then (those of
        # an interval a pull missed come in the next), so over ROUNDS rounds the count is
        # off by at most what one round's edges hold.
        share = sum(s.late_seconds or 0.0 for s in signals) / sum(
            s.interval_seconds for s in signals
        )
        if r in LATE_RANKS:
            assert LATE_SHARE / 2 < share < LATE_SHARE * 1.5, (r, share, signals)
        else:
            assert share < 0.05, (r, share, signals)  # a loaded CPU wakes it a little late
    served = {r: signals[-1] for r, signals in by_rank.items()}
    # Each rank sends the collectives of its last two intervals: five a second, ten in two
    # intervals, give or take the five of one interval as the plugin's poll and the
    # detection's round (both each second) drift against each other.
    rates = [
        sum(len(c.seq_deltas) for c in s.arrivals) / (2 * s.interval_seconds)
        for s in served.values()
    ]
    assert all(2 <= x <= 8 for x in rates), rates
