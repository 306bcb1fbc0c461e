"""The hang verdict: a job whose ranks stopped moving, and the rank that holds it.

A rank of a synchronous job that moves no bytes (``RankSignals.io_bytes``) is waiting for a
collective, or is the reason the others wait. When no rank of a job moved more than
`HangSettings.still_bytes` for `HangSettings.after_s` seconds, the job hangs: each rank's
threads are read from ``/proc/<pid>/task/*/{stat,syscall,wchan,schedstat}`` and the rank
that is not waiting like its peers is named, with what it is doing:

* **stopped**: its main thread is in state T or t (SIGSTOP, a debugger);
* **blocked_read**: its main thread sleeps in a read on something other than a socket (a
  pipe or FIFO, a file, a terminal): it waits for input that is not the job's;
* **spinning**: its threads ran at least `HangSettings.spin_share` of a CPU since the job
  went still, or its main thread was runnable (R) in every reading since then (on a loaded
  machine a spinner gets less than any fixed share of a CPU, but it never sleeps), moving
  nothing;
* **waiting**: none of the above: asleep like the peers (in a futex, a poll, a socket).

When every rank is waiting, the event names no rank (rank -1): the job hangs on something
outside the ranks this node sees (a rank on another node, say). A job that moves again is
re-armed. Without NCCL's collective events the stillness is the signal, so a step that does
no I/O for longer than ``after_s`` (a long compute phase) would look like a spinning rank:
set ``after_s`` above the longest such phase.

Reading threads costs a few files per thread, done only for still jobs until their hang is
named.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.detection.signals import RankSignals, read_schedstat, read_small
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind, HangState, ThreadReport
from bpfdyno.tracing.capture.causes import syscall_name

#: System calls that read input from their first argument, a file descriptor.
_READS = frozenset({"read", "readv", "pread64", "preadv", "preadv2"})


@dataclass(frozen=True, slots=True)
class HangSettings:
    after_s: float = 30.0  # a job still this long hangs
    still_bytes: int = 64 * 1024  # all ranks together moved at most this per interval
    #: A rank whose threads ran this share of a CPU while the job moved nothing is spinning;
    #: low, because a spinner on a busy machine gets only its share (a quarter was seen),
    #: while a waiting rank's threads do not run at all.
    spin_share: float = 0.1


@dataclass(frozen=True, slots=True)
class ThreadSample:
    """One thread as ``/proc`` shows it at one moment."""

    tid: int
    comm: str
    state: str
    syscall: str  # "" when running in user space or unknown
    fd_target: str  # what the system call's first argument names: socket, pipe, file, ""
    wchan: str
    oncpu_ns: int


def _read(path: str) -> str | None:
    data = read_small(path)
    return None if data is None else data.decode("utf-8", "replace")


def _fd_kind(proc: str, pid: int, fd: int) -> str:
    """What an open file descriptor of ``pid`` is: socket, pipe, anon (eventfd...) or its
    path's kind (tty, file)."""
    try:
        target = os.readlink(f"{proc}/{pid}/fd/{fd}")
    except OSError:
        return ""
    if target.startswith("socket:"):
        return "socket"
    if target.startswith("pipe:"):
        return "pipe"
    if target.startswith("anon_inode:"):
        return target.removeprefix("anon_inode:").strip("[]")
    if target.startswith(("/dev/pts/", "/dev/tty")):
        return "tty"
    try:
        if stat.S_ISFIFO(os.stat(f"{proc}/{pid}/fd/{fd}").st_mode):
            return "pipe"  # a named pipe (FIFO): the link is its path
    except OSError:
        pass
    return "file"


def read_threads(proc_root: Path, pid: int) -> list[ThreadSample]:
    """The threads of ``pid`` (empty when it is gone), the main thread first."""
    proc = os.fspath(proc_root)
    try:
        tids = sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task"))
    except OSError:
        return []
    tids.sort(key=lambda t: t != pid)
    out = []
    for tid in tids:
        base = f"{proc}/{pid}/task/{tid}"
        line = _read(f"{base}/stat")
        times = read_schedstat(f"{base}/schedstat")
        if line is None or times is None:
            continue  # exited meanwhile
        comm = line[line.find("(") + 1 : line.rfind(")")]
        state = line[line.rfind(")") + 2 : line.rfind(")") + 3]
        syscall, target = "", ""
        fields = (_read(f"{base}/syscall") or "").split()
        if fields and fields[0].lstrip("-").isdigit() and int(fields[0]) >= 0:
            syscall = syscall_name(int(fields[0]))
            if syscall in _READS and len(fields) > 1:
                target = _fd_kind(proc, pid, int(fields[1], 16))
        wchan = _read(f"{base}/wchan") or ""
        out.append(
            ThreadSample(tid, comm, state, syscall, target, "" if wchan == "0" else wchan, times[0])
        )
    return out


def classify(
    threads: list[ThreadSample],
    oncpu_share: float,
    spin_share: float,
    always_runnable: bool = False,
) -> HangState:
    """What a rank is doing, from its threads (main thread first), its CPU share and whether
    its main thread was runnable in every reading since the job went still."""
    if not threads:
        return HangState.WAITING
    main = threads[0]
    if main.state in ("T", "t"):
        return HangState.STOPPED
    if oncpu_share >= spin_share or always_runnable:
        return HangState.SPINNING
    if (
        main.state in ("S", "D")
        and main.syscall in _READS
        and main.fd_target
        not in (
            "socket",
            "",
        )
    ):
        return HangState.BLOCKED_READ
    return HangState.WAITING


@dataclass(slots=True)
class _Still:
    """A job since it went still: when, and what each of its ranks' threads did since."""

    since_mono: float  # the start of the first still interval
    first_mono: float = 0.0  # when its threads were first read
    #: pid -> tid -> on-CPU ns at the first reading.
    start: dict[int, dict[int, int]] = field(default_factory=dict)
    #: pid -> tid -> (on-CPU ns, unchanged since when).
    last: dict[int, dict[int, tuple[int, float]]] = field(default_factory=dict)
    #: pid -> (readings, readings with its main thread runnable).
    runnable: dict[int, tuple[int, int]] = field(default_factory=dict)
    reported: bool = False


class HangWatch:
    """Follows each job's stillness; returns a hang event per held job once, when it hangs."""

    def __init__(
        self, host: str, settings: HangSettings | None = None, proc_root: Path = Path("/proc")
    ) -> None:
        self.host = host
        self.settings = settings or HangSettings()
        self._proc = proc_root
        self._still: dict[str, _Still] = {}

    def hung_jobs(self) -> set[str]:
        """The jobs reported hung and still not moving."""
        return {job for job, st in self._still.items() if st.reported}

    def update(
        self, signals: Iterable[RankSignals], now_mono: float, now_unix: float
    ) -> list[DetectionEvent]:
        jobs: dict[str, list[RankSignals]] = {}
        for s in signals:
            jobs.setdefault(s.job_id, []).append(s)
        events: list[DetectionEvent] = []
        still: dict[str, _Still] = {}
        for job_id, ranks in sorted(jobs.items()):
            if sum(s.io_bytes for s in ranks) > self.settings.still_bytes:
                continue  # it moves: (re-)armed
            # The interval just read was still: it began one interval ago.
            began = now_mono - max(s.interval_s for s in ranks)
            st = self._still.get(job_id) or _Still(began, first_mono=now_mono)
            still[job_id] = st
            if st.reported:
                continue  # named once: only whether it moves again matters now
            threads = {s.pid: read_threads(self._proc, s.pid) for s in ranks}
            self._track(st, threads, now_mono)
            if not st.reported and now_mono - st.since_mono >= self.settings.after_s:
                st.reported = True
                events += self._verdict(job_id, ranks, threads, st, now_mono, now_unix)
        self._still = still
        return events

    @staticmethod
    def _track(st: _Still, threads: dict[int, list[ThreadSample]], now_mono: float) -> None:
        for pid, ts in threads.items():
            readings, running = st.runnable.get(pid, (0, 0))
            st.runnable[pid] = (readings + 1, running + (bool(ts) and ts[0].state == "R"))
            start = st.start.setdefault(pid, {})
            last = st.last.setdefault(pid, {})
            for t in ts:
                start.setdefault(t.tid, t.oncpu_ns)
                seen = last.get(t.tid)
                if seen is None:
                    # Not run since the job went still, as far as this reading can tell.
                    last[t.tid] = (t.oncpu_ns, st.since_mono)
                elif seen[0] != t.oncpu_ns:
                    last[t.tid] = (t.oncpu_ns, now_mono)  # it ran: off-CPU from now at most

    def _verdict(
        self,
        job_id: str,
        ranks: list[RankSignals],
        threads: dict[int, list[ThreadSample]],
        st: _Still,
        now_mono: float,
        now_unix: float,
    ) -> list[DetectionEvent]:
        window = now_mono - st.since_mono
        measured = now_mono - st.first_mono  # the time the threads' CPU shares cover
        reports: dict[int, tuple[HangState, tuple[ThreadReport, ...]]] = {}
        for s in sorted(ranks, key=lambda r: r.rank):
            ts = threads[s.pid]
            start, last = st.start.get(s.pid, {}), st.last.get(s.pid, {})
            shares = {
                t.tid: (t.oncpu_ns - start.get(t.tid, t.oncpu_ns)) / 1e9 / measured
                if measured > 0
                else 0.0
                for t in ts
            }
            readings, running = st.runnable.get(s.pid, (0, 0))
            state = classify(
                ts,
                sum(shares.values()),
                self.settings.spin_share,
                always_runnable=readings >= 2 and running == readings,
            )
            reports[s.rank] = (
                state,
                tuple(_report(t, last.get(t.tid), shares[t.tid], now_mono) for t in ts),
            )
        held = [r for r, (state, _) in reports.items() if state is not HangState.WAITING]
        by_rank = {s.rank: s for s in ranks}
        waiting = [r for r in reports if r not in held]
        if not held:
            return [
                DetectionEvent(
                    kind=DetectionKind.HANG,
                    job_id=job_id,
                    rank=-1,
                    pid=0,
                    host=self.host,
                    unix_seconds=now_unix,
                    summary=f"job {job_id} hangs: no bytes moved for {window:.0f} s; its ranks "
                    f"here ({_ranks(waiting)}) all wait: the rank holding them is elsewhere",
                    hang_state=HangState.WAITING.value,
                )
            ]
        events = []
        for r in held:
            state, thread_reports = reports[r]
            main = thread_reports[0] if thread_reports else ThreadReport(0)
            doing = f"main thread {main.state}"
            if main.syscall:
                doing += f" in {main.syscall}"
                if main.waiting_on:
                    doing += f" on a {main.waiting_on}"
            if main.wchan:
                doing += f" ({main.wchan})"
            events.append(
                DetectionEvent(
                    kind=DetectionKind.HANG,
                    job_id=job_id,
                    rank=r,
                    pid=by_rank[r].pid,
                    host=self.host,
                    unix_seconds=now_unix,
                    summary=f"job {job_id} hangs: rank {r} is {state.value} ({doing}); ranks "
                    f"{_ranks(waiting) or 'none'} wait; no bytes moved for {window:.0f} s",
                    hang_state=state.value,
                    threads=thread_reports,
                )
            )
        return events


def _report(
    t: ThreadSample, last: tuple[int, float] | None, share: float, now_mono: float
) -> ThreadReport:
    off = now_mono - last[1] if last is not None and last[0] == t.oncpu_ns else 0.0
    return ThreadReport(
        tid=t.tid,
        comm=t.comm,
        state=t.state,
        syscall=t.syscall,
        wchan=t.wchan,
        waiting_on=t.fd_target,
        offcpu_seconds=round(off, 3),
        oncpu_share=round(share, 3),
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))
