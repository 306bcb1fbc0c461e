"""The cluster the tests of this directory share: SLURM with four nodes, an agent per node,
and a two-node job of PyTorch trainers (see `cluster_harness`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_harness import (
    NodeAgent,
    Pki,
    SlurmCluster,
    TrainerJob,
    cleanup,
    make_pki,
    node_agents,
    submit_trainers,
    wait_registered,
    write_wrapper,
)

SLURM_TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol")


@pytest.fixture(scope="session")
def cluster_base() -> Iterator[Path]:
    # Short: the Kineto and gRPC Unix socket paths under it must stay within 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="bdc-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        cleanup(base)


@pytest.fixture(scope="session")
def pki(cluster_base: Path) -> Pki:
    return make_pki(cluster_base / "pki")


@pytest.fixture(scope="session")
def slurm(cluster_base: Path) -> Iterator[SlurmCluster]:
    missing = [t for t in SLURM_TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(
            f"SLURM is not installed ({', '.join(missing)} missing): `vagrant/bootstrap.sh "
            "test` installs slurmctld, slurmd, slurm-client and munge"
        )
    cluster = SlurmCluster(cluster_base / "slurm")
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def trace_dir(cluster_base: Path) -> Path:
    d = cluster_base / "traces"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def agents(
    cluster_base: Path, pki: Pki, trace_dir: Path, slurm: SlurmCluster
) -> Iterator[dict[str, NodeAgent]]:
    with node_agents(cluster_base, pki, trace_dir, slurm) as nodes:
        yield nodes


@pytest.fixture(autouse=True)
def agents_running(request: pytest.FixtureRequest) -> None:
    """Restart an agent a previous test stopped, so every test starts with all four up."""
    if "agents" not in request.fixturenames:
        return
    agents: dict[str, NodeAgent] = request.getfixturevalue("agents")
    stopped = [a for a in agents.values() if not a.running]
    for a in stopped:
        a.start()
    for a in stopped:
        a.wait_ready()


@pytest.fixture(scope="session")
def torch_python() -> str:
    r = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        pytest.fail(
            "PyTorch is needed for the trainers (`vagrant/bootstrap.sh test` installs "
            f"torch==2.13.0): {r.stderr[-500:]}"
        )
    return sys.executable


@pytest.fixture(scope="session")
def trainer_job(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    cluster_base: Path,
    torch_python: str,
) -> Iterator[TrainerJob]:
    """A two-node job, one trainer per node, each registered with its node's agent."""
    write_wrapper(cluster_base)
    job = submit_trainers(slurm, cluster_base, "ddp2", ["--nodes=2"])
    try:
        slurm.wait_running(job.job)
        wait_registered(agents, job, slurm.job_nodes(job.job), int(job.job))
        yield job
    finally:
        slurm.scancel(job.job)
