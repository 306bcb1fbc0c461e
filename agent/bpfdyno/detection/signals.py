"""Always-on per-rank signals: what each rank of a training job did in the last interval.

The ranks are the registered trainers (`bpfdyno.tracing.trainers`) whose environment names
a ``RANK`` (torchrun, SLURM launchers and mpirun set it; read once per process lifetime);
their job is the trainer's ``$SLURM_JOB_ID``, or without one torchrun's run id or the
rendezvous address (``MASTER_ADDR:MASTER_PORT``), so two jobs on a node are never compared. Per
rank and interval the signal is read from what the kernel already keeps for every task, so
nothing is attached and nothing runs between readings:

* ``/proc/<pid>/task/*/schedstat``: each thread's on-CPU time and run-queue wait (the
  scheduler's own ``sched_info``), summed over the rank's threads;
* the main thread's off-CPU time that was not run-queue wait: time it slept, which for a
  rank of a synchronous job is mostly time waiting for its peers;
* for gloo ranks, the time the rank's threads waited for their peers' data on the job's peer
  connections (`PeerWaitSource`: gloo's callers wait on a condition variable until its loop
  thread has read the peer's bytes, so the wait is timed in gloo itself, by a uprobe pair on
  ``UnboundBuffer::waitRecv``: `bpfdyno.sources.gloo`);
* ``/proc/<pid>/io`` ``rchar + wchar``: bytes moved through read/write calls, sockets
  included: the progress a hang stops;
* the CPU-quota throttling of the rank's cgroups (`CpuQuotaReader`): a throttled thread stays
  runnable, so its time is part of the run-queue wait; this says why the rank waited.

Collective times from NCCL come from another module through `CollectiveSource`, gloo's peer
waits through `PeerWaitSource`; without one those fields are NaN. A NCCL rank's signal carries
the collectives it completed in the interval with when it arrived at each (``arrivals``);
how late it was (``late_s``) is counted over the job's ranks on every node by
`bpfdyno.detection.nccl_times.LateArrivals`, which fills it in. The rank's TCP connections
over the interval come from the net collector's last reading (`bpfdyno.detection.net_signal`:
its links and the network scores the detector makes of the job's links); without it, None.
The interrupt time on the CPUs the rank ran on comes from the interrupt collector's per-CPU
books (`bpfdyno.detection.irq_signal`); without them, NaN.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import accumulate, islice
from operator import sub
from pathlib import Path
from typing import NamedTuple, Protocol

from bpfdyno.core import pidfs
from bpfdyno.detection.irq_signal import (
    CpuInterruptShares,
    InterruptTimes,
    placement,
    rank_share,
    stat_interrupt_ns,
)
from bpfdyno.detection.net_signal import ConnectionSource, LinkSampler, LinkScores
from bpfdyno.rpc.detection import CommArrivals, NetLink, RankSignal
from bpfdyno.tracing.capture.cpu_quota import CpuQuotaReader

NAN = float("nan")
#: Arrivals a rank's signal carries at most (the latest ones): about 5 bytes each on the wire.
MAX_ARRIVALS = 256


class Arrival(NamedTuple):
    """When one rank's CPU reached one collective (unix ns, this agent's clock)."""

    comm_hash: int
    seq: int
    at_ns: int
    comm_ranks: int = 0


@dataclass(frozen=True, slots=True)
class Arrivals:
    """One rank's arrivals at one communicator's collectives: it reached collective
    ``seqs[i]`` at ``at_ns[i]`` (unix ns, this agent's clock). Kept as columns, not one
    object per arrival: the job-wide count and the wire handle them a column at a time."""

    comm_hash: int
    comm_ranks: int
    seqs: tuple[int, ...]
    at_ns: tuple[int, ...]


def grouped(arrivals: Iterable[Arrival]) -> tuple[Arrivals, ...]:
    """Arrivals by communicator, each in the order given."""
    by_comm: dict[int, tuple[int, list[int], list[int]]] = {}
    for a in arrivals:
        g = by_comm.get(a.comm_hash)
        if g is None:
            g = by_comm[a.comm_hash] = (a.comm_ranks, [], [])
        g[1].append(a.seq)
        g[2].append(a.at_ns)
    return tuple(Arrivals(c, n, tuple(seqs), tuple(at)) for c, (n, seqs, at) in by_comm.items())


def latest(groups: tuple[Arrivals, ...], limit: int = MAX_ARRIVALS) -> tuple[Arrivals, ...]:
    """The latest ``limit`` arrivals of ``groups`` (by arrival time; ``groups`` itself when
    it holds no more)."""
    if sum(len(g.seqs) for g in groups) <= limit:
        return groups
    keep = sorted((t, gi, i) for gi, g in enumerate(groups) for i, t in enumerate(g.at_ns))
    kept: list[list[int]] = [[] for _ in groups]
    for _, gi, i in keep[-limit:] if limit > 0 else ():
        kept[gi].append(i)
    return tuple(
        Arrivals(
            g.comm_hash,
            g.comm_ranks,
            tuple(g.seqs[i] for i in sorted(idx)),
            tuple(g.at_ns[i] for i in sorted(idx)),
        )
        for g, idx in zip(groups, kept, strict=True)
        if idx
    )


@dataclass(frozen=True, slots=True)
class RankProcess:
    """A process to watch as a rank: a registered trainer's pid and job."""

    pid: int
    job_id: str


@dataclass(frozen=True, slots=True)
class CollectiveTimes:
    """Collective times of one rank (from NCCL's profiler, say)."""

    in_collective_ns: int  # cumulative time between entering and leaving collectives
    arrivals: tuple[Arrival, ...] = ()  # its latest completed ones, oldest first


class CollectiveSource(Protocol):
    """Where cumulative collective times of a pid come from (None: not known for it)."""

    def collective_times(self, pid: int) -> CollectiveTimes | None: ...


class PeerWaitSource(Protocol):
    """Where a pid's cumulative time waiting for its peers' data comes from (gloo's, say)."""

    #: Why it gives nothing ("" while it works).
    error: str

    def wait_ns(self, pid: int) -> int | None:
        """The pid's total so far (None: not known for it)."""
        ...

    def forget(self, live: set[int]) -> None:
        """Stop following the pids not in ``live``."""
        ...

    def close(self) -> None:
        """Release what it holds."""
        ...


@dataclass(frozen=True, slots=True)
class RankSignals:
    """What one rank did in one interval (times in seconds of the interval).

    Attributes:
        oncpu_s, runq_wait_s: summed over the rank's threads (thread-seconds).
        main_waiting_s: the main thread's off-CPU time that was not run-queue wait.
        throttled_s: time its cgroup (or an ancestor with a quota) was throttled.
        io_bytes: bytes its read/write calls moved (sockets included).
        in_collective_s: from a `CollectiveSource` (NaN without one).
        late_s: how late it arrived at the collectives counted in the interval, over the
            job's ranks on every node (`nccl_times.LateArrivals`; NaN until then, and
            without arrivals).
        arrivals: the collectives it completed in the interval and the one before (the
            latest `MAX_ARRIVALS`), by communicator, on this agent's clock (None: not known,
            no `CollectiveSource` for it).
        peer_wait_s: thread-seconds its threads waited for their peers' data on the job's
            peer connections, from a `PeerWaitSource` (gloo; NaN without one).
        host: "" for this node's ranks, the peer's host for a rank pulled from a peer.
        net_links: its TCP connections over the net collector's last interval (None: not
            known, the collector is off or not running).
        net: its network scores among its job's ranks (`net_signal.link_scores`), filled in
            by the detector; NaN until then.
        interrupt_s: seconds of the interval the CPUs it ran on spent in hard and soft
            interrupts, weighted by where its threads ran (`irq_signal`; NaN: not known).
        interrupt_cpu: the CPU its threads ran on most in the interval (-1: not known).
    """

    job_id: str
    rank: int
    pid: int
    end_mono: float
    interval_s: float
    oncpu_s: float
    runq_wait_s: float
    main_waiting_s: float
    throttled_s: float
    io_bytes: int
    in_collective_s: float = NAN
    late_s: float = NAN
    host: str = ""  # "" on this node; a peer agent's host for signals pulled from it
    peer_wait_s: float = NAN
    net_links: tuple[NetLink, ...] | None = None
    net: LinkScores = field(default_factory=LinkScores)
    arrivals: tuple[Arrivals, ...] | None = None
    interrupt_s: float = NAN
    interrupt_cpu: int = -1

    @property
    def cpu_wait_share(self) -> float:
        """Thread-seconds per second the rank wanted a CPU and did not get one: the score of a
        rank its machine holds back. A thread its CPU quota throttles stays runnable, so
        that time is already run-queue wait (``throttled_s`` says how much of it was)."""
        return self.runq_wait_s / self.interval_s

    @property
    def main_busy_share(self) -> float:
        """The share of the interval the main thread was on a CPU or waiting for one: the
        score of a rank that computes while its peers wait for it (more work per step, CPU
        time taken from it). In a synchronous job every rank's step is as long as the
        slowest's, so the ranks it holds back sleep that difference in their collectives
        and their share drops while its own does not."""
        return 1.0 - self.main_waiting_s / self.interval_s

    @property
    def peer_wait_share(self) -> float:
        """Thread-seconds per second its threads waited for their peers' data in gloo's
        collectives (NaN without gloo's probes): the score of a rank whose peers wait for
        it, whatever held it back. In a synchronous job the ranks that arrive first at a
        collective wait there for the last one, which hardly waits at all: the straggler is
        the rank that waits *least* (`Score.below`)."""
        return self.peer_wait_s / self.interval_s

    @property
    def interrupt_share(self) -> float:
        """The share of its CPUs' time taken by interrupts, where it ran (NaN: not known):
        the score of a rank whose CPU an interrupt storm holds."""
        return self.interrupt_s / self.interval_s


@dataclass(frozen=True, slots=True)
class _Reading:
    """Cumulative counters of one process at one moment."""

    mono: float
    oncpu_ns: int
    runq_ns: int
    main_oncpu_ns: int
    main_runq_ns: int
    throttled_ns: int
    io_bytes: int
    collective: CollectiveTimes | None
    peer_wait_ns: int | None = None
    #: tid -> its cumulative on-CPU ns (only with an interrupt source: where the rank ran).
    threads: dict[str, int] | None = None


def read_small(path: str) -> bytes | None:
    """A small /proc file's bytes (None when it is gone): os.open/os.read, a third of the
    cost of open() for the hundreds of files a round reads."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_schedstat(path: str) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) of one task, None when it is gone."""
    data = read_small(path)
    if data is None:
        return None
    fields = data.split()
    try:
        return int(fields[0]), int(fields[1])
    except (ValueError, IndexError):
        return None


def read_io_bytes(proc_root: Path, pid: int) -> int | None:
    """``rchar + wchar`` of a process, None when it is gone or unreadable."""
    data = read_small(f"{os.fspath(proc_root)}/{pid}/io")
    if data is None:
        return None
    total = 0
    for line in data.splitlines():
        name, _, value = line.partition(b":")
        if name in (b"rchar", b"wchar"):
            total += int(value)
    return total


class SignalSampler:
    """Reads the ranks' counters each interval and returns what each did since the last.

    A process is read the first time to have a base: it has a signal from its second
    interval on. A pid whose start time changed is a new process (pids are reused).

    Args:
        proc_root: ``/proc`` (a fixture tree in tests).
        collectives: collective times per pid, when a module provides them.
        peer_waits: gloo's peer waits per pid, when a module provides them.
        connections: the net collector's last reading of the ranks' TCP connections.
        interrupts: the interrupt collector's per-CPU books, for the interrupt share (the
            kernel's ``<proc_root>/stat`` where they are not known).
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        collectives: CollectiveSource | None = None,
        peer_waits: PeerWaitSource | None = None,
        connections: ConnectionSource | None = None,
        interrupts: InterruptTimes | None = None,
    ) -> None:
        self._proc = proc_root
        self._collectives = collectives
        self._peer_waits = peer_waits
        self.links = LinkSampler(connections) if connections is not None else None
        self.interrupts = (
            CpuInterruptShares(interrupts, ticks=partial(stat_interrupt_ns, proc_root))
            if interrupts is not None
            else None
        )
        self._quota = CpuQuotaReader(proc_root)
        self._last: dict[int, tuple[int, _Reading]] = {}  # pid -> (start ticks, reading)
        #: pid -> the arrivals new in its last interval (sent again with the next one's).
        self._sent_arrivals: dict[int, tuple[Arrival, ...]] = {}
        #: (pid, start) -> (RANK, the job's key from the environment), or None: not a rank.
        self._ranks: dict[tuple[int, int], tuple[int, str] | None] = {}

    def sample(self, processes: Iterable[RankProcess], now_mono: float) -> list[RankSignals]:
        """The signals of every rank among ``processes`` over the interval that ends now."""
        out: list[RankSignals] = []
        seen: dict[int, tuple[int, _Reading]] = {}
        processes = list(processes)
        # Read once per round, and only while there are ranks to weigh it (nothing at rest).
        cpu_shares = self.interrupts.sample() if self.interrupts and processes else None
        for p in processes:
            stat = pidfs.read_stat(self._proc, p.pid)
            if stat is None:
                continue
            key = (p.pid, stat.start_ticks)
            if key not in self._ranks:
                self._ranks[key] = _rank_of(self._proc, p.pid)
            identity = self._ranks[key]
            if identity is None:
                continue  # a launcher, a DataLoader worker, a single-process trainer
            rank, env_job = identity
            if p.job_id in ("", "0") and env_job:
                p = RankProcess(p.pid, env_job)
            reading = self._read(p.pid, now_mono)
            if reading is None:
                continue
            seen[p.pid] = (stat.start_ticks, reading)
            last = self._last.get(p.pid)
            if last is not None and last[0] == stat.start_ticks and reading.mono > last[1].mono:
                signals = _signals(p, rank, last[1], reading)
                if cpu_shares is not None:
                    signals = self._with_interrupts(signals, last[1], reading, cpu_shares)
                out.append(self._with_arrivals(signals, last[1], reading))
        self._last = seen
        self._sent_arrivals = {p: a for p, a in self._sent_arrivals.items() if p in seen}
        self._ranks = {k: v for k, v in self._ranks.items() if k[0] in seen}
        if self._peer_waits is not None:
            self._peer_waits.forget(set(seen))
        if self.links is not None:
            links = self.links.sample(set(seen))
            if links is not None:
                out = [replace(s, net_links=links.get(s.pid, ())) for s in out]
        return out

    def _with_arrivals(self, s: RankSignals, a: _Reading, b: _Reading) -> RankSignals:
        """``s`` with the arrivals new in its interval, after the previous interval's (the
        latest `MAX_ARRIVALS` of both): a peer pulls once per interval plus the pull's own
        time, so now and then one of this node's rounds falls between two of its pulls; sent
        twice, its arrivals still reach the peer (which counts each collective once)."""
        if a.collective is None or b.collective is None:
            self._sent_arrivals.pop(s.pid, None)
            return s
        new = new_arrivals(a.collective.arrivals, b.collective.arrivals)
        before = self._sent_arrivals.get(s.pid, ())
        self._sent_arrivals[s.pid] = new
        return replace(s, arrivals=grouped((before + new)[-MAX_ARRIVALS:]))

    def _with_interrupts(
        self, s: RankSignals, a: _Reading, b: _Reading, cpu_shares: dict[int, float]
    ) -> RankSignals:
        """``s`` with the interrupt time of the CPUs its threads ran on in its interval."""
        if a.threads is None or b.threads is None:
            return s
        task_dir = f"{os.fspath(self._proc)}/{s.pid}/task"
        # Threads' affinity is the live system's: only with the live /proc.
        affinity = os.sched_getaffinity if self._proc == Path("/proc") else None
        weights = placement(task_dir, str(s.pid), a.threads, b.threads, affinity)
        share, cpu = rank_share(weights, cpu_shares)
        return replace(s, interrupt_s=share * s.interval_s, interrupt_cpu=cpu)

    def _read(self, pid: int, now_mono: float) -> _Reading | None:
        task_dir = f"{os.fspath(self._proc)}/{pid}/task"
        try:
            tids = os.listdir(task_dir)
        except OSError:
            return None
        oncpu = runq = 0
        main: tuple[int, int] | None = None
        threads: dict[str, int] | None = {} if self.interrupts is not None else None
        for tid in tids:
            times = read_schedstat(f"{task_dir}/{tid}/schedstat")
            if times is None:
                continue  # the thread exited between the listing and the read
            oncpu += times[0]
            runq += times[1]
            if threads is not None:
                threads[tid] = times[0]
            if tid == str(pid):
                main = times
        io = read_io_bytes(self._proc, pid)
        if main is None or io is None:
            return None
        throttled = sum(s.throttled_ns for s in self._quota.sample(pid))
        collective = self._collectives.collective_times(pid) if self._collectives else None
        peer_wait = self._peer_waits.wait_ns(pid) if self._peer_waits else None
        return _Reading(
            now_mono, oncpu, runq, main[0], main[1], throttled, io, collective, peer_wait, threads
        )


#: What names a job when the scheduler gave none (no ``$SLURM_JOB_ID``): torchrun's run id,
#: else the rendezvous address all ranks share.
_JOB_VARS = ("RANK", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")


def _rank_of(proc_root: Path, pid: int) -> tuple[int, str] | None:
    """(its RANK, a job key from its environment or "") of a process; None: no rank."""
    env = pidfs.read_environ(proc_root, pid, _JOB_VARS)
    rank = env.get("RANK", "")
    if not rank.isdigit():
        return None
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":
        return int(rank), run_id
    if env.get("MASTER_ADDR"):
        return int(rank), f"{env['MASTER_ADDR']}:{env.get('MASTER_PORT', '')}"
    return int(rank), ""


def _signals(p: RankProcess, rank: int, a: _Reading, b: _Reading) -> RankSignals:
    interval = b.mono - a.mono
    main_busy_ns = (b.main_oncpu_ns - a.main_oncpu_ns) + (b.main_runq_ns - a.main_runq_ns)
    in_coll = peer_wait = NAN
    if a.collective is not None and b.collective is not None:
        in_coll = (b.collective.in_collective_ns - a.collective.in_collective_ns) / 1e9
    if a.peer_wait_ns is not None and b.peer_wait_ns is not None:
        peer_wait = max(0, b.peer_wait_ns - a.peer_wait_ns) / 1e9
    return RankSignals(
        job_id=p.job_id,
        rank=rank,
        pid=p.pid,
        end_mono=b.mono,
        interval_s=interval,
        oncpu_s=(b.oncpu_ns - a.oncpu_ns) / 1e9,
        runq_wait_s=(b.runq_ns - a.runq_ns) / 1e9,
        # Clock and accounting differ by microseconds: never below zero.
        main_waiting_s=max(0.0, interval - main_busy_ns / 1e9),
        throttled_s=max(0, b.throttled_ns - a.throttled_ns) / 1e9,
        io_bytes=max(0, b.io_bytes - a.io_bytes),
        in_collective_s=in_coll,
        peer_wait_s=peer_wait,
    )


def new_arrivals(before: tuple[Arrival, ...], after: tuple[Arrival, ...]) -> tuple[Arrival, ...]:
    """The arrivals in ``after`` not in ``before`` (the collectives completed in between),
    the latest `MAX_ARRIVALS` of them."""
    seen = {(c.comm_hash, c.seq) for c in before}
    return tuple([c for c in after if (c.comm_hash, c.seq) not in seen][-MAX_ARRIVALS:])


def to_record(s: RankSignals, host: str, end_unix: float) -> RankSignal:
    """A rank's signals in the API's words, for the job's other agents."""
    return RankSignal(
        job_id=s.job_id,
        rank=s.rank,
        pid=s.pid,
        host=s.host or host,
        end_unix_seconds=end_unix,
        interval_seconds=s.interval_s,
        oncpu_seconds=s.oncpu_s,
        runq_wait_seconds=s.runq_wait_s,
        main_waiting_seconds=s.main_waiting_s,
        throttled_seconds=s.throttled_s,
        io_bytes=s.io_bytes,
        in_collective_seconds=None if math.isnan(s.in_collective_s) else s.in_collective_s,
        late_seconds=None if math.isnan(s.late_s) else s.late_s,
        peer_wait_seconds=None if math.isnan(s.peer_wait_s) else s.peer_wait_s,
        net_links=s.net_links or (),
        net_links_known=s.net_links is not None,
        arrivals=tuple(map(_packed, s.arrivals or ())),
        arrivals_known=s.arrivals is not None,
        interrupt_seconds=None if math.isnan(s.interrupt_s) else s.interrupt_s,
        interrupt_cpu=None if s.interrupt_cpu < 0 else s.interrupt_cpu,
    )


def from_record(r: RankSignal, clock_offset_ns: int = 0) -> RankSignals:
    """A peer's rank, as the detector compares it (``host`` says it is not this node's).

    ``clock_offset_ns`` is the peer's wall clock minus ours: its arrivals are moved onto our
    clock by taking it off.
    """
    return RankSignals(
        job_id=r.job_id,
        rank=r.rank,
        pid=r.pid,
        end_mono=NAN,  # its clock, not ours: the detector does not use it
        interval_s=r.interval_seconds,
        oncpu_s=r.oncpu_seconds,
        runq_wait_s=r.runq_wait_seconds,
        main_waiting_s=r.main_waiting_seconds,
        throttled_s=r.throttled_seconds,
        io_bytes=r.io_bytes,
        in_collective_s=NAN if r.in_collective_seconds is None else r.in_collective_seconds,
        late_s=NAN if r.late_seconds is None else r.late_seconds,
        host=r.host,
        peer_wait_s=NAN if r.peer_wait_seconds is None else r.peer_wait_seconds,
        net_links=r.net_links if r.net_links_known else None,
        arrivals=(
            # The latest MAX_ARRIVALS, as a sender sends: a peer that sends more is cut.
            latest(tuple(_unpacked(c, clock_offset_ns) for c in r.arrivals))
            if r.arrivals_known
            else None
        ),
        interrupt_s=NAN if r.interrupt_seconds is None else r.interrupt_seconds,
        interrupt_cpu=-1 if r.interrupt_cpu is None else r.interrupt_cpu,
    )


def _packed(g: Arrivals) -> CommArrivals:
    """``g`` as the wire carries it: each value as its step from the one before (the first
    from 0); a step of one sequence number or milliseconds takes a few bytes."""
    return CommArrivals(
        comm_hash=g.comm_hash,
        comm_ranks=g.comm_ranks,
        seq_deltas=tuple(map(sub, g.seqs, (0, *g.seqs[:-1]))),
        arrival_deltas=tuple(map(sub, g.at_ns, (0, *g.at_ns[:-1]))),
    )


def _unpacked(c: CommArrivals, clock_offset_ns: int) -> Arrivals:
    """A peer's packed arrivals, summed back and moved onto this agent's clock (a peer
    whose columns differ in length is read as far as both go)."""
    n = min(len(c.seq_deltas), len(c.arrival_deltas))
    seqs = c.seq_deltas if len(c.seq_deltas) == n else c.seq_deltas[:n]
    steps = c.arrival_deltas if len(c.arrival_deltas) == n else c.arrival_deltas[:n]
    # Starting the sums at minus the offset moves every arrival onto this agent's clock.
    at = islice(accumulate(steps, initial=-clock_offset_ns), 1, None)
    return Arrivals(c.comm_hash, c.comm_ranks, tuple(accumulate(seqs)), tuple(at))
