"""The process table: who is using the machine, joined across /proc, BPF and NVML.

Each `ProcessTable.update` lists ``/proc``, reads ``/proc/<pid>/stat`` of every process that
ran since the previous update (with the sched collector, a process whose on-CPU time and
run-queue wait did not move has the same stat fields: its last reading is kept, re-read at
least every `STAT_MAX_AGE_S`), computes CPU ratios and network/scheduler rates from the
previous update, keeps the ``top_n`` most active processes plus every *pinned* pid
(registered trainers), and reads the slower details (command line, user, cgroup, container,
SLURM job) only for those rows, caching them per process lifetime. The rows themselves are
built only while someone reads the table (`DEMAND_S`), otherwise on the first read, from
values the update captured. The result is an immutable `ProcessSnapshot`, swapped in
atomically, so readers on other threads never see a half-built table.

Memory stays flat under process churn: the per-pid caches hold only pids that were alive at
the last refresh (and details only for rows shown, with a hard cap), so thousands of
short-lived processes leave nothing behind.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar

from bpfdyno.rpc.processes import ProcessRow, activity
from bpfdyno.sources.procs import pidfs as procinfo

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
#: A process's /proc/PID/stat is re-read at least this often even when it did not run.
STAT_MAX_AGE_S = 30.0

_NO_NET = (0, 0, 0, 0, 0)
_ZERO_RATES = (0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass(slots=True)
class _PidState:
    """What the previous update saw of one live pid (for deltas)."""

    start_ticks: int
    stat: procinfo.PidStat
    stat_t: float  # when stat was read (monotonic)
    net: tuple[int, int, int, int, int] | None = None
    sched: tuple[int, int, int] | None = None  # oncpu, blocked, runq wait


@dataclass(slots=True)
class _Measured:
    """Per-interval values of one process, computed for every pid before rows are chosen."""

    cpu_ratio: float = NAN
    sched: tuple[int, int, int, int] | None = None  # oncpu, runnable, blocked, runq wait
    oncpu_ratio: float = NAN
    runq_wait_ratio: float = NAN
    offcpu_blocked_ratio: float = NAN
    net: tuple[int, int, int, int, int] | None = None  # tcp tx/rx, udp tx/rx, retransmits
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


@dataclass(frozen=True, slots=True)
class _RowInput:
    """Everything one row is made of, captured by an update (so rows build on any thread)."""

    pid: int
    stat: procinfo.PidStat
    details: _Details
    measured: _Measured
    gpu_bytes: int | None
    pinned: bool
    user: str


@dataclass(frozen=True, slots=True)
class _Pending:
    """An update's table whose rows are not built yet (nobody has read it)."""

    ts: float
    inputs: tuple[_RowInput, ...]
    total_processes: int
    unavailable: Mapping[str, str]
    boot: float | None
    clk_tck: int
    page_size: int

    def build(self) -> ProcessSnapshot:
        rows = tuple(self._row(i) for i in self.inputs)
        return ProcessSnapshot(self.ts, rows, self.total_processes, self.unavailable)

    def _row(self, i: _RowInput) -> ProcessRow:
        st, d, m = i.stat, i.details, i.measured
        s, n = m.sched, m.net
        boot = self.boot
        return ProcessRow(
            pid=i.pid,
            ppid=st.ppid,
            comm=st.comm,
            cmdline=d.cmdline,
            uid=d.uid,
            user=i.user,
            state=st.state,
            num_threads=st.num_threads,
            start_unix_seconds=NAN if boot is None else boot + st.start_ticks / self.clk_tck,
            cpu_ratio=m.cpu_ratio,
            rss_bytes=st.rss_pages * self.page_size,
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
            slurm_job_id=d.slurm_job_id,
            gpu_memory_bytes=i.gpu_bytes,
            pinned=i.pinned,
        )


class ProcessTable:
    """Builds `ProcessSnapshot`s; `update` (or `refresh`) is meant for one thread at a time.

    Args:
        proc_root: the procfs mount (a fixture tree in tests).
        top_n: most active processes kept per snapshot (pinned pids come on top).
        sched: per-pid scheduler counters (``SchedCollector.per_process``).
        net: per-pid network counters (``NetCollector.per_process``).
        gpu_memory: per-pid GPU memory used in bytes (from the GPU collector).
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
        self._pinned = pinned
        self._clock = clock
        self._clk_tck = os.sysconf("SC_CLK_TCK")
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._last_t: float | None = None
        self._pids: dict[int, _PidState] = {}
        self._details: dict[int, _Details] = {}
        self._users: dict[int, str] = {}
        self._logged: set[str] = set()
        self._lock = threading.Lock()
        self._snapshot = ProcessSnapshot(0.0, (), 0)
        self._pending: _Pending | None = None
        self._read_at: float | None = None

    @property
    def snapshot(self) -> ProcessSnapshot:
        """The table as of the last update (thread-safe); builds its rows if still pending."""
        with self._lock:
            self._read_at = self._clock()
            if self._pending is not None:
                self._snapshot = self._pending.build()
                self._pending = None
            return self._snapshot

    def cache_sizes(self) -> dict[str, int]:
        """Entries in each internal cache (for tests and self-monitoring)."""
        return {"pids": len(self._pids), "details": len(self._details), "users": len(self._users)}

    def refresh(self) -> ProcessSnapshot:
        """`update` once, then return the snapshot with its rows."""
        self.update()
        return self.snapshot

    def update(self) -> int:
        """Read /proc and the providers once and publish the new table.

        Its rows are built now only if the table was read in the last `DEMAND_S` seconds
        (someone is watching); otherwise on the first read (see `snapshot`).

        Returns:
            The number of rows of the new table.
        """
        now = self._clock()
        elapsed = None if self._last_t is None else now - self._last_t
        uptime = procinfo.read_uptime_s(self.proc_root)
        boot = procinfo.read_boot_time_s(self.proc_root)
        unavailable: dict[str, str] = {}
        sched = self._call("sched", self._sched, unavailable)
        net = self._call("net", self._net, unavailable)
        gpu = self._call("gpu", self._gpu, unavailable)
        pinned = self._call_pinned(unavailable)

        states: dict[int, _PidState] = {}
        measured: dict[int, _Measured] = {}
        for pid in procinfo.list_pids(self.proc_root):
            prev = self._pids.get(pid)
            s = sched.get(pid) if sched is not None else None
            st = self._stat(pid, prev, s, now)
            if st is None:
                continue  # exited since the listing
            if prev is not None and prev.start_ticks != st.start_ticks:
                prev = None  # the pid now belongs to a new process
            state = _PidState(
                st.start_ticks, st, now if prev is None or st is not prev.stat else prev.stat_t
            )
            measured[pid] = self._measure(st, prev, state, elapsed, uptime, sched, s, net, pid)
            states[pid] = state
        self._pids = states

        chosen = self._choose(measured, pinned)
        inputs = []
        for pid in chosen:
            st = states[pid].stat
            details = self._details_for(pid, st)
            if details is not None:
                gpu_bytes = None if gpu is None else int(gpu.get(pid, 0))
                user = self._user_name(details.uid)
                inputs.append(
                    _RowInput(pid, st, details, measured[pid], gpu_bytes, pid in pinned, user)
                )
        self._evict_details(states.keys(), chosen)
        self._last_t = now
        pending = _Pending(
            time.time(),
            tuple(inputs),
            len(states),
            unavailable,
            boot,
            self._clk_tck,
            self._page_size,
        )
        demanded = self._read_at is not None and now - self._read_at < DEMAND_S
        built = pending.build() if demanded else None
        with self._lock:
            if built is not None:
                self._snapshot, self._pending = built, None
            else:
                self._pending = pending
        return len(inputs)

    def _stat(
        self, pid: int, prev: _PidState | None, sched: SchedCounters | None, now: float
    ) -> procinfo.PidStat | None:
        """/proc/PID/stat, or the previous reading when the process has not run since.

        A process that neither ran nor waited for a CPU since the last reading has the same
        stat fields (resident memory aside, which reclaim may shrink: re-read at least
        every `STAT_MAX_AGE_S` seconds).
        """
        if (
            prev is not None
            and sched is not None
            and prev.sched is not None
            and sched.oncpu_ns == prev.sched[0]
            and sched.runq_wait_ns == prev.sched[2]
            and now - prev.stat_t < STAT_MAX_AGE_S
        ):
            return prev.stat
        return procinfo.read_stat(self.proc_root, pid)

    def _measure(
        self,
        st: procinfo.PidStat,
        prev: _PidState | None,
        state: _PidState,
        elapsed: float | None,
        uptime: float | None,
        sched: Mapping[int, SchedCounters] | None,
        s: SchedCounters | None,
        net: Mapping[int, NetCounters] | None,
        pid: int,
    ) -> _Measured:
        m = _Measured()
        interval = elapsed if prev is not None and elapsed and elapsed > 0 else None
        start_s = st.start_ticks / self._clk_tck
        if interval is not None and prev is not None:
            m.cpu_ratio = (st.cpu_ticks - prev.stat.cpu_ticks) / self._clk_tck / interval
        elif uptime is not None and uptime > start_s:
            # First sight: the average over the process's life so far.
            m.cpu_ratio = st.cpu_ticks / self._clk_tck / (uptime - start_s)
        if sched is not None:
            cur = (
                (s.oncpu_ns, s.offcpu_runnable_ns, s.offcpu_blocked_ns, s.runq_wait_ns)
                if s is not None
                else (0, 0, 0, 0)
            )
            m.sched = cur
            state.sched = (cur[0], cur[2], cur[3])
            if interval is not None and prev is not None and prev.sched is not None:
                ns = interval * 1e9
                m.oncpu_ratio = max(0, cur[0] - prev.sched[0]) / ns
                m.offcpu_blocked_ratio = max(0, cur[2] - prev.sched[1]) / ns
                m.runq_wait_ratio = max(0, cur[3] - prev.sched[2]) / ns
        if net is not None:
            n = net.get(pid)
            totals = (
                (n.tcp_tx_bytes, n.tcp_rx_bytes, n.udp_tx_bytes, n.udp_rx_bytes, n.tcp_retransmits)
                if n is not None
                else _NO_NET
            )
            m.net = totals
            state.net = totals
            if interval is not None and prev is not None and prev.net is not None:
                before = prev.net
                if totals == before:
                    m.net_rates = _ZERO_RATES
                else:
                    r = tuple(max(0, a - b) / interval for a, b in zip(totals, before, strict=True))
                    m.net_rates = (r[0], r[1], r[2], r[3], r[4])
        m.activity = activity(m.cpu_ratio, sum(m.net_rates[:4]))
        return m

    def _choose(self, measured: Mapping[int, _Measured], pinned: Collection[int]) -> list[int]:
        """The ``top_n`` most active pids plus every pinned pid that is alive."""
        if len(measured) <= self.top_n:
            top = list(measured)
        else:
            top = heapq.nlargest(self.top_n, measured, key=lambda p: (measured[p].activity, -p))
        extra = [p for p in pinned if p in measured and p not in set(top)]
        return top + sorted(extra)

    # -- details of the chosen rows ---------------------------------------------------------

    def _details_for(self, pid: int, st: procinfo.PidStat) -> _Details | None:
        cached = self._details.get(pid)
        if cached is not None and cached.start_ticks == st.start_ticks:
            if cached.comm == st.comm:
                return cached
            # Same process, new comm: it exec'd; the command line changed, the rest did not.
            cmdline = procinfo.read_cmdline(self.proc_root, pid)
            fresh = _Details(
                st.start_ticks,
                st.comm,
                cmdline if cmdline is not None else cached.cmdline,
                cached.uid,
                cached.cgroup,
                cached.container_id,
                cached.k8s_pod_uid,
                cached.slurm_job_id,
            )
            self._details[pid] = fresh
            return fresh
        cmdline = procinfo.read_cmdline(self.proc_root, pid)
        if cmdline is None:
            return None  # exited while we looked
        cgroup = procinfo.read_cgroup(self.proc_root, pid) or ""
        # The job id is in the environment the process was started with: read once per pid.
        job = procinfo.read_environ_var(self.proc_root, pid, "SLURM_JOB_ID")
        if not job:
            job = procinfo.slurm_job_from_cgroup(cgroup)
        details = _Details(
            start_ticks=st.start_ticks,
            comm=st.comm,
            cmdline=cmdline,
            uid=procinfo.read_uid(self.proc_root, pid),
            cgroup=cgroup,
            container_id=procinfo.container_id(cgroup),
            k8s_pod_uid=procinfo.k8s_pod_uid(cgroup),
            slurm_job_id=job,
        )
        self._details[pid] = details
        return details

    def _evict_details(self, alive: Collection[int], chosen: Collection[int]) -> None:
        for pid in [p for p in self._details if p not in alive]:
            del self._details[pid]
        # Rows that dropped out of the top N keep their details for a while (they often come
        # back), but never more than twice the table's size.
        limit = 2 * max(self.top_n, len(chosen))
        if len(self._details) > limit:
            keep = set(chosen)
            for pid in [p for p in self._details if p not in keep]:
                del self._details[pid]
                if len(self._details) <= limit:
                    break

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
