"""The trainers that poll the daemon: who they are and when they last polled.

Liveness only: what a trainer was handed and how its trace is going is the trace tracker's
(`bpfdyno.tracing.traces`), the one owner of trace state.

A trainer is identified by the address its Kineto client bound (one per process lifetime),
not by its pid: pids repeat across containers (pid namespaces) and after a process exits.
The registry is bounded: entries expire after a configurable silence, and when it is full a
newcomer may only evict an entry that has itself gone quiet, so a flood of fake senders
cannot push out the trainers that are really polling. One uid (root excepted) holds at most
``max_per_uid`` entries, so no user can fill it with sockets of its own and keep other
users' trainers out.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

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
    refused_full: int = 0
    refused_uid_quota: int = 0


class TrainerRegistry:
    """Registered trainers, least recently polled first.

    Args:
        max_entries: most trainers held at once.
        expire_after_s: a trainer silent this long is dropped.
        max_per_uid: most trainers of one uid (root and unknown owners excepted).
    """

    def __init__(
        self, max_entries: int = 4096, expire_after_s: float = 60.0, max_per_uid: int = 512
    ) -> None:
        self.max_entries = max_entries
        self.expire_after_s = expire_after_s
        self.max_per_uid = max_per_uid
        self.stats = RegistryStats()
        self._by_address: OrderedDict[bytes, Trainer] = OrderedDict()
        self._per_uid: Counter[int] = Counter()
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
            if uid and self._per_uid[uid] >= self.max_per_uid:
                self.stats.refused_uid_quota += 1
                return None
            if len(self._by_address) >= self.max_entries and not self._evict_quiet(now_mono):
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
            )
            self._by_address[address] = t
            if uid:
                self._per_uid[uid] += 1
            self.stats.registered += 1
        else:
            self._by_address.move_to_end(address)
            t.pids = req.pids if pids is None else pids
            t.job_id = req.job_id
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

    def _remove(self, address: bytes) -> Trainer | None:
        t = self._by_address.pop(address, None)
        if t is not None and t.uid:
            self._per_uid[t.uid] -= 1
            if not self._per_uid[t.uid]:
                del self._per_uid[t.uid]
        return t

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
