"""One Kubernetes pod's processes and trainers on one agent: what ``--pod`` selects.

A process's pod is known two ways, both by the agent's process table (``pod=`` filter,
`bpfdyno.rpc.processes.pod_matches`): its uid is in the process's cgroup path on every
Kubernetes node (``kubepods…pod<uid>``), with no kubelet needed; its namespace and name come
from the kubelet's pod-resources API, which names the pods holding a device (a GPU), for
every process of them. The pod-resources API gives no pod uid, and the kubelet's own pod list
needs credentials the agent does not hold, so a pod without a device is found by its uid.

When nothing matches, `PodNotFound` says why in the agent's own terms: the kubelet part's
state and reason when no kubelet answers, otherwise what the kubelet does and does not know.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from bpfdyno.client.agent import AgentClient
from bpfdyno.rpc.agent import CollectorState
from bpfdyno.rpc.processes import ProcessRow, QueryError, check_pod
from bpfdyno.rpc.traces import Trainer

#: How to find a pod's uid, for the errors.
UID_HINT = "kubectl get pod -n NAMESPACE NAME -o jsonpath='{.metadata.uid}'"


class PodNotFound(Exception):
    """No process of the pod on this agent's node; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class PodProcesses:
    """A pod's processes on one node (pids as the agent sees them)."""

    pod: str
    processes: tuple[ProcessRow, ...]

    @property
    def pids(self) -> frozenset[int]:
        """Every process of the pod, by its pid here."""
        return frozenset(r.pid for r in self.processes)

    def trainers(self, trainers: Sequence[Trainer]) -> list[Trainer]:
        """The registered trainers that run in the pod (by their pid here, never by the pid
        they report from inside it, which other pods' processes share)."""
        pids = self.pids
        return [t for t in trainers if (t.host_pid or t.pid) in pids]


async def pod_processes(agent: AgentClient, pod: str) -> PodProcesses:
    """The processes of ``pod`` (``NAMESPACE/NAME`` or a pod uid) the agent's table holds:
    its active processes and every registered trainer.

    Raises:
        QueryError: ``pod`` is neither form.
        PodNotFound: no process of it here, with the reason (see the module).
    """
    check_pod(pod)
    table = await agent.processes(limit=0, filter=f"pod={pod}")
    if table.processes:
        return PodProcesses(pod, table.processes)
    if "/" not in pod:
        raise PodNotFound(
            f"no process of pod uid {pod} on this node: no cgroup path here names it "
            "(is the pod scheduled on this node, and running?)"
        )
    kubelet = (await agent.status()).collector("kubelet")
    if kubelet is None or kubelet.state is not CollectorState.OK:
        why = (
            "the agent has no kubelet part"
            if kubelet is None
            else f"its kubelet part is {kubelet.state}: {kubelet.reason or 'no reason given'}"
        )
        raise PodNotFound(
            f"pod {pod}: the agent learns pods' names from the kubelet's pod-resources API, "
            f"and no kubelet answers it ({why}); give the pod's uid instead ({UID_HINT}): "
            "it is read from the processes' cgroups, with no kubelet"
        )
    raise PodNotFound(
        f"no process of pod {pod} on this node: the kubelet names here only the pods that "
        f"hold a device (a GPU); for a pod on this node without one give its uid ({UID_HINT})"
    )


def add_pod_argument(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--pod NAMESPACE/NAME`` (or the pod's uid), checked as the agent checks it."""
    p.add_argument(
        "--pod",
        default=None,
        type=_pod_word,
        metavar="NAMESPACE/NAME",
        help=f"{help_text}: NAMESPACE/NAME (pods holding a GPU, named by the kubelet) or "
        "the pod's uid (any pod)",
    )


def _pod_word(word: str) -> str:
    try:
        return check_pod(word)
    except QueryError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
