"""Who holds the agent's Kineto name ``@dynolog@`` when the agent cannot bind it.

The abstract name has no owner and no permission check: in a network namespace the first
process to bind it gets it, and every trainer's libkineto sends its polls there and takes
the answers as the node's. A user who holds it while the agent (re)starts answers other
users' trainers in the agent's place. The kernel names the socket's inode in
``/proc/net/unix`` (the name written ``@dynolog@``, its NULs as ``@``) and its holders by
their open files (``/proc/<pid>/fd``); this module reads both so `status` and `doctor` can
say who it is. A holder that is not root (nor the agent's own user) is an attack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from bpfdyno.core.identity import ROOT_UID, user_name
from bpfdyno.core.pidfs import socket_holders, unix_socket_inodes
from bpfdyno.core.text import shown

#: ``\0dynolog\0`` as /proc/net/unix writes it.
SHOWN_NAME = "@dynolog@"


@dataclass(frozen=True, slots=True)
class Holder:
    """A process holding the name.

    Attributes:
        pid: its pid (in the agent's pid namespace).
        uid: its effective uid; None when it could not be read (gone meanwhile).
        comm: its command name, as it set it.
    """

    pid: int
    uid: int | None
    comm: str

    def describe(self) -> str:
        who = "an unknown uid" if self.uid is None else f"uid {self.uid}"
        if self.uid is not None and user_name(self.uid):
            who += f" ({user_name(self.uid)})"
        return f"pid {self.pid} ({shown(self.comm)}) of {who}"


def name_holders(proc_root: Path = Path("/proc")) -> list[Holder]:
    """The processes holding ``@dynolog@`` in this network namespace (none: it is free, or
    held from another pid namespace)."""
    out = []
    for pid in socket_holders(proc_root, unix_socket_inodes(proc_root, SHOWN_NAME)):
        base = proc_root / str(pid)
        try:
            uid: int | None = base.stat().st_uid
        except OSError:
            uid = None
        try:
            comm = (base / "comm").read_text(errors="replace").strip()
        except OSError:
            comm = "?"
        out.append(Holder(pid, uid, comm))
    return out


def trusted(holder: Holder, agent_uids: frozenset[int]) -> bool:
    """Whether ``holder`` may hold the name: root, or the agent's own user."""
    return holder.uid == ROOT_UID or holder.uid in agent_uids


def impostors(holders: list[Holder], agent_uids: frozenset[int]) -> list[Holder]:
    return [h for h in holders if not trusted(h, agent_uids)]


def taken_reason(holders: list[Holder], agent_uids: frozenset[int]) -> str:
    """Why the agent has no ``@dynolog@``, naming whoever holds it; an attack says so first."""
    bad = impostors(holders, agent_uids)
    if bad:
        names = ", ".join(h.describe() for h in bad)
        pids = " ".join(str(h.pid) for h in bad)
        return (
            f"ATTACK: the Kineto name @dynolog@ is held by {names}, not by this agent: that "
            "process receives every trainer's polls on this node and answers them in the "
            f"agent's place. Stop it (kill {pids}) — the agent takes the name back within "
            "seconds — and find out who started it; to take the name out of users' reach, "
            "use the per-user socket layout ([kineto] socket_dir, see docs/security.md)"
        )
    if holders:
        names = ", ".join(h.describe() for h in holders)
        return (
            f"the Kineto name @dynolog@ is held by {names} (dynolog or another bpfdyno); "
            "stop it, or set [kineto] socket_dir and KINETO_IPC_SOCKET_DIR for the trainers"
        )
    return (
        "the Kineto name @dynolog@ is taken by a process this agent cannot see (another pid "
        "namespace); stop it, or set [kineto] socket_dir and KINETO_IPC_SOCKET_DIR"
    )


def agent_uids() -> frozenset[int]:
    """The uids an agent of this node may run as: root and this process's own."""
    return frozenset({ROOT_UID, os.geteuid()})
