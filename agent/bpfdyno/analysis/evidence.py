"""One rank's evidence, read from its own trace file: `build_evidence`.

The diagnosis of a job (`bpfdyno.analysis.verdict`) compares ranks collective by collective:
which rank reached each one last, and what that rank's threads were doing — by the kernel's
account — in the run-up to it, against what the other ranks were doing in theirs. Each node
reads its own ranks' files; what travels is this evidence, a few hundred bytes per
collective.

Which collectives (the first kind the file has, in this order):

1. NCCL kernels on the GPU (CUPTI's ``ncclDevKernel_*`` / ``ncclKernel_*``): a rank joins a
   collective when its GPU reaches the kernel; the CPU runs ahead and tells nothing.
2. The backend's execution spans on the CPU (``gloo:all_reduce``...): gloo runs each
   collective on a worker thread, from when the rank joins to when it completes.
3. The c10d calls (``c10d::allreduce_``) or bpfdyno's NCCL probes (host-side calls only:
   said in the notes).

Their order on each group (process group, CUDA stream, NCCL communicator) is what the
comparison matches across ranks.

What the kernel saw, per collective, in two windows on this rank: the run-up, from the
previous collective's arrival (or the window's start) to this one's, and the collective
itself. For the threads that matter — the main thread, for every cause; the threads that ran
the collectives (gloo's workers), only for waiting for a CPU (the rest of their off-CPU time
is idle time between collectives) — the time off-CPU by cause: waiting for a CPU (and which
tasks held it: the capture records the task that ran instead), blocked by cause and system
call, blocked inside ``enumerate(DataLoader)`` (waiting for DataLoader workers); the GPU's
busy time (its other kernels); TCP retransmits, resets and drops on the rank's sockets.

Waiting for whom, one level: while the main thread waited for its DataLoader workers, what
the workers (the traced process's child processes, recorded with it) waited for, by cause.
The workers are the children that woke the main thread (handing it a batch) in the window;
when none did (a pin-memory thread hands the batches over), every child.
Their waits for a CPU, a disk, a file or a timer count whoever woke them; their waits on a
lock, pipe or socket only when someone outside the job woke them (a storage server): a worker
woken by the trainer or by itself was waiting for the trainer's next index or for its own
threads, the trainer's side of the wait, not the reason the batch was late.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from bpfdyno.analysis.trace_facts import Collective, NetInstant, OffCpuSlice, TraceFacts
from bpfdyno.rpc.diagnosis import (
    OFFCPU_CAUSE,
    READ_CPU,
    CauseTime,
    CollectiveEvidence,
    ConnectionRtt,
    CpuQuota,
    Instance,
    LossEvent,
    MemoryCgroup,
    RankEvidence,
    StepSplit,
)

#: Most collectives kept per file (a 1.5 s trace of a fast job has ~150).
MAX_COLLECTIVES = 20_000
#: Most loss events kept per file.
MAX_LOSS_EVENTS = 1000
LOSS_KINDS = ("tcp_retransmit", "tcp_reset_sent", "tcp_reset_received", "packet_drop")
#: Drop reasons that mean the data had arrived already: the copy of a retransmit that was
#: not needed (its original arrived; its acknowledgement came late), not a loss. Listed as
#: ``duplicate`` so the comparison can tell the sender's retransmit apart from a loss.
DUPLICATE_REASONS = frozenset({"TCP_OLD_DATA", "TCP_OFOMERGE"})
#: Holders of the CPU listed per collective.
TOP_HOLDERS = 3


@dataclass(slots=True)
class _Slice:
    tid: int
    start: float  # µs, clipped to the window
    end: float
    cause: str  # a diagnosis cause
    detail: str  # who held the CPU, or the system call
    #: The thread's system and user CPU time (µs) on a CPU just before the slice, as the
    #: kernel charged it; 0: not known, or the slice began before the window (that time is
    #: not the window's).
    system_before: int = 0
    user_before: int = 0
    #: A preemption's: the system call it was preempted in ("": none, or not known).
    inside: str = ""


class _Threads:
    """The off-CPU slices that count, per thread, sorted: overlap queries by bisection."""

    def __init__(self, slices: Iterable[_Slice]) -> None:
        by_tid: dict[int, list[_Slice]] = defaultdict(list)
        for s in slices:
            by_tid[s.tid].append(s)
        self.rows = {tid: sorted(v, key=lambda s: s.start) for tid, v in by_tid.items()}
        self.starts = {tid: [s.start for s in v] for tid, v in self.rows.items()}

    def overlapping(self, lo: float, hi: float) -> Iterable[tuple[_Slice, float]]:
        """Each slice overlapping [lo, hi) with the length of the overlap (µs)."""
        for tid in self.rows:
            yield from self.of(tid, lo, hi)

    def of(self, tid: int, lo: float, hi: float) -> Iterable[tuple[_Slice, float]]:
        """Thread ``tid``'s slices overlapping [lo, hi), with the overlap (µs)."""
        row, starts = self.rows.get(tid, []), self.starts.get(tid, [])
        # A thread's slices do not overlap each other: only the one starting last before lo
        # can reach into the window.
        i = max(0, bisect.bisect_right(starts, lo) - 1)
        while i < len(row) and row[i].start < hi:
            s = row[i]
            overlap = min(s.end, hi) - max(s.start, lo)
            if overlap > 0:
                yield s, overlap
            i += 1


def build_evidence(facts: TraceFacts, host: str = "") -> RankEvidence:
    """The evidence of one file's process (see the module doc)."""
    notes: list[str] = []
    pid = facts.main_pid
    lo, hi = _window(facts, notes)
    chosen, source_note = _collectives(facts, lo, hi)
    if source_note:
        notes.append(source_note)
    if not facts.info:
        notes.append("no kernel tracks in the file: only its collectives' times are compared")
    steps = _steps(facts, lo, hi)
    # Thread ids of the sched track are the host's (a container's trainer: not the file's pid).
    tid = facts.main_tid
    threads = _Threads(_slices(facts, tid, {c.tid for c in chosen if c.tid} - {pid}, lo, hi))
    reclaims = sorted((s, e) for t, s, e in facts.reclaims if t == tid and e > lo and s < hi)
    worker_slices, worker_of = _worker_slices(facts, tid, lo, hi)
    children = _Threads(worker_slices)
    busy = _gpu_busy(facts, lo, hi)
    listed = sorted(
        (e for e in facts.net_events if e.kind in LOSS_KINDS and lo <= e.ts_us <= hi),
        key=lambda e: e.ts_us,
    )
    loss_ts = [e.ts_us for e in listed if not _duplicate(e)]
    congestion = _Totals(facts, FABRIC_CONGESTION, lo, hi)
    errors = _Totals(facts, FABRIC_ERRORS, lo, hi)
    interrupts = _Totals(facts, ("interrupt time",), lo, hi)
    numbered = _NcclNumbers(facts.nccl_profiled)
    out: list[CollectiveEvidence] = []
    previous: dict[str, float] = {}
    index: dict[str, int] = defaultdict(int)
    step_starts = [s for s, _ in steps]
    incomplete = _sched_incomplete(facts.info)
    # With the sched track sampled in time by the overhead budget (it keeps a quarter), the
    # time it shows no off-CPU slice is no proof of running: its own work is then not
    # measured (a rank late for its disk read "ran 1.5 s longer"). A few intervals lost to
    # a full ring buffer, or records before the window over the cap, leave it measured.
    sampled = "sampled by" in incomplete
    measured = tid in threads.rows and not sampled
    covered_from = lo + _late_start_us(facts.info)
    if covered_from > lo:
        notes.append(
            f"the kernel tracks begin {(covered_from - lo) / 1e6:.3f} s into the window (their "
            "recording began after the profiler): a run-up before then has no measure of its "
            "time on a CPU"
        )
    for c in chosen[:MAX_COLLECTIVES]:
        run_up = previous.get(c.group, lo)
        previous[c.group] = c.start_us
        before, holders, worst_before = _causes(threads, busy, run_up, c.start_us)
        stolen = interrupts.between(run_up, c.start_us) / 1e9  # ns of CPU time
        extra = []
        # Before the recording began no slice was seen: that time is unknown, not running.
        if measured and run_up >= covered_from:
            on_cpu = _on_cpu(threads, tid, run_up, c.start_us)
            stolen = _while_on_cpu(stolen, on_cpu, (c.start_us - run_up) / 1e6)
            # Reclaiming pages for its own allocations is on its CPU but not its work.
            reclaiming = min(
                max(0.0, on_cpu - stolen), _reclaiming(reclaims, threads, tid, run_up, c.start_us)
            )
            ran = on_cpu - stolen - reclaiming
            # The kernel's work in the file reads it then slept in (filling the page cache
            # from the disk, copying) is on its CPU but the reads' cost, not its work.
            reading = _reading(threads, tid, run_up, c.start_us, max(0.0, ran))
            ran -= sum(reading.values())
            extra += [CauseTime(READ_CPU[cause], t) for cause, t in reading.items()]
            if ran > 0:
                extra.append(CauseTime("on_cpu", ran))
            if reclaiming > 0:
                extra.append(CauseTime("memory", reclaiming))
        if stolen > 0:
            extra.append(CauseTime("interrupts", stolen))
        if extra:
            before = tuple(sorted((*before, *extra), key=lambda t: -t.seconds))
        during, _, worst_during = _causes(threads, busy, c.start_us, c.end_us)
        workers, worker_pids = _workers(threads, children, worker_of, tid, run_up, c.start_us)
        worst = {w.cause: w for w in worst_during}
        for w in worst_before:  # the run-up's, unless the collective itself had a longer one
            if w.cause not in worst or w.duration_ns > worst[w.cause].duration_ns:
                worst[w.cause] = w
        step = bisect.bisect_right(step_starts, c.start_us) - 1 if steps else -1
        out.append(
            CollectiveEvidence(
                op=c.op,
                source=c.source,
                group=c.group,
                index=index[c.group],
                step=step,
                size_bytes=c.size_bytes,
                arrival_unix_ns=facts.abs_ns(c.start_us),
                end_unix_ns=facts.abs_ns(c.end_us),
                before=before,
                during=during,
                holders=holders,
                worst=tuple(_instance(w, facts) for w in worst.values()),
                loss_events=bisect.bisect_right(loss_ts, c.end_us)
                - bisect.bisect_left(loss_ts, run_up),
                fabric_congestion=congestion.between(run_up, c.end_us),
                fabric_errors=errors.between(run_up, c.end_us),
                workers=workers,
                worker_pids=worker_pids,
                nccl_seq=numbered.seq(c),
            )
        )
        index[c.group] += 1
    if len(chosen) > MAX_COLLECTIVES:
        notes.append(f"only the first {MAX_COLLECTIVES} of {len(chosen)} collectives are kept")
    lost = facts.info.get("records_over_cap_dropped", 0)
    if isinstance(lost, int) and lost:
        notes.append(f"{lost} kernel records were lost while capturing (the file's info slice)")
    if facts.dropped:
        notes.append(f"{facts.dropped} events beyond the reader's limits were not read")
    out_spans = chosen[:MAX_COLLECTIVES]
    locals_ = {b[5] for b in facts.net_bursts} | {e.local for e in facts.net_events}
    return RankEvidence(
        path=facts.path,
        host=host or facts.host,
        pid=pid,
        rank=facts.rank,
        world_size=facts.world_size,
        base_ns=facts.base_ns,
        window_start_unix_ns=facts.abs_ns(lo),
        window_end_unix_ns=facts.abs_ns(hi),
        kernel_tracks=tuple(str(t) for t in facts.info.get("tracks", ()) or ()),
        collectives=tuple(out),
        local_addresses=tuple(sorted(a for a in locals_ if a)),
        loss_events=tuple(
            LossEvent(
                "duplicate" if _duplicate(e) else e.kind,
                e.ts_us,
                facts.abs_ns(e.ts_us),
                e.local,
                e.peer,
            )
            for e in listed[:MAX_LOSS_EVENTS]
        ),
        gpu_sm_clock_mhz=_mean_clock(facts, lo, hi),
        steps=_step_split(steps, chosen, threads, busy, tid, interrupts, on_cpu=not sampled),
        notes=tuple(notes),
        fabric_devices=tuple(sorted({d for _, d, _, _ in facts.fabric if d != "cpu"})),
        connections=_connections(facts, lo, hi),
        cpu_quotas=_cpu_quotas(facts),
        memory_cgroups=_memory_cgroups(facts),
        sched_incomplete=incomplete,
        collective_net_bytes=_bytes_inside(
            facts.net_bursts, _union((c.start_us, c.end_us) for c in out_spans)
        ),
    )


#: Most TCP connections listed per file.
MAX_CONNECTIONS = 1000


def _connections(facts: TraceFacts, lo: float, hi: float) -> tuple[ConnectionRtt, ...]:
    """Each TCP connection's round-trip times from its samples in the window (a sample at
    the window's start is the last one before it)."""
    by_conn: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ts, local, peer, srtt in facts.tcp_rtt:
        if lo <= ts <= hi:
            by_conn[(local, peer)].append(srtt)
    out = [
        ConnectionRtt(local, peer, statistics.median(v), max(v), len(v))
        for (local, peer), v in sorted(by_conn.items())
    ]
    return tuple(out[:MAX_CONNECTIONS])


def _cpu_quotas(facts: TraceFacts) -> tuple[CpuQuota, ...]:
    """The info slice's cgroups with a CPU quota and what the window added to them."""
    out = []
    for q in facts.info.get("sched_cpu_quota", ()) or ():
        if not isinstance(q, dict):
            continue
        try:
            out.append(
                CpuQuota(
                    str(q["cgroup"]),
                    int(q["quota_us"]),
                    int(q["period_us"]),
                    int(q["periods"]),
                    int(q["throttled_periods"]),
                    float(q["throttled_ms"]) / 1000,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue  # another writer's shape: not evidence
    return tuple(out)


def _late_start_us(info: dict[str, object]) -> float:
    """How far into the window the kernel tracks' recording began (the info slice's
    ``capture_late_us``; 0: at or before its start)."""
    late = info.get("capture_late_us", 0)
    return float(late) if isinstance(late, (int, float)) and late > 0 else 0.0


def _sched_incomplete(info: dict[str, object]) -> str:
    """Why the sched track misses off-CPU intervals, from the info slice ("": it does not):
    the overhead budget sampled its programs in time (its note says how much it recorded),
    threads it had no room to follow, its ring buffer was full, or records went over the
    capture's cap."""
    tracks = info.get("tracks")
    if not isinstance(tracks, list) or "sched" not in tracks:
        return ""
    why = []
    note = info.get("sched_note")
    if isinstance(note, str):  # the budget's sampling, threads the maps had no room for
        why += [n for n in note.split("; ") if n.startswith("sampled") or n.endswith("missing")]
    full = info.get("sched_lost_ring_buffer_full")
    if isinstance(full, int) and full:
        why.append(f"{full} off-CPU intervals lost to a full ring buffer")
    over = info.get("records_over_cap_dropped")
    if isinstance(over, int) and over:
        why.append(f"{over} records dropped over the capture's cap")
    return "; ".join(why)


def _memory_cgroups(facts: TraceFacts) -> tuple[MemoryCgroup, ...]:
    """The info slice's memory cgroups with a limit and what the window added to them."""
    out = []
    for m in facts.info.get("sched_memory_cgroups", ()) or ():
        if not isinstance(m, dict):
            continue
        try:
            out.append(
                MemoryCgroup(
                    str(m["cgroup"]),
                    int(m["limit_bytes"]),
                    int(m["limit_hits"]),
                    int(m["refaults"]),
                    int(m["major_faults"]),
                    float(m["stall_ms"]) / 1000,
                )
            )
        except (KeyError, TypeError, ValueError):
            continue  # another writer's shape: not evidence
    return tuple(out)


#: The fabric track's groups that are congestion signals, and those that are errors.
FABRIC_CONGESTION = ("congestion", "pause")
FABRIC_ERRORS = ("errors", "drops")


class _Totals:
    """The fabric track's points of some groups inside the window, summed over time ranges
    (each point is what its counters advanced over the interval starting there)."""

    def __init__(self, facts: TraceFacts, groups: Sequence[str], lo: float, hi: float) -> None:
        points = sorted((ts, n) for ts, _, g, n in facts.fabric if g in groups and lo <= ts <= hi)
        self.ts = [ts for ts, _ in points]
        self.sums = [0, *accumulate(n for _, n in points)]

    def between(self, lo: float, hi: float) -> int:
        """The total of the points from ``lo`` (inclusive) to ``hi`` (exclusive)."""
        return (
            self.sums[bisect.bisect_left(self.ts, hi)] - self.sums[bisect.bisect_left(self.ts, lo)]
        )


def _bytes_inside(
    bursts: Sequence[tuple[float, float, str, int, int, str, str]],
    spans: Sequence[tuple[float, float]],
) -> int:
    """Bytes of the net track's bursts (sent and received) inside ``spans`` (sorted,
    disjoint): a burst that crosses an edge counts for the share of its time inside."""
    total = 0.0
    for start, end, _kind, nbytes, _calls, _local, _peer in bursts:
        if end <= start:  # one call: inside or not
            total += nbytes if _cut(start, start + 1e-9, spans) else 0
            continue
        inside = sum(b - a for a, b in _cut(start, end, spans))
        total += nbytes * inside / (end - start)
    return round(total)


def _duplicate(e: NetInstant) -> bool:
    return e.kind == "packet_drop" and e.reason in DUPLICATE_REASONS


def _window(facts: TraceFacts, notes: list[str]) -> tuple[float, float]:
    if facts.window is not None:
        return facts.window
    times = [t for v in facts.ops.values() for t in (v[0], v[-1]) if v]
    notes.append("the file has no profiler span: its whole time is compared")
    return (min(times), max(times)) if times else (0.0, 0.0)


class _NcclNumbers:
    """NCCL's sequence numbers of the file's collectives, from NCCL's profiler plugin's rows:
    the plugin's collective of the same operation whose span (CPU arrival to completion)
    overlaps the collective's most. The plugin's span begins when NCCL is called and ends
    with the last GPU channel or proxy operation: it holds the call's CPU span and its
    kernel on the GPU alike."""

    #: Plugin collectives looked at before a collective's end, latest first (a rank has few
    #: in flight at once).
    LOOK_BACK = 16

    def __init__(self, profiled: Iterable[tuple[str, int, float, float]]) -> None:
        self._rows = sorted(profiled, key=lambda r: r[2])
        self._starts = [r[2] for r in self._rows]

    def seq(self, c: Collective) -> int | None:
        best: tuple[float, int] | None = None
        i = bisect.bisect_right(self._starts, c.end_us)
        for op, seq, start, end in self._rows[max(0, i - self.LOOK_BACK) : i]:
            overlap = min(end, c.end_us) - max(start, c.start_us)
            if op == c.op and overlap >= 0 and (best is None or overlap > best[0]):
                best = (overlap, seq)
        return best[1] if best is not None else None


def _collectives(facts: TraceFacts, lo: float, hi: float) -> tuple[list[Collective], str]:
    """The file's collectives of the best kind it has, in time order (module doc)."""

    def inside(items: Iterable[Collective]) -> list[Collective]:
        return sorted((c for c in items if lo <= c.start_us <= hi), key=lambda c: c.start_us)

    gpu = inside(c for c in facts.collectives if c.source == "gpu")
    if gpu:
        return gpu, ""
    spans = inside(c for c in facts.collectives if c.source != "gpu")
    if spans:
        # gloo executes collectives in the order they were asked for, one stream per process
        # group; the trace does not name the group: one ordered stream.
        for c in spans:
            c.group = c.source
        note = ""
        if any(c.source == "nccl" for c in spans):
            note = (
                "NCCL collectives without NCCL kernels on the GPU (CUDA activities not traced, "
                "or a communicator of one rank): compared by when the CPU enqueued them"
            )
        return spans, note
    enqueued = inside(facts.enqueues)
    if enqueued:
        for c in enqueued:
            c.group = "c10d"
        return enqueued, "collectives compared by when the CPU called them (c10d::*)"
    calls = inside(c for c in facts.nccl_calls if c.op not in ("groupstart", "groupend"))
    if calls:
        return calls, "collectives compared by bpfdyno's NCCL calls (the CPU side only)"
    return [], "no collectives in the file (a job of one process, or a trace without them)"


def _steps(facts: TraceFacts, lo: float, hi: float) -> list[tuple[float, float]]:
    """The steps inside the window: ``ProfilerStep#N`` spans, else the time between the
    ends of consecutive ``Optimizer.step`` calls (the first from the window's start)."""
    marked = sorted({(s, e) for _, s, e in facts.profiler_steps if e > lo and s < hi})
    if marked:
        return marked
    ends = sorted({e for _, e in facts.optimizer_steps if lo < e <= hi})
    out = []
    start = lo
    for end in ends:
        out.append((start, end))
        start = end
    return out


def _slices(facts: TraceFacts, pid: int, workers: set[int], lo: float, hi: float) -> list[_Slice]:
    """The off-CPU slices that count, clipped to the window, in diagnosis causes."""
    loaders = _union((s, e) for _tid, s, e in facts.dataloader if e > lo and s < hi)
    out: list[_Slice] = []
    for s in facts.offcpu:
        if s.end_us <= lo or s.start_us >= hi:
            continue
        if s.tid != pid and not (s.tid in workers and s.cause == "runnable"):
            continue
        start, end = max(s.start_us, lo), min(s.end_us, hi)
        # The threads that ran the collectives count only their waits for a CPU.
        cause = _cause(s) if s.tid == pid else OFFCPU_CAUSE.get(s.cause, "blocked")
        detail = _detail(s) if cause == OFFCPU_CAUSE.get(s.cause) else ""
        ran = (max(0, s.system_before_us), max(0, s.user_before_us)) if s.start_us >= lo else (0, 0)
        if cause != "cpu_wait" and s.tid == pid and loaders:
            # Blocked inside enumerate(DataLoader): waiting for the workers' next batch.
            for a, b in _cut(start, end, loaders):
                first = ran if a == start else (0, 0)
                out.append(_Slice(s.tid, a, b, "data_loader", detail, *first))
            for a, b in _cut_out(start, end, loaders):
                first = ran if a == start else (0, 0)
                out.append(_Slice(s.tid, a, b, cause, detail, *first))
        else:
            inside = s.syscall if s.cause == "runnable" and not s.after else ""
            out.append(_Slice(s.tid, start, end, cause, detail, *ran, inside))
    return out


#: Worker causes that count whoever woke the worker: a wait for a resource, not for the job.
RESOURCE_CAUSES = frozenset({"cpu_wait", "disk", "file_io", "sleep"})


def _worker_slices(
    facts: TraceFacts, pid: int, lo: float, hi: float
) -> tuple[list[_Slice], dict[int, int]]:
    """The child processes' off-CPU slices that count (module doc), clipped to the window,
    and each of their threads' process."""
    # One pass over every slice (a big trace has a million): the children's, in the window.
    theirs = [s for s in facts.offcpu if s.child_pid and s.end_us > lo and s.start_us < hi]
    if not theirs:
        return [], {}
    job = {pid} | {s.child_pid for s in theirs}
    # The workers: the children that woke the main thread (another child, a watchdog that
    # sleeps, is not what it waited for).
    handing = {
        s.woken_by_pid
        for s in facts.offcpu
        if s.tid == pid and s.woken_by_pid in job and s.woken_by_pid != pid
    }
    if handing:
        theirs = [s for s in theirs if s.child_pid in handing]
    out: list[_Slice] = []
    process: dict[int, int] = {}
    for s in theirs:
        cause = _cause(s)
        if cause not in RESOURCE_CAUSES and (not s.woken_by_pid or s.woken_by_pid in job):
            continue
        process[s.tid] = s.child_pid
        detail = _detail(s) if cause == OFFCPU_CAUSE.get(s.cause) else ""
        out.append(_Slice(s.tid, max(s.start_us, lo), min(s.end_us, hi), cause, detail))
    return out, process


def _workers(
    threads: _Threads,
    children: _Threads,
    worker_of: dict[int, int],
    pid: int,
    lo: float,
    hi: float,
) -> tuple[tuple[CauseTime, ...], tuple[int, ...]]:
    """What the workers waited for while the main thread waited for them in [lo, hi): time
    by cause (each at most the main thread's wait), and the workers' pids."""
    if not children.rows:
        return (), ()
    seconds: dict[str, float] = defaultdict(float)
    details: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    pids: set[int] = set()
    waited = 0.0
    for m, overlap in threads.overlapping(lo, hi):
        if m.tid != pid or m.cause != "data_loader":
            continue
        waited += overlap
        for w, inner in children.overlapping(max(m.start, lo), min(m.end, hi)):
            seconds[w.cause] += inner
            pids.add(worker_of[w.tid])
            if w.detail:
                details[w.cause][w.detail] += inner
    causes = tuple(
        CauseTime(
            cause,
            min(us, waited) / 1e6,
            max(details[cause], key=details[cause].__getitem__) if details.get(cause) else "",
        )
        for cause, us in sorted(seconds.items(), key=lambda kv: -kv[1])
    )
    return causes, tuple(sorted(pids))


#: The sched track's cause of the sleep a ``runnable: woken`` wait followed, when that wait
#: is counted with the sleep.
WOKEN_AFTER = {"disk/uninterruptible": "disk"}


def _cause(s: OffCpuSlice) -> str:
    """A slice's diagnosis cause. The wait for a CPU right after a disk read (the disk's
    completion woke the thread, then it waited its turn to run) is the disk's: the read
    would not have left the thread runnable behind others had it not slept on the disk, and
    on a loaded machine that wait is as long as the read itself (100-300 reads a step, each
    woken onto a busy CPU). Naming whoever ran meanwhile as holding the CPU would send an
    engineer after the wrong task; no wait is counted twice (the slices do not overlap)."""
    if s.cause == "runnable" and s.after in WOKEN_AFTER:
        return WOKEN_AFTER[s.after]
    return OFFCPU_CAUSE.get(s.cause, "blocked")


def _detail(s: OffCpuSlice) -> str:
    if s.cause == "runnable":
        return f"held by {s.held_by}" if s.held_by else ""
    return s.syscall


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _cut(lo: float, hi: float, union: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of [lo, hi) inside ``union`` (sorted, disjoint)."""
    i = max(0, bisect.bisect_right(union, (lo, math.inf)) - 1)
    out = []
    while i < len(union) and union[i][0] < hi:
        a, b = max(lo, union[i][0]), min(hi, union[i][1])
        if b > a:
            out.append((a, b))
        i += 1
    return out


def _cut_out(
    lo: float, hi: float, union: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """The parts of [lo, hi) outside ``union``."""
    out = []
    at = lo
    for a, b in _cut(lo, hi, union):
        if a > at:
            out.append((at, a))
        at = b
    if hi > at:
        out.append((at, hi))
    return out


def _gpu_busy(facts: TraceFacts, lo: float, hi: float) -> list[tuple[float, float]]:
    """The union of the GPUs' non-NCCL kernels in the window (any device)."""
    pairs: list[tuple[float, float]] = []
    for times in facts.gpu_busy.values():
        it = iter(times)
        pairs += [
            (max(s, lo), min(e, hi)) for s, e in zip(it, it, strict=True) if e > lo and s < hi
        ]
    return _union(pairs)


def _covered(union: Sequence[tuple[float, float]], lo: float, hi: float) -> float:
    return sum(b - a for a, b in _cut(lo, hi, union))


def _causes(
    threads: _Threads, busy: Sequence[tuple[float, float]], lo: float, hi: float
) -> tuple[tuple[CauseTime, ...], tuple[CauseTime, ...], list[Instance]]:
    """(time per cause, CPU holders, the longest slice of each cause) in [lo, hi)."""
    if hi <= lo:
        return (), (), []
    span = hi - lo
    seconds: dict[str, float] = defaultdict(float)
    syscalls: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    holders: dict[str, float] = defaultdict(float)
    longest: dict[str, tuple[float, _Slice]] = {}
    for s, overlap in threads.overlapping(lo, hi):
        seconds[s.cause] += overlap
        if s.cause == "cpu_wait":
            if s.detail:
                holders[s.detail.removeprefix("held by ")] += overlap
        elif s.detail:
            syscalls[s.cause][s.detail] += overlap
        if overlap > longest.get(s.cause, (0.0, s))[0]:
            longest[s.cause] = (overlap, s)
    gpu = _covered(busy, lo, hi)
    if gpu:
        seconds["gpu_compute"] = gpu
    causes = tuple(
        CauseTime(
            cause,
            min(us, span) / 1e6,
            max(syscalls[cause], key=syscalls[cause].__getitem__) if syscalls.get(cause) else "",
        )
        for cause, us in sorted(seconds.items(), key=lambda kv: -kv[1])
    )
    top = sorted(holders.items(), key=lambda kv: -kv[1])[:TOP_HOLDERS]
    worst = [
        Instance(
            s.cause,
            max(s.start, lo),
            0,  # set by _instance
            round(overlap * 1000),
            s.detail,
            s.tid,
        )
        for overlap, s in longest.values()
    ]
    return causes, tuple(CauseTime(h, us / 1e6) for h, us in top), worst


def _on_cpu(threads: _Threads, pid: int, lo: float, hi: float) -> float:
    """Seconds the main thread ran in [lo, hi): the time it was not off-CPU (the run-up's
    own work; interrupts taken meanwhile are in it, and are taken out by the caller)."""
    off = sum(overlap for _, overlap in threads.of(pid, lo, hi))
    return max(0.0, hi - lo - off) / 1e6


#: Off-CPU causes whose system call's time on a CPU before the sleep is theirs, and the
#: cause that time is kept under (`READ_CPU` in `bpfdyno.rpc.diagnosis`).
READ_CAUSES = tuple(READ_CPU)


def _reading(threads: _Threads, tid: int, lo: float, hi: float, ran: float) -> dict[str, float]:
    """Seconds of the main thread's time on a CPU in [lo, hi) (``ran``, seconds) that were
    the kernel's work in the file reads it slept in, per cause of `READ_CAUSES`.

    The sched track gives, before each slice, the CPU time the kernel charged the thread in
    user and in system mode since its previous one. Where it charges by the tick (4 ms at
    250 Hz, whole to the mode each tick finds), one short run reads 0 or a tick, and time
    the hypervisor stole from the CPU is charged to no one (its ticks fall short of the
    time on a CPU the slices show). So the reads' part is a share: of the run-up's ticks
    (its slices' that start in it), those of system time before a sleep on the disk (or in
    file I/O), and before a preemption inside a system call such a sleep was in (a long
    read preempted while filling the page cache); that share of ``ran``. No ticks: none."""
    ticks = 0
    system: dict[str, int] = defaultdict(int)
    slept_in: dict[str, str] = {}  # system call -> the cause of a read that slept in it
    preempted: dict[str, int] = defaultdict(int)  # system call -> system time before
    for s, _ in threads.of(tid, lo, hi):
        if s.start < lo:  # its run before was the run-up before's
            continue
        ticks += s.system_before + s.user_before
        if s.cause in READ_CAUSES:
            system[s.cause] += s.system_before
            slept_in.setdefault(s.detail, s.cause)
        elif s.inside:
            preempted[s.inside] += s.system_before
    for call, us in preempted.items():
        if call in slept_in:
            system[slept_in[call]] += us
    if ticks <= 0 or ran <= 0:
        return {}
    return {cause: ran * us / ticks for cause, us in system.items() if us > 0}


def _reclaiming(
    reclaims: Sequence[tuple[float, float]], threads: _Threads, tid: int, lo: float, hi: float
) -> float:
    """Seconds the main thread spent on a CPU in direct memory reclaim in [lo, hi): its
    reclaims' time there less its off-CPU slices inside them (a reclaim may wait for
    writeback or be preempted). ``reclaims``: its reclaims, sorted by start."""
    total = 0.0
    i = max(0, bisect.bisect_right(reclaims, (lo, math.inf)) - 1)
    while i < len(reclaims) and reclaims[i][0] < hi:
        a, b = max(reclaims[i][0], lo), min(reclaims[i][1], hi)
        if b > a:
            total += (b - a) - sum(overlap for _, overlap in threads.of(tid, a, b))
        i += 1
    return max(0.0, total) / 1e6


def _while_on_cpu(interrupts: float, on_cpu: float, run_up: float) -> float:
    """Of the interrupt time on the rank's CPUs in a run-up (seconds), the part that fell
    while its main thread was on a CPU: the part that delayed it. Interrupts taken while it
    slept or waited on a lock cost it nothing (it was not running). The track counts
    interrupt time per sampling interval, not per task: spread evenly over the run-up, the
    main thread's share is its time on a CPU (``on_cpu``, which includes the interrupts
    taken meanwhile) of the run-up's length."""
    if run_up <= 0:
        return 0.0
    return interrupts * min(1.0, on_cpu / run_up)


def _instance(w: Instance, facts: TraceFacts) -> Instance:
    return Instance(w.cause, w.ts_us, facts.abs_ns(w.ts_us), w.duration_ns, w.detail, w.tid)


def _mean_clock(facts: TraceFacts, lo: float, hi: float) -> float:
    values = [
        v
        for name, series in facts.gpu_counters.items()
        if "SM clock" in name
        for ts, v in series
        if lo <= ts <= hi
    ]
    return statistics.fmean(values) if values else 0.0


def _step_split(
    steps: list[tuple[float, float]],
    collectives: list[Collective],
    threads: _Threads,
    busy: Sequence[tuple[float, float]],
    pid: int,
    interrupts: _Totals | None = None,
    on_cpu: bool = True,
) -> StepSplit:
    """Where a step's time went: medians over the steps of the time in collectives, the main
    thread's time on a CPU (unless not ``on_cpu``: a sched track sampled in time does not
    measure it) and off it by cause, and the GPUs' busy time (`STEP_PARTS`); and the CPU
    time interrupts and softirqs took on the CPUs its threads ran on (``interrupts``, the
    fabric track's), at its rate over the steps' span for a step of the median length: the
    track samples it per interval (10 Hz), longer than a step, so per step it would come in
    lumps; and an average per step would be more than the median step when a stall made a
    few steps long (a storm that stalled a job for seconds: 158 % "of a step"). Whom it took
    the time from is not said: a rank that sleeps while its CPU takes a storm loses little,
    its threads and other tasks there lose the rest."""
    if not steps:
        return StepSplit()
    step = statistics.median(hi - lo for lo, hi in steps)
    span = steps[-1][1] - steps[0][0]
    # Over the steps' span, each interval's points once.
    storm = interrupts.between(steps[0][0], steps[-1][1]) / 1e9 * step / span if interrupts else 0

    spans = _union((c.start_us, c.end_us) for c in collectives)
    parts: dict[str, list[float]] = defaultdict(list)
    for lo, hi in steps:
        per: dict[str, float] = defaultdict(float)
        per["collectives"] = _covered(spans, lo, hi)
        off = 0.0
        for s, overlap in threads.overlapping(lo, hi):
            if s.tid == pid:
                per[s.cause] += overlap
                off += overlap
        if threads.rows and on_cpu:  # not when the sched track was sampled in time
            per["on_cpu"] = max(0.0, hi - lo - off)
        if busy:
            per["gpu_busy"] = _covered(busy, lo, hi)
        for key in set(parts) | set(per):
            parts[key].append(per.get(key, 0.0))
    n = len(steps)
    for values in parts.values():  # a part absent from the first steps: 0 there
        values[:0] = [0.0] * (n - len(values))
    medians = {k: statistics.median(v) / 1e6 for k, v in parts.items()}
    if storm > 0:
        medians["interrupts"] = storm
    return StepSplit(
        steps=n,
        step_seconds=step / 1e6,
        parts=tuple(
            CauseTime(k, v) for k, v in sorted(medians.items(), key=lambda kv: -kv[1]) if v > 0
        ),
    )
