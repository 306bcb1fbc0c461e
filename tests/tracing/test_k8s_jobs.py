"""Job ids for Kubernetes training jobs: a trainer without ``$SLURM_JOB_ID`` is given the id
derived from its job's name, read from its environment as the training operators set it
(Kubeflow's PyTorchJob and TrainJob) or as a pod's downward API puts a label there (JobSet),
so ``gputrace --job NAME`` / ``--job-id`` select the job's trainers on every node."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from tracing_harness import TRAINERS, Harness

from bpfdyno.cli.tracing import format_trainers
from bpfdyno.core.k8s_jobs import check_job_name, job_id_of, kubernetes_job
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.traces import ProcState

#: The in-cluster API server a pod's environment names.
IN_POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
#: What Kubeflow's training operator sets in a PyTorchJob's worker pod (job "llama-ft" with a
#: Master replica): the master's service name is "<job>-master-0".
PYTORCHJOB_WORKER = {
    **IN_POD,
    "MASTER_ADDR": "llama-ft-master-0",
    "PET_MASTER_ADDR": "llama-ft-master-0",
    "MASTER_PORT": "23456",
    "PET_MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
    "RANK": "1",
    "PYTHONUNBUFFERED": "1",
}
#: What Kubeflow Trainer sets in a TrainJob's node pod (TrainJob "llama-ft").
TRAINJOB_NODE = {
    **IN_POD,
    "PET_MASTER_ADDR": "llama-ft-node-0-0.llama-ft",
    "PET_MASTER_PORT": "29400",
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "1",
    "PET_NODE_RANK": "1",
}
#: A JobSet's pod sets no job environment of its own; its spec puts the JobSet's label
#: there with the downward API (docs/deployment.md).
JOBSET_POD = {**IN_POD, "BPFDYNO_JOB_NAME": "bert-pretrain", "JOB_COMPLETION_INDEX": "0"}
LLAMA, BERT = 1174309685586, 1832998557419


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (PYTORCHJOB_WORKER, ("llama-ft", "MASTER_ADDR (PyTorchJob)", LLAMA)),
        (TRAINJOB_NODE, ("llama-ft", "PET_MASTER_ADDR (TrainJob)", LLAMA)),
        (JOBSET_POD, ("bert-pretrain", "BPFDYNO_JOB_NAME", BERT)),
        ({**JOBSET_POD, "BPFDYNO_JOB_NAME": "ml/bert-pretrain"},
         ("ml/bert-pretrain", "BPFDYNO_JOB_NAME", 1832074013345)),
    ],
    ids=["pytorchjob", "trainjob", "jobset", "namespaced"],
)  # fmt: skip
def test_the_job_of_each_operators_pods(
    env: dict[str, str], expected: tuple[str, str, int]
) -> None:
    job = kubernetes_job(env)
    assert job is not None and (job.name, job.source, job.job_id) == expected


@pytest.mark.parametrize(
    "env",
    [
        {**PYTORCHJOB_WORKER, "SLURM_JOB_ID": "77"},  # SLURM's id counts
        {**PYTORCHJOB_WORKER, "KUBERNETES_SERVICE_HOST": ""},  # not in a pod
        {**IN_POD, "MASTER_ADDR": "10.0.0.7"},  # torchrun by hand
        {**IN_POD, "PET_MASTER_ADDR": "a-node-0-0.b"},  # not a TrainJob's own service
        {**IN_POD, "BPFDYNO_JOB_NAME": "no spaces please"},
        {},
    ],
    ids=["slurm", "no-pod", "by-hand", "other-service", "bad-name", "none"],
)
def test_no_kubernetes_job(env: dict[str, str]) -> None:
    assert kubernetes_job(env) is None


def test_ids_are_the_same_everywhere_and_never_a_slurm_jobs() -> None:
    assert job_id_of("llama-ft") == LLAMA  # a constant: every node and client agrees
    assert all(job_id_of(f"job-{i}") >= 10**12 for i in range(1000))
    with pytest.raises(ValueError, match=r"job name 'a b': write the training job's name"):
        check_job_name("a b")


@pytest.mark.slow
@pytest.mark.root
@pytest.mark.usefixtures("torch_ready")
async def test_trainers_get_their_jobs_id_and_gputrace_selects_them(short_tmp: Path) -> None:
    h = Harness(short_tmp, capture=False)
    argv = [sys.executable, str(TRAINERS / "linear.py"), "--seconds=120"]
    async with h:
        worker = h.spawn(argv, extra_env=PYTORCHJOB_WORKER)
        jobset = h.spawn(argv, extra_env=JOBSET_POD)
        slurm = h.spawn(argv, job_id=77, extra_env=JOBSET_POD)
        views = await h.wait_trainers(
            lambda ts: len(ts) == 3 and sum(bool(t.job_name) for t in ts) == 2, timeout=90
        )
        by_pid = {t.host_pid: (t.job_id, t.job_name) for t in views}
        assert by_pid == {
            worker.pid: (LLAMA, "llama-ft"),
            jobset.pid: (BERT, "bert-pretrain"),
            slurm.pid: (77, ""),  # its own SLURM job id wins
        }
        table = format_trainers(views)  # type: ignore[arg-type]  # TrainerView: same fields
        assert " llama-ft " in table and " bert-pretrain " in table
        # The job's id (what gputrace --job llama-ft sends) selects its trainer only.
        start = h.service.start_trace(
            TraceRequest(
                job_id=job_id_of("llama-ft"),
                options=TraceSpec(log_file=str(h.trace_dir / "t.json"), iterations=2),
            )
        )
        assert [p.pid for p in start.triggered] == [worker.pid]
        done = await h.wait_done(start.trace_id, timeout=90)
        [p] = done.processes
        assert p.state is ProcState.WRITTEN, p.reason
