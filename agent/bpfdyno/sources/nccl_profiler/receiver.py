"""The agent's receiver of the NCCL profiler plugin's files: per-rank NCCL aggregates.

Each trainer process that loads the plugin publishes ``<shm_dir>/bpfdyno-nccl.<pid>``
(layout.py). `NcclProfilerReceiver.poll` finds those files (in the agent's own shm_dir, and
in the mount namespace of trainer pids it is given, for containers), checks each belongs to the
live process it names, and reads it with pread — never mmap, so a trainer that truncates its
file cannot fault the agent. `snapshot()` then gives, per trainer pid, the cumulative counters
and the recent collectives (sequence number and CPU arrival time) that a job-wide comparison
needs; consumers take deltas between snapshots for per-interval values.

Full mode: `request_detail` asks the plugins for per kernel-channel and per proxy-step records
until a deadline; `drain_records` hands over everything read since the last drain.
"""

from __future__ import annotations

import logging
import os
import stat
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.core.identity import FileIdentityError, files_as, primary_gid
from bpfdyno.core.rootfs import open_in_root
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.sources.nccl_profiler.layout import (
    COMM_BYTES,
    COMM_SLOTS,
    COMMS_OFFSET,
    DETAIL_UNTIL_OFFSET,
    FILE_BYTES,
    FILE_PREFIX,
    FUNC_NAMES,
    RECORD_BYTES,
    RING_OFFSET,
    RING_RECORDS,
    CommSlot,
    Header,
    LayoutError,
    Record,
    RecordKind,
    decode_comm,
    decode_header,
    decode_record,
)

log = logging.getLogger(__name__)

DEFAULT_SHM_DIR = Path("/dev/shm")
#: A comm slot's generation (offset 0) and state (offset 28): see bpfdyno_nccl.h.
_GEN = struct.Struct("<Q")
_STATE = struct.Struct("<28xI")
#: Recent collectives kept per rank (arrival material for the job-wide comparison).
RECENT_COLLECTIVES = 256
#: Detail records kept between drains, per process; older ones are counted as lost.
DETAIL_BACKLOG = 65536


@dataclass(frozen=True, slots=True)
class NcclCollective:
    """One completed collective of a rank.

    Attributes:
        comm_id: NCCL's communicator id (the same on every rank of the communicator).
        seq: the collective's sequence number in its communicator.
        func: NCCL's name of the operation (``AllReduce``, ...).
        bytes: payload size (count x element size).
        start_realtime_ns: when the rank's CPU reached it (CLOCK_REALTIME, ns): its arrival.
        duration_ns: CPU arrival -> its last kernel channel / proxy operation done.
        gpu_ns: first kernel channel start -> last channel stop on the GPU; 0 without them.
        net_wait_ns: time its proxy steps waited on the peer or the network.
        gpu_start_ns, gpu_stop_ns: when its GPU work began and ended (first kernel channel
            start, last stop) on the GPU's globaltimer: the GPU's arrival and completion,
            comparable between the ranks as far as their GPUs' timers agree; 0 without
            kernel channel events.
    """

    comm_id: int
    seq: int
    func: str
    bytes: int
    start_realtime_ns: int
    duration_ns: int
    gpu_ns: int
    net_wait_ns: int
    gpu_start_ns: int
    gpu_stop_ns: int


@dataclass(frozen=True, slots=True)
class NcclCommAggregate:
    """One communicator of a rank, cumulative since the communicator was created (ns)."""

    comm_id: int
    name: str
    rank: int
    nranks: int
    nnodes: int
    finalized: bool
    colls_started: int
    colls_completed: int
    last_seq_started: int
    last_seq_completed: int
    time_in_collectives_ns: int
    gpu_time_ns: int
    net_wait_ns: int
    bytes: int
    p2p_completed: int
    last_start_realtime_ns: int
    last_done_realtime_ns: int


@dataclass(frozen=True, slots=True)
class NcclRankAggregate:
    """A trainer process's NCCL activity, as its plugin reported it (cumulative, ns).

    The rank and counters are those of its largest communicator (the job's world group in a
    data-parallel job); `comms` has every communicator. Per-interval values are the difference
    of two snapshots. A rank that started a collective it has not completed has
    `in_flight` > 0 since `last_start_realtime_ns`: the material of a hang verdict.

    Attributes:
        pid: the trainer's pid as the agent sees it.
        rank: rank in its largest communicator.
        nranks: that communicator's size.
        colls_started: collectives started (largest communicator).
        colls_completed: collectives completed (largest communicator).
        last_seq: sequence number of the last completed collective (largest communicator).
        in_flight: collectives started and not completed (largest communicator).
        time_in_collectives_ns: summed CPU arrival -> completion of all communicators.
        gpu_time_ns: summed GPU kernel time of all communicators.
        net_wait_ns: summed proxy waits on peers / the network of all communicators.
        bytes: summed payload of all communicators.
        last_start_realtime_ns: latest collective arrival (CLOCK_REALTIME), any communicator.
        recent: the latest completed collectives (at most RECENT_COLLECTIVES), oldest first.
        comms: every communicator's aggregates.
        records_lost: ring records overwritten before the agent read them.
        colls_dropped: collectives the plugin did not profile (256 in flight already).
        api_version: the NCCL profiler API version NCCL loaded the plugin by (4 or 5).
        updated_monotonic_s: when the agent read this (time.monotonic()).
    """

    pid: int
    rank: int
    nranks: int
    colls_started: int
    colls_completed: int
    last_seq: int
    in_flight: int
    time_in_collectives_ns: int
    gpu_time_ns: int
    net_wait_ns: int
    bytes: int
    last_start_realtime_ns: int
    recent: tuple[NcclCollective, ...]
    comms: tuple[NcclCommAggregate, ...]
    records_lost: int
    colls_dropped: int
    api_version: int
    updated_monotonic_s: float


@dataclass(frozen=True, slots=True)
class NcclRankInterval:
    """What a rank did between two snapshots (see `interval`); times in ns.

    Attributes:
        pid, rank: who.
        seconds: the time between the two reads.
        collectives: collectives completed in it (largest communicator).
        last_seq: the last completed sequence number at its end.
        in_flight: collectives in flight at its end.
        time_in_collectives_ns, gpu_time_ns, net_wait_ns, bytes: their growth, all
            communicators (an update of a collective completed before counts here too).
    """

    pid: int
    rank: int
    seconds: float
    collectives: int
    last_seq: int
    in_flight: int
    time_in_collectives_ns: int
    gpu_time_ns: int
    net_wait_ns: int
    bytes: int


def interval(before: NcclRankAggregate, after: NcclRankAggregate) -> NcclRankInterval:
    """The per-interval values of one rank from two of its snapshots (before first)."""
    return NcclRankInterval(
        pid=after.pid,
        rank=after.rank,
        seconds=after.updated_monotonic_s - before.updated_monotonic_s,
        collectives=after.colls_completed - before.colls_completed,
        last_seq=after.last_seq,
        in_flight=after.in_flight,
        time_in_collectives_ns=after.time_in_collectives_ns - before.time_in_collectives_ns,
        gpu_time_ns=after.gpu_time_ns - before.gpu_time_ns,
        net_wait_ns=after.net_wait_ns - before.net_wait_ns,
        bytes=after.bytes - before.bytes,
    )


def intervals(
    before: dict[int, NcclRankAggregate], after: dict[int, NcclRankAggregate]
) -> dict[int, NcclRankInterval]:
    """`interval` for every pid in both snapshots whose plugin file stayed the same (a rank
    that restarted under the same pid starts from zero again: left out)."""
    return {
        pid: interval(before[pid], now)
        for pid, now in after.items()
        if pid in before and now.colls_started >= before[pid].colls_started
    }


@dataclass(slots=True)
class _Source:
    """What the receiver keeps per plugin file."""

    pid: int
    path: Path
    cursor: int = -1  # next ring index to read; -1: start at the current head
    lost: int = 0
    comms: dict[int, CommSlot] = field(default_factory=dict)
    header: Header | None = None
    recent: deque[NcclCollective] = field(default_factory=lambda: deque(maxlen=RECENT_COLLECTIVES))
    detail: deque[Record] = field(default_factory=lambda: deque(maxlen=DETAIL_BACKLOG))
    updated_s: float = 0.0
    #: The header and slots as last read, when every slot was consistent: the same bytes
    #: again mean nothing changed (no new record either: the ring's head is in the header).
    raw: bytes = b""


class NcclProfilerReceiver:
    """Reads the plugin files of this node's trainers; see the module's description."""

    def __init__(self, shm_dir: Path = DEFAULT_SHM_DIR, proc_root: Path = Path("/proc")) -> None:
        self.shm_dir = shm_dir
        self.proc_root = proc_root
        self._sources: dict[int, _Source] = {}
        # poll() runs on the collector's thread; snapshot() and the others on any.
        self._lock = threading.Lock()
        #: path -> why the last poll refused it (shown by status()).
        self.rejected: dict[str, str] = {}
        self.polls = 0
        self._detail_from_ns = 0
        self._detail_until_ns = -1
        #: Candidates inside a process's root: display path -> (its root, the path inside).
        self._in_root: dict[Path, tuple[str, str]] = {}
        self._nspids: dict[int, int] = {}

    # -- discovery --------------------------------------------------------------------------

    def _candidates(self, pids: Iterable[int]) -> dict[int, Path]:
        """host pid -> its plugin file's path, from shm_dir and the given pids' own mounts."""
        found: dict[int, Path] = {}
        self._in_root = {}
        try:
            names = os.listdir(self.shm_dir)
        except OSError:
            names = []
        for name in names:
            if name.startswith(FILE_PREFIX) and name[len(FILE_PREFIX) :].isdigit():
                found[int(name[len(FILE_PREFIX) :])] = self.shm_dir / name
        pids = list(pids)
        # A pid's number in its own namespace does not change while it lives: kept while the
        # pid is among those given.
        self._nspids = {p: n for p, n in self._nspids.items() if p in pids}
        for pid in pids:
            if pid in found:
                continue
            nspid = self._nspids.get(pid) or self._nspid(pid)
            if nspid is None:
                continue
            self._nspids[pid] = nspid
            # A trainer in a container: its own /dev/shm, every link in the path resolved inside
            # its root (an absolute link there must not lead to the agent's files).
            root = self.proc_root / str(pid) / "root"
            inner = f"{self.shm_dir}/{FILE_PREFIX}{nspid}"
            path = root / inner.lstrip("/")
            found[pid] = path
            self._in_root[path] = (str(root), inner)
        return found

    def _nspid(self, pid: int) -> int | None:
        """The pid as the process's own pid namespace numbers it (NSpid's last field)."""
        try:
            text = (self.proc_root / str(pid) / "status").read_text(encoding="utf-8")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
        return pid

    def _start_ticks(self, pid: int) -> int | None:
        try:
            fd = os.open(f"{self.proc_root}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            text = os.read(fd, 4096)
        finally:
            os.close(fd)
        # Field 22; the command name (field 2) may hold spaces, so count after the last ')'.
        return int(text.rsplit(b")", 1)[1].split()[19])

    # -- reading ----------------------------------------------------------------------------

    def poll(self, pids: Iterable[int] = ()) -> None:
        """Reads every plugin file found; pids: trainer pids to look for inside containers."""
        with self._lock:
            self._poll(pids)

    def _poll(self, pids: Iterable[int]) -> None:
        self.polls += 1
        candidates = self._candidates(pids)
        for gone in set(self._sources) - set(candidates):
            del self._sources[gone]
        self.rejected = {}
        for pid, path in candidates.items():
            try:
                self._read(pid, path)
            except (OSError, LayoutError, ValueError) as e:
                self._sources.pop(pid, None)
                if not isinstance(e, FileNotFoundError):
                    self.rejected[str(path)] = str(e)

    def _open_checked(self, pid: int, path: Path, flags: int) -> tuple[int, Header, bytes]:
        """Opens path and checks it is the live pid's own plugin file; fd, header, slots."""
        # Looked at before it is opened: opening a device or a FIFO a trainer put there could
        # act on it, so only a regular file is opened — the very inode looked at.
        at = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
        in_root = self._in_root.get(path)
        path_fd = open_in_root(*in_root, at) if in_root else os.open(path, at)
        try:
            st = os.fstat(path_fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != FILE_BYTES:
                raise LayoutError(f"not a regular file of {FILE_BYTES} bytes")
            fd = os.open(f"/proc/self/fd/{path_fd}", flags | os.O_NONBLOCK | os.O_CLOEXEC)
        finally:
            os.close(path_fd)
        try:
            owner = os.stat(self.proc_root / str(pid)).st_uid
            if st.st_uid != owner:
                raise LayoutError(f"owned by uid {st.st_uid}, but process {pid} runs as {owner}")
            data = os.pread(fd, COMMS_OFFSET + COMM_SLOTS * COMM_BYTES, 0)
            header = decode_header(data)
            if header.start_ticks != self._start_ticks(pid):
                raise LayoutError(f"left by an earlier process {pid} (start time differs)")
            return fd, header, data
        except BaseException:
            os.close(fd)
            raise

    def _read(self, pid: int, path: Path) -> None:
        fd, header, data = self._open_checked(pid, path, os.O_RDONLY)
        try:
            source = self._sources.get(pid)
            if source is None or source.path != path:
                source = self._sources[pid] = _Source(pid, path)
            source.updated_s = time.monotonic()
            if data == source.raw:
                return
            source.header = header
            source.comms, consistent = self._read_comms(fd, data)
            source.raw = data if consistent else b""
            self._read_ring(fd, source, header)
        finally:
            os.close(fd)

    def _read_comms(self, fd: int, first: bytes) -> tuple[dict[int, CommSlot], bool]:
        """The comm slots in use, each consistent: its generation even and unchanged across a
        re-read; and whether all were so in first.

        The generation is the slot's first field, so one read copies it before the slot's
        counters, and the next read copies it after them: equal and even means no writer was
        inside in between.
        """
        comms: dict[int, CommSlot] = {}
        pending = set(range(COMM_SLOTS))
        before = first
        for attempt in range(4):
            after = os.pread(fd, COMMS_OFFSET + COMM_SLOTS * COMM_BYTES, 0)
            for i in sorted(pending):
                at = COMMS_OFFSET + i * COMM_BYTES
                gen, state = _GEN.unpack_from(before, at)[0], _STATE.unpack_from(before, at)[0]
                if gen % 2 == 0 and gen == _GEN.unpack_from(after, at)[0]:
                    pending.discard(i)
                    if state != 0:
                        comms[i] = decode_comm(before, at)
            if not pending:
                return comms, attempt == 0
            before = after
        return comms, False

    def _read_ring(self, fd: int, source: _Source, header: Header) -> None:
        head = header.ring_head
        if source.cursor < 0:
            # First sight: the collectives already in the ring are history worth keeping.
            source.cursor = max(0, head - RING_RECORDS)
        if head - source.cursor > RING_RECORDS:
            source.lost += head - source.cursor - RING_RECORDS
            source.cursor = head - RING_RECORDS
        index = source.cursor
        while index < head:
            slot = index % RING_RECORDS
            count = min(head - index, RING_RECORDS - slot)
            raw = os.pread(fd, count * RECORD_BYTES, RING_OFFSET + slot * RECORD_BYTES)
            for k in range(len(raw) // RECORD_BYTES):
                record = decode_record(raw, k * RECORD_BYTES)
                if record.commit < index + 1:
                    # Claimed but not yet written: read it next poll.
                    source.cursor = index
                    return
                if record.commit == index + 1:
                    self._take(source, header, record)
                else:
                    source.lost += 1  # overwritten by a later lap
                index += 1
            if len(raw) < count * RECORD_BYTES:
                break
        source.cursor = index

    def _take(self, source: _Source, header: Header, record: Record) -> None:
        if record.kind in (RecordKind.COLL, RecordKind.COLL_UPDATE):
            comm = source.comms.get(record.comm_slot)
            collective = NcclCollective(
                comm_id=comm.comm_id if comm else 0,
                seq=record.seq,
                func=_func_name(record.func),
                bytes=record.bytes,
                start_realtime_ns=record.start_ns + header.realtime_offset_ns,
                duration_ns=record.duration_ns,
                gpu_ns=_gpu_ns(record),
                net_wait_ns=record.net_wait_ns,
                gpu_start_ns=record.gpu_start_ns,
                gpu_stop_ns=record.gpu_stop_ns,
            )
            if record.kind == RecordKind.COLL:
                source.recent.append(collective)
            else:  # late parts ended: the collective's new values
                _replace(source.recent, collective)
        # Parts exist only in full mode; collectives (and their updates) are kept for the
        # window asked for.
        in_window = self._detail_from_ns <= record.start_ns <= self._detail_until_ns
        if record.kind in (RecordKind.KERNEL_CH, RecordKind.PROXY_STEP) or in_window:
            source.detail.append(record)

    # -- what it gives ----------------------------------------------------------------------

    def snapshot(self) -> dict[int, NcclRankAggregate]:
        """pid -> that trainer's NCCL aggregates as of the last poll (see NcclRankAggregate)."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> dict[int, NcclRankAggregate]:
        out: dict[int, NcclRankAggregate] = {}
        for pid, source in self._sources.items():
            header = source.header
            if header is None or not source.comms:
                continue
            offset = header.realtime_offset_ns
            comms = tuple(_comm_aggregate(c, offset) for c in source.comms.values())
            main = max(comms, key=lambda c: (not c.finalized, c.nranks))
            out[pid] = NcclRankAggregate(
                pid=pid,
                rank=main.rank,
                nranks=main.nranks,
                colls_started=main.colls_started,
                colls_completed=main.colls_completed,
                last_seq=main.last_seq_completed,
                in_flight=main.colls_started - main.colls_completed,
                time_in_collectives_ns=sum(c.time_in_collectives_ns for c in comms),
                gpu_time_ns=sum(c.gpu_time_ns for c in comms),
                net_wait_ns=sum(c.net_wait_ns for c in comms),
                bytes=sum(c.bytes for c in comms),
                last_start_realtime_ns=max(c.last_start_realtime_ns for c in comms),
                recent=tuple(source.recent),
                comms=comms,
                records_lost=source.lost,
                colls_dropped=header.colls_dropped,
                api_version=header.api_version,
                updated_monotonic_s=source.updated_s,
            )
        return out

    def request_detail(self, seconds: float, pids: Iterable[int] | None = None) -> list[int]:
        """Full mode: asks the plugins (all known, or those pids) for per-part records.

        Returns the pids asked. The deadline is CLOCK_MONOTONIC, which the trainers share.
        """
        wanted = None if pids is None else set(pids)
        now = time.monotonic_ns()
        until = now + int(seconds * 1e9)
        self._detail_from_ns, self._detail_until_ns = now, until
        asked = []
        with self._lock:
            for pid, source in list(self._sources.items()):
                if wanted is not None and pid not in wanted:
                    continue
                try:
                    self._write_detail_until(pid, source.path, until)
                    asked.append(pid)
                except (OSError, LayoutError, ValueError, FileIdentityError) as e:
                    log.warning("full mode not asked of pid %d: %s", pid, e)
        return asked

    def _write_detail_until(self, pid: int, path: Path, until: int) -> None:
        fd, _, _ = self._open_checked(pid, path, os.O_RDONLY)
        try:
            # The file is its owner's (mode 0600): written as its owner, since an agent with
            # only CAP_DAC_READ_SEARCH (the packaged unit) may read it but not write it.
            owner = os.fstat(fd).st_uid
            with files_as(owner, primary_gid(owner)):
                out = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.pwrite(out, until.to_bytes(8, "little"), DETAIL_UNTIL_OFFSET)
            finally:
                os.close(out)
        finally:
            os.close(fd)

    def drain_records(self, pid: int) -> list[Record]:
        """The full-mode records of pid read since the last drain, oldest first."""
        with self._lock:
            return self._drain(pid)

    def _drain(self, pid: int) -> list[Record]:
        source = self._sources.get(pid)
        if source is None:
            return []
        records = list(source.detail)
        source.detail.clear()
        return records

    def realtime_offset_ns(self, pid: int) -> int:
        """CLOCK_REALTIME - CLOCK_MONOTONIC as pid's plugin measured it (0 when unknown)."""
        source = self._sources.get(pid)
        return source.header.realtime_offset_ns if source and source.header else 0

    def in_use(self) -> bool:
        """Whether any trainer on this node publishes through the plugin."""
        return bool(self._sources)

    def status(self) -> PartStatus:
        """What `status` and `doctor` show for the plugin's receiver."""
        if self.rejected:
            path, why = next(iter(self.rejected.items()))
            return PartStatus(
                "nccl_profiler",
                PartState.DEGRADED,
                f"{len(self.rejected)} plugin file(s) refused, e.g. {path}: {why}",
                collections=self.polls,
            )
        if not self._sources:
            return PartStatus(
                "nccl_profiler",
                PartState.OK,
                f"no trainer publishes NCCL profiler data in {self.shm_dir} (start trainers "
                "with NCCL_PROFILER_PLUGIN=<path of libbpfdyno-nccl-profiler.so>; docs/nccl.md)",
                collections=self.polls,
            )
        pids = ", ".join(str(p) for p in sorted(self._sources))
        return PartStatus(
            "nccl_profiler",
            PartState.OK,
            f"in use by {len(self._sources)} trainer process(es): {pids}",
            collections=self.polls,
        )


def _replace(recent: deque[NcclCollective], updated: NcclCollective) -> None:
    """Puts updated in place of the entry of the same collective (if still kept)."""
    for i in range(len(recent) - 1, -1, -1):
        if recent[i].comm_id == updated.comm_id and recent[i].seq == updated.seq:
            recent[i] = updated
            return


def _func_name(func: int) -> str:
    return FUNC_NAMES.get(func, "Other")


def _gpu_ns(record: Record) -> int:
    if record.gpu_start_ns and record.gpu_stop_ns > record.gpu_start_ns:
        return record.gpu_stop_ns - record.gpu_start_ns
    return 0


def _comm_aggregate(c: CommSlot, realtime_offset_ns: int) -> NcclCommAggregate:
    def realtime(ns: int) -> int:
        return ns + realtime_offset_ns if ns else 0

    return NcclCommAggregate(
        comm_id=c.comm_id,
        name=c.name,
        rank=c.rank,
        nranks=c.nranks,
        nnodes=c.nnodes,
        finalized=c.state == 2,
        colls_started=c.colls_started,
        colls_completed=c.colls_completed,
        last_seq_started=c.last_seq_started,
        last_seq_completed=c.last_seq_completed,
        time_in_collectives_ns=c.coll_ns_total,
        gpu_time_ns=c.gpu_ns_total,
        net_wait_ns=c.net_wait_ns_total,
        bytes=c.bytes_total,
        p2p_completed=c.p2p_completed,
        last_start_realtime_ns=realtime(c.last_start_ns),
        last_done_realtime_ns=realtime(c.last_done_ns),
    )


__all__ = [
    "DEFAULT_SHM_DIR",
    "NcclCollective",
    "NcclCommAggregate",
    "NcclProfilerReceiver",
    "NcclRankAggregate",
    "NcclRankInterval",
    "interval",
    "intervals",
]
