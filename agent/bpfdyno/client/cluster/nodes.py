"""Which machines a job runs on, and where their agents listen.

A job's nodes come from SLURM (``squeue`` and ``scontrol``) or from a list of hosts the user
gives. Each `Node` names the agent's gRPC TCP address and the numeric job ids its processes
carry in ``$SLURM_JOB_ID`` there — what PyTorch reports to the agent, and so what a trace
request must name:

- a plain job ``123``: 123 on every node;
- an array task ``123_4``: the task's own job id (``squeue -o %A``), not 123; a whole array
  ``123`` covers every task, each with its own id on its own nodes;
- a heterogeneous job ``123+1`` (one component) or ``123`` (all of them): the leader's id,
  123, which ``srun`` gives the steps of every component.

SLURM addresses a node by its ``NodeAddr`` (``NodeHostname``, else the node name, when not
set); so does this module, so the agent must be reachable — and its TLS certificate valid —
at that address.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Port of the agents' gRPC TCP listener (``[grpc] tcp``) when none is configured or given.
DEFAULT_AGENT_PORT = 50051
#: How long one SLURM command may take (slurmctld answers in milliseconds when healthy).
SLURM_TIMEOUT_S = 30.0

_JOB_RE = re.compile(r"(?P<job>\d+)(?:_(?P<task>\d+)|\+(?P<het>\d+))?")
_HOST_RE = re.compile(
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9_.\-]+))(?::(?P<port>\d{1,5}))?"
)


class NodeResolutionError(Exception):
    """The job's nodes cannot be found; the message says why and what to do."""


class SchedulerUnavailable(NodeResolutionError):
    """No scheduler answers here (SLURM not installed, slurmctld unreachable or silent): the
    job's nodes are unknown, not the job. Callers may then mean this node only, as dyno does.

    Attributes:
        reason: the short cause ("squeue is not installed", "squeue failed: ...").
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Node:
    """One machine of the job, as its agent is reached.

    Attributes:
        name: the SLURM node name, or the host as given.
        target: ``host:port`` of the agent's gRPC TCP listener.
        job_ids: the ``$SLURM_JOB_ID`` values the job's processes carry on this machine;
            empty when not known (hosts given by hand): the request's own job id is used.
        pids: the job's processes there, as that machine's agent knows them, for a job no
            scheduler names (its agent's rank signals list them); when given, they are
            traced, not a job id.
    """

    name: str
    target: str
    job_ids: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class JobRef:
    """A SLURM job as a user names it: ``123``, an array task ``123_4`` or a het component
    ``123+1``.

    Attributes:
        text: as given.
        job: the job (or array, or het leader) id.
        array_task: the array task index, if one was named.
        het_offset: the heterogeneous job component, if one was named.
    """

    text: str
    job: int
    array_task: int | None = None
    het_offset: int | None = None

    @classmethod
    def parse(cls, text: str) -> JobRef:
        """Read a job id as SLURM writes it.

        Raises:
            NodeResolutionError: not ``N``, ``N_T`` or ``N+K``.
        """
        m = _JOB_RE.fullmatch(text.strip())
        if m is None:
            raise NodeResolutionError(
                f"job id {text!r} is not a SLURM job id: give a number (1234), an array task "
                "(1234_5) or a heterogeneous job component (1234+1)"
            )
        task, het = m.group("task"), m.group("het")
        return cls(
            text=text.strip(),
            job=int(m.group("job")),
            array_task=int(task) if task is not None else None,
            het_offset=int(het) if het is not None else None,
        )

    @property
    def plain(self) -> bool:
        """Whether this is a job number alone (no task, no component)."""
        return self.array_task is None and self.het_offset is None


@dataclass(frozen=True, slots=True)
class SlurmJob:
    """What SLURM says about a job: the nodes to ask, and the parts not running.

    Attributes:
        ref: the job as named.
        nodes: the nodes running it, in SLURM's order.
        not_running: its tasks or components without nodes, e.g. ``"123_7 PENDING"``.
    """

    ref: JobRef
    nodes: tuple[Node, ...]
    not_running: tuple[str, ...] = field(default=())


def format_target(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _parse_host(item: str, port: int) -> Node:
    m = _HOST_RE.fullmatch(item)
    if m is None:
        raise NodeResolutionError(
            f"{item!r} is not a host: write a name or address, optionally with :PORT "
            "(node7, 10.0.0.5:50051, [fd00::5]:50051)"
        )
    host = m.group("v6") or m.group("host")
    host_port = int(m.group("port") or port)
    if not 0 < host_port < 65536:
        raise NodeResolutionError(f"{item!r}: the port must be in 1..65535")
    return Node(name=host, target=format_target(host, host_port))


def nodes_from_hosts(items: Iterable[str], port: int = DEFAULT_AGENT_PORT) -> list[Node]:
    """Nodes for hosts given by hand (``HOST`` or ``HOST:PORT``), duplicates dropped.

    Raises:
        NodeResolutionError: an item is not a host, or there is none.
    """
    nodes: dict[str, Node] = {}
    for item in items:
        item = item.strip()
        if item:
            node = _parse_host(item, port)
            nodes.setdefault(node.target, node)
    if not nodes:
        raise NodeResolutionError("no hosts given: list them as h1,h2,... or one per line")
    return list(nodes.values())


def parse_hosts(text: str, port: int = DEFAULT_AGENT_PORT) -> list[Node]:
    """Nodes from ``h1,h2:50052,...`` (commas or white space between hosts).

    Raises:
        NodeResolutionError: an item is not a host, or there is none.
    """
    return nodes_from_hosts(re.split(r"[,\s]+", text), port)


def read_hosts_file(path: Path, port: int = DEFAULT_AGENT_PORT) -> list[Node]:
    """Nodes from a file: hosts separated by new lines, commas or spaces; ``#`` comments.

    Raises:
        NodeResolutionError: the file cannot be read, an item is not a host, or it is empty.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "it is not UTF-8 text"
        raise NodeResolutionError(f"cannot read the hosts file {path} ({why})") from e
    words = [w for line in text.splitlines() for w in re.split(r"[,\s]+", line.split("#")[0])]
    try:
        return nodes_from_hosts(words, port)
    except NodeResolutionError as e:
        raise NodeResolutionError(f"{path}: {e}") from None


# -- SLURM ----------------------------------------------------------------------------------


def _slurm(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a SLURM client command; its stdout, stderr and status."""
    if shutil.which(argv[0]) is None:
        raise SchedulerUnavailable(
            f"SLURM's {argv[0]} is not installed here, so the job's nodes cannot be looked up: "
            "run this on a node of the cluster, or name the nodes with --hosts h1,h2,... or "
            "--hosts-file FILE",
            reason=f"SLURM's {argv[0]} is not installed",
        )
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=SLURM_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise SchedulerUnavailable(
            f"{argv[0]} did not answer within {SLURM_TIMEOUT_S:g} s: is slurmctld reachable "
            "(`scontrol ping`)? Or name the nodes with --hosts / --hosts-file",
            reason=f"{argv[0]} did not answer within {SLURM_TIMEOUT_S:g} s",
        ) from None


def _failed(argv: Sequence[str], r: subprocess.CompletedProcess[str]) -> NodeResolutionError:
    # A SLURM command that fails for anything but the job itself (the controller's address
    # does not resolve, the connection is refused, munge fails) means no scheduler answers.
    err = " ".join(r.stderr.split()) or f"exit status {r.returncode}"
    return SchedulerUnavailable(
        f"`{' '.join(argv)}` failed: {err}. Check that SLURM answers (`scontrol ping`), or name "
        "the nodes with --hosts / --hosts-file",
        reason=f"{argv[0]} failed: {err if len(err) <= 100 else err[:99] + '…'}",
    )


def _matching_job_id(display_id: str, raw_id: str) -> int:
    """The ``$SLURM_JOB_ID`` of one squeue line's processes (see the module docstring)."""
    if "+" in display_id:
        return int(display_id.split("+", 1)[0])
    return int(raw_id)


def resolve_slurm_job(ref: JobRef, port: int = DEFAULT_AGENT_PORT) -> SlurmJob:
    """The running nodes of a SLURM job (all its array tasks or het components unless one
    is named), each with its agent's address and the job ids to ask for there.

    Raises:
        NodeResolutionError: SLURM is not installed or does not answer, the job is unknown
            (finished, or never existed), or none of it is running.
    """
    argv = ["squeue", "--noheader", "--jobs", ref.text, "--format", "%i|%A|%T|%N"]
    r = _slurm(argv)
    if r.returncode != 0:
        if "Invalid job id" in r.stderr:
            raise NodeResolutionError(
                f"SLURM does not know job {ref.text}: it has ended or never existed (squeue "
                "lists pending and running jobs only)"
            )
        raise _failed(argv, r)
    running: list[tuple[int, str]] = []
    not_running: list[str] = []
    for line in r.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 4:
            continue
        display_id, raw_id, state, nodelist = parts
        # squeue names every component of a het job when asked for one of them.
        if ref.het_offset is not None and display_id != ref.text:
            continue
        if state in ("RUNNING", "COMPLETING", "SUSPENDED") and nodelist:
            running.append((_matching_job_id(display_id, raw_id), nodelist))
        else:
            not_running.append(f"{display_id} {state}")
    if not running:
        what = f" ({', '.join(not_running)})" if not_running else ""
        raise NodeResolutionError(
            f"job {ref.text} has no running part{what}: trace it once it runs (`squeue -j "
            f"{ref.text}`)"
        )
    job_ids: dict[str, set[int]] = {}
    order: list[str] = []
    for job_id, nodelist in running:
        for name in _expand(nodelist):
            if name not in job_ids:
                job_ids[name] = set()
                order.append(name)
            job_ids[name].add(job_id)
    addresses = _node_addresses(order)
    nodes = tuple(
        Node(
            name=name,
            target=format_target(addresses.get(name, name), port),
            job_ids=tuple(sorted(job_ids[name])),
        )
        for name in order
    )
    return SlurmJob(ref=ref, nodes=nodes, not_running=tuple(not_running))


def _expand(nodelist: str) -> list[str]:
    """``n[1-3],gpu7`` -> ``["n1", "n2", "n3", "gpu7"]`` (SLURM's own expansion)."""
    argv = ["scontrol", "show", "hostnames", nodelist]
    r = _slurm(argv)
    if r.returncode != 0:
        raise _failed(argv, r)
    return [name for name in r.stdout.split() if name]


def _node_addresses(names: Sequence[str]) -> dict[str, str]:
    """Node name -> the address SLURM reaches it at (``NodeAddr``)."""
    argv = ["scontrol", "--oneliner", "show", "node", ",".join(names)]
    r = _slurm(argv)
    if r.returncode != 0:
        raise _failed(argv, r)
    out: dict[str, str] = {}
    for line in r.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        name, addr = fields.get("NodeName"), fields.get("NodeAddr")
        if name and addr:
            out[name] = addr
    return out
