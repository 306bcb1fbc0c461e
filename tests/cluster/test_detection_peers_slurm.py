"""Detection peers found from the job: each agent of the test cluster (no ``[detection] peers``
configured) looks up its ranks' SLURM job with ``squeue``/``scontrol`` and pulls the job's
other node's rank signals over TLS with the token, as any client reaches an agent."""

from __future__ import annotations

from pathlib import Path

import pytest
from cluster_harness import (
    NodeAgent,
    SlurmCluster,
    cleanup,
    submit_trainers,
    wait_for,
    wait_registered,
)

from bpfdyno.rpc.v1 import agent_pb2

pytestmark = pytest.mark.slow

#: One rank per task: its RANK is SLURM's task id, as a SLURM launcher of torch sets it.
RANK_WRAPPER = """#!/bin/sh
export KINETO_IPC_SOCKET_DIR="{base}/k/$SLURMD_NODENAME"
export RANK="$SLURM_PROCID"
exec "{python}" "{trainer}" --seconds "$1"
"""


def _peers_part(agent: NodeAgent) -> agent_pb2.CollectorStatus:
    (part,) = [c for c in agent.status().collectors if c.name == "detection_peers"]
    return part


def test_each_agent_pulls_the_ranks_of_its_job_s_other_node_found_from_slurm(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    cluster_base: Path,
    torch_python: str,
) -> None:
    trainer = Path(__file__).resolve().parents[1] / "tracing" / "trainers" / "linear.py"
    # The harness's wrapper, with RANK: the job's processes are ranks.
    ranked = cluster_base / "ranked"
    ranked.mkdir(exist_ok=True)
    (ranked / "rank.sh").write_text(
        RANK_WRAPPER.format(base=cluster_base, python=torch_python, trainer=trainer)
    )
    (ranked / "rank.sh").chmod(0o755)
    job = submit_trainers(slurm, ranked, "ranks2", ["--nodes=2"])
    try:
        slurm.wait_running(job.job)
        names = slurm.job_nodes(job.job)
        assert len(names) == 2
        wait_registered(agents, job, names, int(job.job))
        a, b = names
        outside = next(n for n in agents if n not in names)
        expected = {
            a: f"pulling rank signals from 1 peers of SLURM job {job.job} ({b}: 1 ranks)",
            b: f"pulling rank signals from 1 peers of SLURM job {job.job} ({a}: 1 ranks)",
        }

        def pulled() -> bool:
            return all(_peers_part(agents[n]).reason == expected[n] for n in names)

        try:
            wait_for(pulled, 60, "each agent to pull its job's other node's rank")
        except AssertionError:
            got = {n: _peers_part(agents[n]).reason for n in names}
            raise AssertionError(f"expected {expected}, got {got}") from None
        for n in names:
            assert _peers_part(agents[n]).state == agent_pb2.COLLECTOR_STATE_OK
        # A node the job does not run on has nothing to pull.
        assert _peers_part(agents[outside]).reason == (
            "no peers: this node's ranks are in no SLURM job that has other nodes"
        )
    finally:
        slurm.scancel(job.job)
        cleanup(ranked / "jobs")
