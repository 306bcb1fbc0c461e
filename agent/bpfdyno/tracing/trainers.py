"""The trainers that poll the daemon: who they are and when they last polled.

Liveness only: what a trainer was handed and how its trace is going is the trace tracker's
(`bpfdyno.tracing.traces`), the one owner of trace state.

A trainer is identified by the address its Kineto client bound (one per process lifetime),
not by its pid: pids repeat across containers (pid namespaces) and after a process exits.
The registry is bounded: entries expire after a configurable silence, and when it is full a
newcomer first evicts an entry that has itself gone quiet, so a flood of fake senders cannot
push out the trainers that are really polling. One user (root excepted) holds at most
``max_per_uid`` entries — its subordinate uids counted as its own (`Principals`), so a
rootless container's thousands of uids are still one user — and when the registry is full
of live entries, a newcomer of a user holding fewer entries than the user holding the most
takes the place of that user's most recently registered one. So users who fill the
registry between them (4096 trainers from 8 accounts) share it with the next user's trainer
instead of keeping it out; they only displace each other.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from bpfdyno.core.identity import ROOT_UID, Principals
from bpfdyno.tracing.ipc.wire import ACTIVITIES_BIT, KinetoContext, KinetoRequest

#: A full registry evicts its quietest entry only if it has been silent at least this long
#: (twice Kineto's default 5 s poll interval), so trainers that poll are never pushed out.
EVICTABLE_AFTER_S = 10.0
#: Bound on the legacy ``ctxt`` bookkeeping (job, gpu) -> pids.
MAX_CONTEXT_KEYS = 4096
MAX_CONTEXT_PIDS = 4096


@dataclass(slots=True)
class Trainer:
    """One registered Kineto client (a process that imported torch with the daemon on).

    Attributes:
        address: the client's socket address (abstract name or path), the registry key.
        pids: its own pid, then up to 10 ancestors, as it reported them and the kernel
            confirmed them (see `bpfdyno.tracing.ipc.sender`).
        job_id: its ``$SLURM_JOB_ID`` (0 when none).
        first_poll, last_poll: wall-clock epoch seconds.
        last_poll_mono: monotonic seconds, for expiry.
        polls: how many polls it sent.
        last_config_type: the bitmask of its last poll.
        uid: its owner, from the kernel's credentials of its polls (None: unknown).
        host_pid: its pid in the daemon's pid namespace (differs from ``pid`` in a
            container); 0 when unknown.
        job_name, derived_job_id: its Kubernetes training job and the job id derived from
            its name (`bpfdyno.core.k8s_jobs`), which ``job_id`` is while the trainer sends
            none; "" and 0 when it has none (or it is not known yet).
    """

    address: bytes
    pids: tuple[int, ...]
    job_id: int
    first_poll: float
    last_poll: float
    last_poll_mono: float
    polls: int = 0
    last_config_type: int = 0
    uid: int | None = None
    host_pid: int = 0
    registered: int = 0  # the registry's sequence number: later registrations are larger
    quota_user: int | None = None  # whose quota it counts against (None: root's, unknown)
    job_name: str = ""
    derived_job_id: int = 0
    job_looked_up: bool = False  # its environment was (or is being) read for a job name

    @property
    def pid(self) -> int:
        return self.pids[0]

    @property
    def ancestors(self) -> tuple[int, ...]:
        return self.pids[1:]

    @property
    def profiler_busy(self) -> bool:
        """True when its last poll said the activity profiler cannot take a config."""
        return not self.last_config_type & ACTIVITIES_BIT


@dataclass(slots=True)
class RegistryStats:
    registered: int = 0
    expired: int = 0
    evicted: int = 0
    #: Live entries that gave their place to another user's trainer (see `TrainerRegistry`).
    displaced: int = 0
    refused_full: int = 0
    refused_uid_quota: int = 0


class TrainerRegistry:
    """Registered trainers, least recently polled first.

    Args:
        max_entries: most trainers held at once.
        expire_after_s: a trainer silent this long is dropped.
        max_per_uid: most trainers of one user (root and unknown owners excepted).
        principals: who stands behind a uid (subordinate uids count as their user's).
    """

    def __init__(
        self,
        max_entries: int = 4096,
        expire_after_s: float = 60.0,
        max_per_uid: int = 512,
        principals: Principals | None = None,
    ) -> None:
        self.max_entries = max_entries
        self.expire_after_s = expire_after_s
        self.max_per_uid = max_per_uid
        self.stats = RegistryStats()
        self._principals = principals or Principals()
        self._by_address: OrderedDict[bytes, Trainer] = OrderedDict()  # last poll order
        #: Each user's (principal's) entries in the order they registered (the newest last);
        #: root's and those of unknown owners are not counted.
        self._by_user: dict[int, dict[bytes, Trainer]] = {}
        #: The users holding exactly N entries, per N, in the order they came to hold N.
        self._users_holding: dict[int, dict[int, None]] = {}
        self._contexts: dict[tuple[int, int], set[int]] = {}

    def __len__(self) -> int:
        return len(self._by_address)

    def observe(
        self,
        address: bytes,
        req: KinetoRequest,
        now_wall: float,
        now_mono: float,
        uid: int | None = None,
        host_pid: int = 0,
        pids: tuple[int, ...] | None = None,
    ) -> Trainer | None:
        """Record a poll; return its trainer, or None when the registry is full of live ones.

        Args:
            uid, host_pid: the kernel's credentials of the poll (kept from the first poll:
                a different sender at the same address is a new trainer, see `forget`).
            pids: what the kernel confirmed of ``req.pids`` (default: all of them).
        """
        t = self._by_address.get(address)
        if t is None:
            user = self._user(uid)
            if user is not None and self._held(user) >= self.max_per_uid:
                self.stats.refused_uid_quota += 1
                return None
            if len(self._by_address) >= self.max_entries and not (
                self._evict_quiet(now_mono) or self._displace_for(user)
            ):
                self.stats.refused_full += 1
                return None
            t = Trainer(
                address=address,
                pids=req.pids if pids is None else pids,
                job_id=req.job_id,
                first_poll=now_wall,
                last_poll=now_wall,
                last_poll_mono=now_mono,
                uid=uid,
                host_pid=host_pid,
                registered=self.stats.registered + 1,
                quota_user=user,
            )
            self._by_address[address] = t
            if user is not None:
                self._count(user, address, t)
            self.stats.registered += 1
        else:
            self._by_address.move_to_end(address)
            t.pids = req.pids if pids is None else pids
            t.job_id = req.job_id or t.derived_job_id
        t.last_poll = now_wall
        t.last_poll_mono = now_mono
        t.polls += 1
        t.last_config_type = req.config_type
        return t

    def _evict_quiet(self, now_mono: float) -> bool:
        oldest = next(iter(self._by_address.values()), None)
        if oldest is None or now_mono - oldest.last_poll_mono < EVICTABLE_AFTER_S:
            return False
        self._remove(oldest.address)
        self.stats.evicted += 1
        return True

    def _user(self, uid: int | None) -> int | None:
        """The user a trainer of ``uid`` counts against (None: not counted — root, unknown)."""
        if uid is None or uid == ROOT_UID:
            return None
        return self._principals.of(uid)

    def _displace_for(self, user: int | None) -> bool:
        """Make room for a trainer of ``user`` in a registry full of live entries: the most
        recently registered trainer of the user holding the most gives way, if that user
        holds more than ``user``. Root's trainers and those of unknown owners stay."""
        if user is None or not self._users_holding:
            return False
        most = max(self._users_holding)
        if most <= self._held(user):
            return False
        # Of the users holding the most, the one that came to hold that many last (the one
        # coming back for more), and of its trainers the newest: no search through them all.
        biggest = next(reversed(self._users_holding[most]))
        victim = next(reversed(self._by_user[biggest].values()))
        self._remove(victim.address)
        self.stats.displaced += 1
        return True

    def _remove(self, address: bytes) -> Trainer | None:
        t = self._by_address.pop(address, None)
        if t is not None and t.quota_user is not None:
            self._count(t.quota_user, address, None)
        return t

    def _held(self, user: int) -> int:
        entries = self._by_user.get(user)
        return len(entries) if entries else 0

    def _count(self, user: int, address: bytes, t: Trainer | None) -> None:
        """``user``'s entry at ``address`` is ``t`` now (registered), or gone (None)."""
        entries = self._by_user.setdefault(user, {})
        held = len(entries)
        if held:
            users = self._users_holding[held]
            del users[user]
            if not users:
                del self._users_holding[held]
        if t is not None:
            entries[address] = t
        else:
            del entries[address]
        if entries:
            self._users_holding.setdefault(len(entries), {})[user] = None
        else:
            del self._by_user[user]

    def expire(self, now_mono: float) -> list[Trainer]:
        """Drop and return the trainers silent for longer than ``expire_after_s``."""
        gone: list[Trainer] = []
        while self._by_address:
            oldest = next(iter(self._by_address.values()))
            if now_mono - oldest.last_poll_mono <= self.expire_after_s:
                break
            self._remove(oldest.address)
            gone.append(oldest)
        self.stats.expired += len(gone)
        return gone

    def get(self, address: bytes) -> Trainer | None:
        return self._by_address.get(address)

    def forget(self, address: bytes) -> Trainer | None:
        """Drop the trainer at ``address`` (another process now polls from it)."""
        return self._remove(address)

    def trainers(self) -> list[Trainer]:
        """Every registered trainer, sorted by job id then pid."""
        return sorted(self._by_address.values(), key=lambda t: (t.job_id, t.pid, t.address))

    def register_context(self, ctxt: KinetoContext) -> int:
        """Legacy ``ctxt``: remember the pid per (job, gpu); return how many are registered."""
        key = (ctxt.job_id, ctxt.gpu)
        pids = self._contexts.get(key)
        if pids is None:
            if len(self._contexts) >= MAX_CONTEXT_KEYS:
                self._contexts.pop(next(iter(self._contexts)))
            pids = self._contexts[key] = set()
        if len(pids) < MAX_CONTEXT_PIDS:
            pids.add(ctxt.pid)
        return len(pids)
