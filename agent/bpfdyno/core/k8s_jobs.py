"""Job ids for Kubernetes training jobs, which have no ``$SLURM_JOB_ID``.

Kineto sends one number as a trainer's job (``$SLURM_JOB_ID``, else 0), and ``gputrace
--job-id`` selects by it. A trainer started by a Kubernetes training operator has none; its
job is named instead. The agent reads the name from the trainer's environment (as the
operators set it, or as the pod's downward API puts a label there) and gives the trainer the
job id `job_id_of` derives from it: the same number on every node, for every pod of the job,
which ``gputrace --job NAME`` computes from the name too.

Where the name comes from, first match wins (`kubernetes_job`):

- ``BPFDYNO_JOB_NAME``: set by the pod spec, e.g. from the operator's label through the
  downward API (``metadata.labels['training.kubeflow.org/job-name']`` for a PyTorchJob,
  ``metadata.labels['jobset.sigs.k8s.io/jobset-name']`` for a JobSet, which sets no
  environment of its own);
- a Kubeflow Trainer ``TrainJob``: ``PET_MASTER_ADDR=<name>-node-0-0.<name>``;
- a Kubeflow ``PyTorchJob`` with a Master replica: ``MASTER_ADDR`` (and ``PET_MASTER_ADDR``)
  ``=<name>-master-0``, in a pod (``KUBERNETES_SERVICE_HOST`` set).

Names are those of the job object, unique in its namespace; two namespaces' jobs of one name
share an id (give ``BPFDYNO_JOB_NAME=NAMESPACE/NAME`` to tell them apart).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: The environment variables `kubernetes_job` reads.
ENV_NAMES = (
    "BPFDYNO_JOB_NAME",
    "PET_MASTER_ADDR",
    "MASTER_ADDR",
    "KUBERNETES_SERVICE_HOST",
    "SLURM_JOB_ID",
)
#: Derived ids are at least this: above any SLURM job id seen in practice (32-bit counters),
#: so one is never taken for a SLURM job's.
DERIVED_BASE = 10**12
_DNS_LABEL = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?"
_TRAIN_JOB = re.compile(rf"({_DNS_LABEL})-node-0-0\.\1")
_PYTORCH_JOB = re.compile(rf"({_DNS_LABEL})-master-0")
#: What a job name given in BPFDYNO_JOB_NAME may hold: a name, or NAMESPACE/NAME.
_GIVEN = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]{0,252}(?:/[A-Za-z0-9][-A-Za-z0-9_.]{0,252})?")


@dataclass(frozen=True, slots=True)
class KubernetesJob:
    """A training job's name, where it was read, and its job id."""

    name: str
    source: str

    @property
    def job_id(self) -> int:
        return job_id_of(self.name)


def job_id_of(name: str) -> int:
    """The job id of a Kubernetes job name: `DERIVED_BASE` plus 12 decimal digits of the
    name's SHA-256 (the same everywhere; collisions are one in 10^12 per pair)."""
    digest = hashlib.sha256(name.encode()).digest()
    return DERIVED_BASE + int.from_bytes(digest[:8], "big") % DERIVED_BASE


def check_job_name(name: str) -> str:
    """A job name as ``--job`` and ``BPFDYNO_JOB_NAME`` take it.

    Raises:
        ValueError: anything else, with the forms that work.
    """
    if not _GIVEN.fullmatch(name):
        raise ValueError(
            f"job name {name!r}: write the training job's name (as kubectl shows it) or "
            "NAMESPACE/NAME"
        )
    return name


def kubernetes_job(env: Mapping[str, str]) -> KubernetesJob | None:
    """The Kubernetes training job a process belongs to, from its environment; None when
    it has a SLURM job id (that one counts) or none of the module's sources names a job."""
    if env.get("SLURM_JOB_ID"):
        return None
    given = env.get("BPFDYNO_JOB_NAME", "")
    if given and _GIVEN.fullmatch(given):
        return KubernetesJob(given, "BPFDYNO_JOB_NAME")
    pet = env.get("PET_MASTER_ADDR", "")
    if m := _TRAIN_JOB.fullmatch(pet):
        return KubernetesJob(m.group(1), "PET_MASTER_ADDR (TrainJob)")
    if env.get("KUBERNETES_SERVICE_HOST"):
        for var in ("MASTER_ADDR", "PET_MASTER_ADDR"):
            if m := _PYTORCH_JOB.fullmatch(env.get(var, "")):
                return KubernetesJob(m.group(1), f"{var} (PyTorchJob)")
    return None
