"""The process table: who is using the machine, joined across /proc, BPF and NVML.

Each `ProcessTable.update` lists ``/proc``, reads ``/proc/<pid>/stat`` of every process that
ran since the previous update (with the sched collector, a process whose on-CPU time and
run-queue wait did not move has the same stat fields: its last reading is kept, re-read at
least every `STAT_MAX_AGE_S`), computes CPU ratios and network/scheduler rates from the
previous update, and reads the slower details of each process (command line, user, cgroup,
container, SLURM job) once per process lifetime (the command line again after an exec). The
rows (the ``top_n`` most active processes plus every *pinned* pid, e.g. registered trainers)
are built only while someone reads the table (`DEMAND_S`), otherwise on the first read, from
what the last two updates captured: that takes no I/O, so a reader on another thread (the
event loop) never waits on /proc (reading another process's command line can block on its
memory map lock). The result is an immutable `ProcessSnapshot`, swapped in atomically, so
readers never see a half-built table.

Memory stays flat under process churn: everything cached per pid belongs to the last two
updates, so thousands of short-lived processes leave nothing behind.

The rows are `bpfdyno.rpc.processes.ProcessRow`, the API's own vocabulary. "Activity", which
picks them, is `bpfdyno.rpc.processes.activity`: a process keeping one core busy and one
moving 1 Gbit/s count the same.
"""

from __future__ import annotations

import heapq
import logging
import os
import pwd
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, TypeVar

from bpfdyno.core import pidfs as procinfo
from bpfdyno.rpc.processes import ProcessRow, activity
from bpfdyno.sources.base import ReadAt
from bpfdyno.sources.kubelet.podresources import PodRef

log = logging.getLogger(__name__)

NAN = float("nan")
DEFAULT_TOP_N = 200


class SchedCounters(Protocol):
    """Cumulative per-process scheduler times (the sched collector's ``ProcSched``)."""

    @property
    def oncpu_ns(self) -> int: ...
    @property
    def offcpu_runnable_ns(self) -> int: ...
    @property
    def offcpu_blocked_ns(self) -> int: ...
    @property
    def runq_wait_ns(self) -> int: ...


class NetCounters(Protocol):
    """Cumulative per-process network counters (the net collector's ``ProcNet``)."""

    @property
    def tcp_tx_bytes(self) -> int: ...
    @property
    def tcp_rx_bytes(self) -> int: ...
    @property
    def udp_tx_bytes(self) -> int: ...
    @property
    def udp_rx_bytes(self) -> int: ...
    @property
    def tcp_retransmits(self) -> int: ...


T = TypeVar("T")
#: Returns per-pid values, or None when the source is unavailable (its columns become unknown).
Provider = Callable[[], Mapping[int, T] | None]


@dataclass(frozen=True, slots=True)
class ProcessSnapshot:
    """The table as of one refresh; never mutated after it is built."""

    ts: float  # wall-clock epoch seconds
    rows: tuple[ProcessRow, ...]
    total_processes: int
    #: Sources that could not be joined in (name -> reason); their columns are unknown.
    unavailable: Mapping[str, str] = field(default_factory=dict)


#: Rows are built at each update while the table was read within this many seconds.
DEMAND_S = 5.0
#: The reader a read without a name is counted as (the Prometheus and OTLP exporters).
EXPORTERS = "exporters"
#: A process's /proc/PID/stat is re-read at least this often even when it did not run.
STAT_MAX_AGE_S = 30.0

_NO_NET = (0, 0, 0, 0, 0)
_ZERO_RATES = (0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class _PidState:
    """What one update saw of one live pid: its cumulative totals."""

    stat: procinfo.PidStat
    stat_t: float  # when stat was read (monotonic)
    sched: tuple[int, int, int, int] | None  # oncpu, runnable, blocked, runq wait
    net: tuple[int, int, int, int, int] | None  # tcp tx/rx, udp tx/rx, retransmits


@dataclass(frozen=True, slots=True)
class _Update:
    """Everything one update read: /proc and every provider, at one instant."""

    t: float  # monotonic
    ts: float  # wall-clock epoch seconds
    uptime: float | None
    boot: float | None
    states: dict[int, _PidState]
    details: dict[int, _Details]
    gpu: Mapping[int, int] | None
    pods: Mapping[int, PodRef] | None
    pinned: set[int]
    unavailable: dict[str, str]
    #: When the scheduler totals were read (monotonic; the provider's `ReadAt`, else ``t``).
    sched_t: float = 0.0


@dataclass(slots=True)
class _Measured:
    """Per-interval values of one process, computed for every pid before rows are chosen."""

    cpu_ratio: float = NAN
    oncpu_ratio: float = NAN
    runq_wait_ratio: float = NAN
    offcpu_blocked_ratio: float = NAN
    net_rates: tuple[float, float, float, float, float] = (NAN, NAN, NAN, NAN, NAN)
    activity: float = 0.0


@dataclass(frozen=True, slots=True)
class _Details:
    """Slow-changing facts about one process lifetime, read once and cached."""

    start_ticks: int
    comm: str
    cmdline: str
    uid: int | None
    cgroup: str
    container_id: str
    k8s_pod_uid: str
    slurm_job_id: str
    user: str
    ns_pid: int  # its pid in its own pid namespace when that is not ours, else 0


class ProcessTable:
    """Builds `ProcessSnapshot`s; `update` (or `refresh`) is meant for one thread at a time.

    Args:
        proc_root: the procfs mount (a fixture tree in tests).
        top_n: most active processes kept per snapshot (pinned pids come on top).
        sched: per-pid scheduler counters (``SchedCollector.per_process``).
        net: per-pid network counters (``NetCollector.per_process``).
        gpu_memory: per-pid GPU memory used in bytes (from the GPU collector).
        pods: on Kubernetes, the pod and container of each process on a GPU one container
            holds (``GpuCollector.pods_by_pid``); the other processes of that container (same
            container id) get them too, and those of the pod's other containers (same pod
            uid in the cgroup path) the pod.
        pinned: pids always shown, e.g. registered trainers.
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        top_n: int = DEFAULT_TOP_N,
        sched: Provider[SchedCounters] | None = None,
        net: Provider[NetCounters] | None = None,
        gpu_memory: Provider[int] | None = None,
        pods: Provider[PodRef] | None = None,
        pinned: Callable[[], Collection[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if top_n < 1:
            raise ValueError(f"top_n must be at least 1, got {top_n}")
        self.proc_root = proc_root
        self.top_n = top_n
        self._sched = sched
        self._net = net
        self._gpu = gpu_memory
        self._pods = pods
        self._pinned = pinned
        self._clock = clock
        self._clk_tck = os.sysconf("SC_CLK_TCK")
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._users: dict[int, str] = {}
        self._logged: set[str] = set()
        # The last two updates (deltas are between them); rows are built from them under
        # the lock, by the updating thread or by the first reader.
        self._lock = threading.Lock()
        self._prev: _Update | None = None
        # The latest update whose scheduler totals came from an older walk than the last
        # update's (two updates may share a walk): the scheduler ratios' other end.
        self._sched_prev: _Update | None = None
        self._last: _Update | None = None
        self._snapshot = ProcessSnapshot(0.0, (), 0)
        self._built = True
        self._read_at: float | None = None
        #: Who read the table, when (monotonic): the readers it is kept fresh for.
        self._readers: dict[str, float] = {}
        # One update at a time, whoever asks (the collector's round or a reader).
        self._update_lock = threading.Lock()

    @property
    def snapshot(self) -> ProcessSnapshot:
        """The table as of the last update (thread-safe); builds its rows if not built yet.
        A read by the exporters (a scrape, a push)."""
        return self.read(EXPORTERS)

    def read(self, reader: str) -> ProcessSnapshot:
        """`snapshot`, read by ``reader`` (``uid N``): the table is kept fresh for them."""
        with self._lock:
            self._read_at = self._clock()
            self._note(reader, self._read_at)
            if not self._built:
                self._snapshot = self._build()
                self._built = True
            return self._snapshot

    def _note(self, reader: str, now: float) -> None:
        if reader not in self._readers and len(self._readers) >= 1024:
            self._readers = {k: t for k, t in self._readers.items() if now - t < DEMAND_S}
        self._readers[reader] = now

    def readers(self) -> list[str]:
        """Who read the table in the last `DEMAND_S` seconds (the work of keeping it fresh
        every round is theirs)."""
        with self._lock:
            now = self._clock()
            return [who for who, t in self._readers.items() if now - t < DEMAND_S]

    def in_demand(self) -> bool:
        """Whether someone read the table in the last `DEMAND_S` seconds."""
        with self._lock:
            return self._read_at is not None and self._clock() - self._read_at < DEMAND_S

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each internal cache (for tests and self-monitoring)."""
        last = self._last
        pids, details = (len(last.states), len(last.details)) if last is not None else (0, 0)
        return {"pids": pids, "details": details, "users": len(self._users)}

    def refresh(self) -> ProcessSnapshot:
        """`update` once, then return the snapshot with its rows."""
        self.update()
        return self.snapshot

    def fresh_snapshot(self, max_age_s: float, reader: str = "") -> ProcessSnapshot:
        """The table as of an update at most ``max_age_s`` old: updated first when the last
        one is older (blocking: call it on a worker thread).

        While nobody reads, the table is updated only now and then; a reader is never
        answered from that. Readers who come together share one update: it runs under the
        update lock, and whoever waited for it finds it fresh.
        """
        with self._update_lock:
            with self._lock:
                now = self._clock()
                self._read_at = now  # rows are built by the update below
                self._note(reader or EXPORTERS, now)
                last = self._last
            if last is None or now - last.t > max_age_s:
                self._update()
        return self.read(reader or EXPORTERS)

    def age_s(self) -> float | None:
        """Seconds since the last update; None before the first."""
        last = self._last
        return None if last is None else self._clock() - last.t

    def update(self) -> int:
        """Read /proc and the providers once and publish the new table.

        Its rows are built now only if the table was read in the last `DEMAND_S` seconds
        (someone is watching), otherwise on the first read (see `snapshot`): an update that
        nobody reads costs the listing of /proc and a stat read per process that ran.

        Returns:
            The number of processes seen.
        """
        with self._update_lock:
            return self._update()

    def _update(self) -> int:
        now = self._clock()
        unavailable: dict[str, str] = {}
        sched = self._call("sched", self._sched, unavailable)
        sched_t = sched.read_at if isinstance(sched, ReadAt) else now
        net = self._call("net", self._net, unavailable)
        gpu = self._call("gpu", self._gpu, unavailable)
        pods = self._call("pods", self._pods, unavailable)
        pinned = self._call_pinned(unavailable)
        last = self._last.states if self._last is not None else {}
        known = self._last.details if self._last is not None else {}
        states: dict[int, _PidState] = {}
        details: dict[int, _Details] = {}
        for pid in procinfo.list_pids(self.proc_root):
            s = sched.get(pid) if sched is not None else None
            sched_totals = (
                None
                if sched is None
                else (0, 0, 0, 0)
                if s is None
                else (s.oncpu_ns, s.offcpu_runnable_ns, s.offcpu_blocked_ns, s.runq_wait_ns)
            )
            prev = last.get(pid)
            if (
                prev is not None
                and sched_totals is not None
                and prev.sched is not None
                and s is not None
                and sched_totals[0] == prev.sched[0]
                and sched_totals[3] == prev.sched[3]
                and now - prev.stat_t < STAT_MAX_AGE_S
            ):
                # It neither ran nor waited for a CPU: its stat fields are the same (but for
                # resident memory, which reclaim may shrink: hence the maximum age).
                st, stat_t = prev.stat, prev.stat_t
            else:
                fresh = procinfo.read_stat(self.proc_root, pid)
                if fresh is None:
                    continue  # exited since the listing
                st, stat_t = fresh, now
            n = net.get(pid) if net is not None else None
            net_totals = (
                None
                if net is None
                else _NO_NET
                if n is None
                else (
                    n.tcp_tx_bytes,
                    n.tcp_rx_bytes,
                    n.udp_tx_bytes,
                    n.udp_rx_bytes,
                    n.tcp_retransmits,
                )
            )
            d = self._details_for(pid, st, known.get(pid))
            if d is None:
                continue  # exited while we looked
            states[pid] = _PidState(st, stat_t, sched_totals, net_totals)
            details[pid] = d
        update = _Update(
            now,
            time.time(),
            procinfo.read_uptime_s(self.proc_root),
            procinfo.read_boot_time_s(self.proc_root),
            states,
            details,
            gpu,
            pods,
            pinned,
            unavailable,
            sched_t,
        )
        with self._lock:
            if self._last is not None and self._last.sched_t < update.sched_t:
                self._sched_prev = self._last
            self._prev, self._last = self._last, update
            self._built = False
            if self._read_at is not None and now - self._read_at < DEMAND_S:
                self._snapshot = self._build()
                self._built = True
        return len(states)

    # -- building the rows (under the lock) ---------------------------------------------------

    def _build(self) -> ProcessSnapshot:
        cur, prev, sched_prev = self._last, self._prev, self._sched_prev
        if cur is None:
            return ProcessSnapshot(0.0, (), 0)
        measured = {
            pid: self._measure(pid, state, prev, sched_prev, cur)
            for pid, state in cur.states.items()
        }
        chosen = self._choose(measured, cur.pinned)
        by_container, by_uid = _known_pods(cur)
        rows = []
        for pid in chosen:
            state, d = cur.states[pid], cur.details[pid]
            pod = (
                (cur.pods or {}).get(pid)
                or by_container.get(d.container_id)
                or by_uid.get(d.k8s_pod_uid)
            )
            rows.append(self._row(pid, state, d, measured[pid], cur, pid in cur.pinned, pod))
        return ProcessSnapshot(cur.ts, tuple(rows), len(cur.states), cur.unavailable)

    def _measure(
        self,
        pid: int,
        state: _PidState,
        prev_update: _Update | None,
        sched_update: _Update | None,
        cur: _Update,
    ) -> _Measured:
        m = _Measured()
        st = state.stat
        prev = prev_update.states.get(pid) if prev_update is not None else None
        if prev is not None and prev.stat.start_ticks != st.start_ticks:
            prev = None  # the pid belongs to a new process
        interval = cur.t - prev_update.t if prev is not None and prev_update is not None else 0.0
        if interval > 0 and prev is not None:
            m.cpu_ratio = (st.cpu_ticks - prev.stat.cpu_ticks) / self._clk_tck / interval
        else:
            start_s = st.start_ticks / self._clk_tck
            if cur.uptime is not None and cur.uptime > start_s:
                # First sight: the average over the process's life so far.
                m.cpu_ratio = st.cpu_ticks / self._clk_tck / (cur.uptime - start_s)
        # The scheduler totals were read by their own walk, maybe not at this update's
        # instant, and maybe by the same walk as the previous update's: their ratios are
        # over the time between two different walks, never the table's interval.
        before = sched_update.states.get(pid) if sched_update is not None else None
        if before is not None and before.stat.start_ticks != st.start_ticks:
            before = None
        sched_interval = cur.sched_t - sched_update.sched_t if sched_update is not None else 0.0
        if sched_interval > 0 and before is not None:
            cs, ps = state.sched, before.sched
            if cs is not None and ps is not None:
                ns = sched_interval * 1e9
                # Each thread's books are read as the walk visits it, within the walk's
                # read, and the interval is between the middles of the two reads: a thread
                # asleep throughout can come out a few parts in 10,000 over one thread.
                most = float(max(st.num_threads, before.stat.num_threads, 1))
                m.oncpu_ratio = min(max(0, cs[0] - ps[0]) / ns, most)
                m.offcpu_blocked_ratio = min(max(0, cs[2] - ps[2]) / ns, most)
                m.runq_wait_ratio = min(max(0, cs[3] - ps[3]) / ns, most)
        if interval > 0 and prev is not None:
            cn, pn = state.net, prev.net
            if cn is not None and pn is not None:
                if cn == pn:
                    m.net_rates = _ZERO_RATES
                else:
                    r = [max(0, a - b) / interval for a, b in zip(cn, pn, strict=True)]
                    m.net_rates = (r[0], r[1], r[2], r[3], r[4])
        m.activity = activity(m.cpu_ratio, sum(m.net_rates[:4]))
        return m

    def _row(
        self,
        pid: int,
        state: _PidState,
        d: _Details,
        m: _Measured,
        cur: _Update,
        pinned: bool,
        pod: PodRef | None,
    ) -> ProcessRow:
        st, s, n = state.stat, state.sched, state.net
        return ProcessRow(
            pid=pid,
            ppid=st.ppid,
            comm=st.comm,
            cmdline=d.cmdline,
            uid=d.uid,
            user=d.user,
            state=st.state,
            num_threads=st.num_threads,
            start_unix_seconds=NAN
            if cur.boot is None
            else cur.boot + st.start_ticks / self._clk_tck,
            cpu_ratio=m.cpu_ratio,
            rss_bytes=st.rss_pages * self._page_size,
            oncpu_ns=None if s is None else s[0],
            offcpu_runnable_ns=None if s is None else s[1],
            offcpu_blocked_ns=None if s is None else s[2],
            runq_wait_ns=None if s is None else s[3],
            oncpu_ratio=m.oncpu_ratio,
            runq_wait_ratio=m.runq_wait_ratio,
            offcpu_blocked_ratio=m.offcpu_blocked_ratio,
            tcp_tx_bytes=None if n is None else n[0],
            tcp_rx_bytes=None if n is None else n[1],
            udp_tx_bytes=None if n is None else n[2],
            udp_rx_bytes=None if n is None else n[3],
            tcp_retransmits=None if n is None else n[4],
            tcp_tx_bytes_per_second=m.net_rates[0],
            tcp_rx_bytes_per_second=m.net_rates[1],
            udp_tx_bytes_per_second=m.net_rates[2],
            udp_rx_bytes_per_second=m.net_rates[3],
            tcp_retransmits_per_second=m.net_rates[4],
            cgroup=d.cgroup,
            container_id=d.container_id,
            k8s_pod_uid=d.k8s_pod_uid,
            k8s_namespace=pod.namespace if pod else "",
            k8s_pod=pod.pod if pod else "",
            k8s_container=pod.container if pod else "",
            slurm_job_id=d.slurm_job_id,
            gpu_memory_bytes=None if cur.gpu is None else int(cur.gpu.get(pid, 0)),
            pinned=pinned,
            ns_pid=d.ns_pid,
        )

    def _choose(self, measured: Mapping[int, _Measured], pinned: Collection[int]) -> list[int]:
        """The ``top_n`` most active pids plus every pinned pid that is alive."""
        if len(measured) <= self.top_n:
            top = list(measured)
        else:
            top = heapq.nlargest(self.top_n, measured, key=lambda p: (measured[p].activity, -p))
        extra = [p for p in pinned if p in measured and p not in set(top)]
        return top + sorted(extra)

    # -- details of the chosen rows ---------------------------------------------------------

    # -- details, once per process lifetime ----------------------------------------------------

    def _details_for(
        self, pid: int, st: procinfo.PidStat, cached: _Details | None
    ) -> _Details | None:
        if cached is not None and cached.start_ticks == st.start_ticks:
            if cached.comm == st.comm:
                return cached
            # Same process, new comm: it exec'd; the command line changed, the rest did not.
            cmdline = procinfo.read_cmdline(self.proc_root, pid)
            return replace(
                cached,
                comm=st.comm,
                cmdline=cmdline if cmdline is not None else cached.cmdline,
            )
        cmdline = procinfo.read_cmdline(self.proc_root, pid)
        if cmdline is None:
            return None  # exited while we looked
        cgroup = procinfo.read_cgroup(self.proc_root, pid) or ""
        # The job id is in the environment the process was started with: read once per pid.
        job = procinfo.read_environ_var(self.proc_root, pid, "SLURM_JOB_ID")
        if not job:
            job = procinfo.slurm_job_from_cgroup(cgroup)
        status = procinfo.read_status(self.proc_root, pid, ("Uid", "NSpid")) or {}
        uids = procinfo.status_ints(status, "Uid")
        uid = uids[0] if uids else None
        # NSpid lists the pid in our namespace first, in each nested one after it: the last
        # is the pid the process knows itself by (a container's); one entry means ours.
        nspids = procinfo.status_ints(status, "NSpid") or []
        return _Details(
            start_ticks=st.start_ticks,
            comm=st.comm,
            cmdline=cmdline,
            uid=uid,
            cgroup=cgroup,
            container_id=procinfo.container_id(cgroup),
            k8s_pod_uid=procinfo.k8s_pod_uid(cgroup),
            slurm_job_id=job,
            user=self._user_name(uid),
            ns_pid=nspids[-1] if len(nspids) > 1 else 0,
        )

    def _user_name(self, uid: int | None) -> str:
        if uid is None:
            return ""
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            if len(self._users) >= 4096:
                self._users.clear()  # a bound against uid churn (rare; cheap to refill)
            self._users[uid] = name
        return name

    # -- providers ----------------------------------------------------------------------------

    def _call(
        self, name: str, provider: Provider[T] | None, unavailable: dict[str, str]
    ) -> Mapping[int, T] | None:
        """Call one provider; a failure makes its columns unknown, never the refresh fail."""
        if provider is None:
            return None
        try:
            result = provider()
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            if reason not in self._logged and len(self._logged) < 100:
                self._logged.add(reason)
                log.warning("process table: %s data unavailable: %s", name, reason)
            unavailable[name] = reason
            return None
        if result is None:
            unavailable[name] = f"the {name} collector is not running (see `bpfdyno status`)"
        return result

    def _call_pinned(self, unavailable: dict[str, str]) -> set[int]:
        if self._pinned is None:
            return set()
        try:
            return set(self._pinned())
        except Exception as e:
            unavailable["pinned"] = f"{type(e).__name__}: {e}"
            return set()


def _known_pods(update: _Update) -> tuple[dict[str, PodRef], dict[str, PodRef]]:
    """What the processes whose GPU says which pod they are in tell of the others: container
    id -> its pod and container; pod uid (from the cgroup path) -> its pod, no container
    (another container of the pod is not the one the kubelet named)."""
    by_container: dict[str, PodRef] = {}
    by_uid: dict[str, PodRef] = {}
    for pid, pod in (update.pods or {}).items():
        d = update.details.get(pid)
        if d is None:
            continue
        if d.container_id:
            by_container[d.container_id] = pod
        if d.k8s_pod_uid:
            by_uid[d.k8s_pod_uid] = PodRef(pod.namespace, pod.pod, "")
    return by_container, by_uid
