"""Who really sent a Kineto poll: the kernel's credentials against the pids the poll claims.

A poll carries the client's pid and up to 10 ancestors, and dynolog believes them: any local
user could poll as a root trainer's pid and block its traces ("two processes would write the
same file") or receive its config. The endpoint's socket has ``SO_PASSCRED``, so the kernel
attaches the sender's real pid, uid and gid to every datagram (``SCM_CREDENTIALS``, the pid
translated into the daemon's pid namespace). `ClaimVerifier` compares:

* the claimed leaf pid must be the sender itself: its pid here, or — for a process in
  another pid namespace (a container) — its pid in its own namespace (the last ``NSpid``
  entry of ``/proc/<pid>/status``); otherwise the poll is ignored (``pid_mismatch``);
* the claimed ancestors are kept only as far as ``/proc`` confirms the chain of parents,
  seen from the trainer's namespace; an unconfirmed tail is dropped, so a process cannot
  make itself match a request for someone else's launcher;
* root in the daemon's own pid namespace may claim any pids (it can forge credentials
  anyway; simulators and tests rely on it).

Each verdict is cached per (sender pid, uid, claimed pids): a trainer polling with the same
claims costs one dictionary lookup; only its first poll reads ``/proc``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from bpfdyno.core.identity import ROOT_UID
from bpfdyno.core.pidfs import read_status, status_ints

#: Verdicts remembered (one per live trainer is enough; liars rotate through it).
CACHE_SIZE = 8192


class SenderCreds(NamedTuple):
    """The kernel's credentials of a datagram's sender (``struct ucred``; a tuple, as it is
    built for every datagram).

    Attributes:
        pid: the sending process, in the daemon's pid namespace.
        uid: its real uid, in the daemon's user namespace.
        gid: its real gid.
    """

    pid: int
    uid: int
    gid: int


class Resolution(NamedTuple):
    """What the kernel confirms of a poll's claims.

    Attributes:
        pids: the confirmed claimed pids (see `ClaimVerifier.verify`); None: refused.
        host_pid: the process the poll stands for, in the agent's pid namespace.
        seen: False when /proc here has no entry for the sender (gone, or hidden from the
            agent), so nothing could be checked: refused for that reason.
    """

    pids: tuple[int, ...] | None
    host_pid: int
    seen: bool = True


@dataclass(frozen=True, slots=True)
class _Status:
    ppid: int
    nspids: tuple[int, ...]


class ClaimVerifier:
    """Checks the pids a poll claims against its sender's credentials.

    Args:
        proc_root: where /proc is.
    """

    def __init__(self, proc_root: Path = Path("/proc")) -> None:
        self._proc = proc_root
        self._cache: OrderedDict[tuple[int, int, tuple[int, ...]], Resolution] = OrderedDict()

    def verify(self, sender: SenderCreds, claimed: tuple[int, ...]) -> tuple[int, ...] | None:
        """The claimed pids the kernel confirms, or None when the leaf is not the sender.

        Returns:
            ``claimed`` itself when all of it holds, a prefix (leaf plus the confirmed
            ancestors) otherwise; None when the claimed leaf is not the sender.
        """
        return self.resolve(sender, claimed)[0]

    def resolve(self, sender: SenderCreds, claimed: tuple[int, ...]) -> Resolution:
        """`verify`'s answer, and the process the poll stands for as this agent's pid
        namespace knows it (its host pid): the sender's pid from the kernel — except for
        root in our own namespace speaking for another pid (a simulator), whose claim is a
        pid here. Never a pid a process reports about itself from another namespace."""
        if sender.uid == ROOT_UID and sender.pid == claimed[0]:
            return Resolution(claimed, sender.pid)  # root, itself: a root trainer
        key = (sender.pid, sender.uid, claimed)
        cache = self._cache
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
        verdict = self._verify(sender, claimed)
        cache[key] = verdict
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
        return verdict

    def _verify(self, sender: SenderCreds, claimed: tuple[int, ...]) -> Resolution:
        own = self._status(sender.pid)
        if own is None:
            return Resolution(None, sender.pid, seen=False)  # nothing to vouch for it
        depth = len(own.nspids)
        if sender.uid == ROOT_UID and depth == 1:
            return Resolution(claimed, claimed[0])  # root in our namespace may claim anything
        if own.nspids[-1] != claimed[0]:
            return Resolution(None, sender.pid)
        confirmed = [claimed[0]]
        status = own
        for ancestor in claimed[1:]:
            parent = self._status(status.ppid) if status.ppid > 0 else None
            # The parent must be in the trainer's namespace (as deep) and carry that pid there.
            if parent is None or len(parent.nspids) < depth or parent.nspids[depth - 1] != ancestor:
                break
            confirmed.append(ancestor)
            status = parent
        return Resolution(tuple(confirmed), sender.pid)

    def _status(self, pid: int) -> _Status | None:
        fields = read_status(self._proc, pid, ("PPid", "NSpid"))
        if fields is None:
            return None
        ppid, nspids = status_ints(fields, "PPid"), status_ints(fields, "NSpid")
        if not ppid or not nspids:
            return None
        return _Status(ppid[0], tuple(nspids))
