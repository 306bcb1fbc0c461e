"""A traced process's capture as Chrome trace events on the Kineto file's own time base.

Every event goes under the traced process's pid, on rows (synthetic thread ids from
`TID_BASE` up, far above any real thread id) whose names say what they are:

* ``kernel net: TCP 10.0.0.1:43210 -> 10.0.0.2:29500 send`` (and ``recv``): one slice per
  burst of calls (category ``bpfdyno.net``; args: bytes, calls, thread, endpoints, socket);
* ``kernel net events``: instants for TCP state changes, retransmits, resets and drops,
  including the flight recorder's from before the request (a TCP socket's carry its
  round-trip time, retransmission timeout and retransmits so far);
* counters ``kernel net tcp: TCP 10.0.0.1:43210 -> 10.0.0.2:29500`` (``bpfdyno.net``): each
  TCP connection's samples over time (``srtt_ms``, ``rttvar_ms``, ``rto_ms``, ``cwnd``,
  ``inflight_bytes``, ``queued_bytes``, ``retransmits``), so a reader sees per-connection
  latency and throughput;
* ``kernel sched: thread <tid> (<name>)``: off-CPU slices of each traced thread
  (``bpfdyno.sched``): ``runnable: preempted`` (waiting for a CPU), ``blocked: <cause>``
  until the wakeup, then ``runnable: woken`` until it ran again (the run-queue wait); the
  runnable ones name the task that held the CPU just before (``held_by_pid``,
  ``held_by_tid``, ``held_by_comm``; absent when the CPU was idle), the blocked ones the
  task that woke them (``woken_by_pid``, ``woken_by_tid``; absent when not seen);
* ``kernel sched: child process <pid> thread <tid> (<name>)``: the same for the threads of
  the traced process's child processes (its DataLoader workers), with ``child_pid``;
* counters ``kernel sched cpu quota: <cgroup>`` (``bpfdyno.sched``): for each cgroup of the
  process with a CPU quota, what the window added so far to its ``periods``,
  ``throttled_periods`` and ``throttled_ms``; the totals are in the info slice
  (``sched_cpu_quota``); for each memory cgroup of the process with a limit, what the
  window added to its limit hits, refaults, major faults and memory stall time, in the info
  slice only (``sched_memory_cgroups``);
* ``NCCL: thread <tid>``: one slice per NCCL call with its arguments (``bpfdyno.nccl``), and
  ``ncclGroup`` slices from ncclGroupStart to the matching ncclGroupEnd;
* counters ``GPU <n> <counter> (<unit>)`` (``bpfdyno.gpu``) and ``kernel net bytes``;
* counters ``fabric rdma mlx5_0:1 bytes``, ``fabric nic eth2 drops``, ``fabric cpu interrupt
  time (ns)``... (``bpfdyno.fabric``): what each group of counters advanced over each
  sampling interval, written at the interval's start; and instants on ``fabric events`` for
  links that went down or came up;
* ``kernel tracks``: one slice over the window named ``bpfdyno kernel tracks`` whose args
  say what was recorded, what was lost or coalesced, and how the clocks were aligned.

Slices on one row never overlap partially (Perfetto and chrome://tracing need proper
nesting): `assign_lanes` moves a slice that would to a second row of the same name.

Time: CLOCK_MONOTONIC ns + the capture's wall-clock offset - ``baseTimeNanoseconds``, written
as microseconds with 3 decimals (integer arithmetic, so no rounding error), as Kineto does.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from bpfdyno.core.events import KernelEvent
from bpfdyno.rpc.kernel_tracks import (  # the categories readers match on
    CAT_FABRIC,
    CAT_GPU,
    CAT_INFO,
    CAT_NCCL,
    CAT_NET,
    CAT_SCHED,
)
from bpfdyno.tracing.capture import causes
from bpfdyno.tracing.capture.nccl import DATATYPE_BYTES, DATATYPES, REDOPS, RESULTS
from bpfdyno.tracing.capture.records import (
    ALL_TRACKS,
    CpuQuotaSample,
    FabricDelta,
    FabricEvent,
    GpuSample,
    MemoryCgroupSample,
    NcclCall,
    NetBurst,
    NetEvent,
    OffCpu,
    ProcessCapture,
    Reclaim,
    TcpSample,
    Track,
)

#: First synthetic thread id of the kernel tracks' rows.
TID_BASE = 1_000_000_000

#: Name of the slice over the window that describes the merged tracks.
INFO_NAME = "bpfdyno kernel tracks"

#: GPU counter key -> (label, unit) in the counter's name.
GPU_COUNTERS = {
    "utilization_percent": ("utilization", "%"),
    "memory_used_mib": ("memory used", "MiB"),
    "power_watts": ("power", "W"),
    "sm_clock_mhz": ("SM clock", "MHz"),
    "sm_active_percent": ("SM active", "%"),
    "sm_occupancy_percent": ("SM occupancy", "%"),
    "tensor_active_percent": ("tensor active", "%"),
    "dram_bandwidth_percent": ("DRAM bandwidth", "%"),
    "gpm_paused": ("GPM paused", "1 = for a trace or dcgm-pause"),
}


@dataclass(frozen=True, slots=True)
class Window:
    """The trace's window in ns relative to ``baseTimeNanoseconds``, and where it came from."""

    start_ns: int
    end_ns: int
    source: str  # "kineto" (the profiler's own span) or "capture" (delivery to file)


@dataclass(slots=True)
class BuiltTracks:
    """The events to add to the trace file, and what they hold."""

    events: list[bytes]
    counts: dict[Track, int]
    info: dict[str, Any]


def format_us(rel_ns: int) -> bytes:
    """Nanoseconds as Kineto's microseconds with 3 decimals, e.g. 1234567 -> b"1234.567"."""
    sign = b"-" if rel_ns < 0 else b""
    q, r = divmod(abs(rel_ns), 1000)
    return sign + b"%d.%03d" % (q, r)


def assign_lanes(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """A lane per interval such that, within a lane, intervals nest or follow each other.

    Args:
        intervals: (start, end) pairs, sorted by start then by end descending.

    Returns:
        The lane (0, 1, ...) of each interval, in the same order.
    """
    lanes: list[list[int]] = []  # per lane: the ends of the open (enclosing) intervals
    out = []
    for start, end in intervals:
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                out.append(i)
                break
        else:
            lanes.append([end])
            out.append(len(lanes) - 1)
    return out


@dataclass(slots=True)
class _Slice:
    start_ns: int  # relative to the base time
    end_ns: int
    name: str
    cat: str
    args: dict[str, Any]


#: Where events go, one serialized JSON object per call (the merge writes them to the file).
Sink = Callable[[bytes], None]


@dataclass(slots=True)
class _Writer:
    """Writes one process's rows (synthetic threads) and events to a sink as they come."""

    pid: int
    sink: Sink
    next_tid: int = TID_BASE
    rows: dict[str, int] = field(default_factory=dict)

    def row(self, name: str) -> int:
        tid = self.rows.get(name)
        if tid is None:
            self.next_tid += 1
            tid = self.rows[name] = self.next_tid
            meta_args = orjson.dumps({"name": name})
            self.sink(
                b'{"ph":"M","name":"thread_name","pid":%d,"tid":%d,"args":%s}'
                % (self.pid, tid, meta_args)
            )
            self.sink(
                b'{"ph":"M","name":"thread_sort_index","pid":%d,"tid":%d,"args":{"sort_index":%d}}'
                % (self.pid, tid, tid)
            )
        return tid

    def slices(self, row_name: str, slices: list[_Slice]) -> int:
        """Write slices on a row (and its overflow lanes); returns how many."""
        slices.sort(key=lambda s: (s.start_ns, -s.end_ns))
        lanes = assign_lanes([(s.start_ns, s.end_ns) for s in slices])
        for s, lane in zip(slices, lanes, strict=True):
            tid = self.row(row_name if lane == 0 else f"{row_name} ({lane + 1})")
            self.sink(
                b'{"ph":"X","cat":%s,"name":%s,"pid":%d,"tid":%d,"ts":%s,"dur":%s,"args":%s}'
                % (
                    orjson.dumps(s.cat),
                    orjson.dumps(s.name),
                    self.pid,
                    tid,
                    format_us(s.start_ns),
                    format_us(max(0, s.end_ns - s.start_ns)),
                    orjson.dumps(s.args),
                )
            )
        return len(slices)

    def instant(self, row_name: str, ts_ns: int, name: str, cat: str, args: dict[str, Any]) -> None:
        self.sink(
            b'{"ph":"i","s":"t","cat":%s,"name":%s,"pid":%d,"tid":%d,"ts":%s,"args":%s}'
            % (
                orjson.dumps(cat),
                orjson.dumps(name),
                self.pid,
                self.row(row_name),
                format_us(ts_ns),
                orjson.dumps(args),
            )
        )

    def counter(self, name: str, ts_ns: int, cat: str, values: dict[str, float]) -> None:
        self.sink(
            b'{"ph":"C","cat":%s,"name":%s,"pid":%d,"ts":%s,"args":%s}'
            % (
                orjson.dumps(cat),
                orjson.dumps(name),
                self.pid,
                format_us(ts_ns),
                orjson.dumps(values),
            )
        )


def build_tracks(
    capture: ProcessCapture,
    base_ns: int,
    window: Window,
    tracks: Iterable[Track],
    recorded: Sequence[KernelEvent] = (),
) -> BuiltTracks:
    """`write_tracks` into a list (for small captures and tests)."""
    events: list[bytes] = []
    counts, info = write_tracks(capture, base_ns, window, tracks, events.append, recorded)
    return BuiltTracks(events, counts, info)


def write_tracks(
    capture: ProcessCapture,
    base_ns: int,
    window: Window,
    tracks: Iterable[Track],
    sink: Sink,
    recorded: Sequence[KernelEvent] = (),
) -> tuple[dict[Track, int], dict[str, Any]]:
    """Write the trace events of ``capture``'s ``tracks`` inside ``window`` to ``sink``.

    Row by row, so only one row's slices are in memory at a time besides the records.

    Args:
        capture: what was recorded for the process.
        base_ns: the file's ``baseTimeNanoseconds``.
        window: the trace window (relative ns); slices overlapping it are kept (off-CPU
            slices clipped to it), GPU samples inside it plus one on each side.
        tracks: the tracks to write (those requested and recorded).
        sink: receives each event.
        recorded: the flight recorder's events of this process from the pre-window (wall ns).

    Returns:
        Events written per track (metadata not counted), and the info slice's args.
    """
    shift = capture.offset_ns - base_ns  # monotonic ns + shift = relative ns
    w = _Writer(capture.pid, sink)
    wanted = set(tracks)
    counts: dict[Track, int] = {}
    by_kind: dict[type, list[Any]] = defaultdict(list)
    for r in capture.records:
        by_kind[type(r)].append(r)
    if Track.NET in wanted:
        counts[Track.NET] = _net(w, by_kind[NetBurst], by_kind[NetEvent], shift, window)
        counts[Track.NET] += _tcp(w, by_kind[TcpSample], shift, window)
        counts[Track.NET] += _pre_window(w, recorded, base_ns, window)
    if Track.SCHED in wanted:
        counts[Track.SCHED] = _sched(w, by_kind[OffCpu], by_kind[Reclaim], shift, window)
        n, quotas = _quota(w, by_kind[CpuQuotaSample], shift, window)
        counts[Track.SCHED] += n
        memory = _memory(by_kind[MemoryCgroupSample], shift, window)
    if Track.NCCL in wanted:
        counts[Track.NCCL] = _nccl(w, by_kind[NcclCall], shift, window)
    if Track.GPU in wanted:
        counts[Track.GPU] = _gpu(w, by_kind[GpuSample], shift, window)
    if Track.FABRIC in wanted:
        counts[Track.FABRIC] = _fabric(w, by_kind[FabricDelta], by_kind[FabricEvent], shift, window)
    info = _info(capture, window, counts, base_ns)
    if Track.SCHED in wanted and quotas:
        info["sched_cpu_quota"] = quotas
    if Track.SCHED in wanted and memory:
        info["sched_memory_cgroups"] = memory
    w.slices(
        "kernel tracks",
        [_Slice(window.start_ns, window.end_ns, INFO_NAME, CAT_INFO, info)],
    )
    return counts, info


def _overlaps(start: int, end: int, window: Window) -> bool:
    return end >= window.start_ns and start <= window.end_ns


#: The cumulative byte counter gets at most one point per this many ns (and the last one).
COUNTER_RESOLUTION_NS = 1_000_000


def _net(
    w: _Writer, bursts: list[NetBurst], events: list[NetEvent], shift: int, window: Window
) -> int:
    rows: dict[str, list[NetBurst]] = defaultdict(list)
    kept: list[NetBurst] = []
    for b in bursts:
        if _overlaps(b.start_ns + shift, b.end_ns + shift, window):
            rows[f"kernel net: {b.socket.label()} {'recv' if b.rx else 'send'}"].append(b)
            kept.append(b)
    n = 0
    for name in sorted(rows):
        n += w.slices(name, [_burst_slice(b, shift) for b in rows.pop(name)])
    # A cumulative byte counter per direction, so Perfetto draws the traffic over time.
    sent = received = 0
    last = None
    kept.sort(key=lambda b: b.end_ns)
    for i, b in enumerate(kept):
        if b.rx:
            received += b.bytes
        else:
            sent += b.bytes
        end = b.end_ns + shift
        final = i == len(kept) - 1
        if final or last is None or kept[i + 1].end_ns + shift - last >= COUNTER_RESOLUTION_NS:
            w.counter("kernel net bytes", end, CAT_NET, {"sent": sent, "received": received})
            last = end
    for e in events:
        ts = e.ts_ns + shift
        if ts > window.end_ns:
            continue
        args: dict[str, Any] = {
            "protocol": e.socket.protocol,
            "local": e.socket.local,
            "peer": e.socket.peer,
            "socket": f"{e.sk:#x}",
            **e.attrs,
        }
        if e.tid:
            args["tid"] = e.tid
        name = e.kind
        if e.kind == "tcp_state":
            name = f"tcp {e.attrs.get('oldstate', '?')} -> {e.attrs.get('state', '?')}"
        w.instant("kernel net events", ts, name, CAT_NET, args)
        n += 1
    return n


#: The prefix of each TCP connection's counter.
TCP_COUNTER_PREFIX = "kernel net tcp: "


def tcp_counter_values(s: TcpSample) -> dict[str, float]:
    """A TCP sample as the args of its counter point (times in ms, 3 decimals)."""
    return {
        "srtt_ms": s.srtt_us / 1000,
        "rttvar_ms": s.rttvar_us / 1000,
        "rto_ms": s.rto_us / 1000,
        "cwnd": s.snd_cwnd,
        "inflight_bytes": s.inflight_bytes,
        "queued_bytes": s.queued_bytes,
        "retransmits": s.total_retrans,
    }


def _tcp(w: _Writer, samples: list[TcpSample], shift: int, window: Window) -> int:
    """One counter per TCP connection: its samples inside the window, and the last one
    before it (a counter holds its value until the next point)."""
    by_conn: dict[str, list[TcpSample]] = defaultdict(list)
    for s in samples:
        if s.ts_ns + shift <= window.end_ns:
            by_conn[TCP_COUNTER_PREFIX + s.socket.label()].append(s)
    n = 0
    for name in sorted(by_conn):
        series = sorted(by_conn[name], key=lambda s: s.ts_ns)
        before = [s for s in series if s.ts_ns + shift < window.start_ns]
        inside = [s for s in series if s.ts_ns + shift >= window.start_ns]
        for s in before[-1:] + inside:
            w.counter(name, max(s.ts_ns + shift, window.start_ns), CAT_NET, tcp_counter_values(s))
            n += 1
    return n


def _burst_slice(b: NetBurst, shift: int) -> _Slice:
    direction = "recv" if b.rx else "send"
    args = {
        "bytes": b.bytes,
        "calls": b.calls,
        "tid": b.tid,
        "protocol": b.socket.protocol,
        "local": b.socket.local,
        "peer": b.socket.peer,
        "socket": f"{b.sk:#x}",
    }
    return _Slice(b.start_ns + shift, b.end_ns + shift, direction, CAT_NET, args)


def _pre_window(w: _Writer, recorded: Sequence[KernelEvent], base_ns: int, window: Window) -> int:
    n = 0
    for e in recorded:
        ts = e.ts_ns - base_ns
        if ts > window.end_ns:
            continue
        args: dict[str, Any] = {"source": "flight recorder (before the request)", **e.attrs}
        if e.tid:
            args["tid"] = e.tid
        w.instant("kernel net events", ts, e.kind, CAT_NET, args)
        n += 1
    return n


def _sched(
    w: _Writer, intervals: list[OffCpu], reclaims: list[Reclaim], shift: int, window: Window
) -> int:
    """Each thread's row: its off-CPU intervals, and its reclaims around those inside them."""
    rows: dict[str, list[_Slice]] = defaultdict(list)
    ran = _ran_before(intervals)
    for iv in intervals:
        if _overlaps(iv.off_ns + shift, iv.on_ns + shift, window):
            slices = _offcpu_slices(iv, shift, window)
            if slices and id(iv) in ran:
                slices[0].args.update(ran[id(iv)])
            rows[_thread_row(iv.pid, iv.tid, iv.comm)].extend(slices)
    for r in reclaims:
        lo, hi = r.start_ns + shift, r.end_ns + shift
        if _overlaps(lo, hi, window):
            args: dict[str, Any] = {"tid": r.tid, "cpu": r.cpu, "cause": causes.RECLAIM}
            if r.pid:
                args["child_pid"] = r.pid
            if lo < window.start_ns or hi > window.end_ns:
                args["clipped_to_window"] = True
            clipped = max(lo, window.start_ns), min(hi, window.end_ns)
            rows[_thread_row(r.pid, r.tid, r.comm)].append(
                _Slice(*clipped, "memory reclaim", CAT_SCHED, args)
            )
    n = 0
    for name in sorted(rows):
        n += w.slices(name, rows.pop(name))
    return n


def _ran_before(intervals: list[OffCpu]) -> dict[int, dict[str, int]]:
    """Per interval (by ``id``), what its thread ran since its previous recorded interval:
    ``user_us`` and ``system_us``, the differences of the kernel's CPU time of the thread
    between the two switch-outs (nothing accrues while it is off a CPU, so that is its time
    on a CPU in between, in each mode, whatever was not recorded there). The first interval
    of each thread, and those without the times, have none."""
    by_tid: dict[int, list[OffCpu]] = defaultdict(list)
    for iv in intervals:
        if iv.user_ns >= 0 and iv.system_ns >= 0:
            by_tid[iv.tid].append(iv)
    out: dict[int, dict[str, int]] = {}
    for mine in by_tid.values():
        mine.sort(key=lambda iv: iv.off_ns)
        for prev, iv in itertools.pairwise(mine):
            user, system = iv.user_ns - prev.user_ns, iv.system_ns - prev.system_ns
            if user >= 0 and system >= 0:  # a reused thread id starts again from 0
                out[id(iv)] = {"user_us": user // 1000, "system_us": system // 1000}
    return out


def _thread_row(pid: int, tid: int, comm: str) -> str:
    child = f"child process {pid} " if pid else ""
    return f"kernel sched: {child}thread {tid} ({comm})"


#: The prefix of each quota cgroup's counter.
QUOTA_COUNTER_PREFIX = "kernel sched cpu quota: "


def _quota(
    w: _Writer, samples: list[CpuQuotaSample], shift: int, window: Window
) -> tuple[int, list[dict[str, Any]]]:
    """Per cgroup with a quota: a counter of what the window added to its throttling, from
    the last sample at or before the window's start (or the first one) to the first at or
    after its end (or the last one); and those totals for the info slice."""
    by_cgroup: dict[str, list[CpuQuotaSample]] = defaultdict(list)
    for s in samples:
        by_cgroup[s.cgroup].append(s)
    n = 0
    totals: list[dict[str, Any]] = []
    for cgroup in sorted(by_cgroup):
        series = sorted(by_cgroup[cgroup], key=lambda s: s.ts_ns)
        start = [i for i, s in enumerate(series) if s.ts_ns + shift <= window.start_ns]
        end = [i for i, s in enumerate(series) if s.ts_ns + shift >= window.end_ns]
        lo = start[-1] if start else 0
        hi = end[0] if end else len(series) - 1
        base = series[lo]
        for s in series[lo : hi + 1]:
            ts = min(max(s.ts_ns + shift, window.start_ns), window.end_ns)
            w.counter(QUOTA_COUNTER_PREFIX + cgroup, ts, CAT_SCHED, _quota_delta(base, s))
            n += 1
        last = series[hi]
        totals.append(
            {
                "cgroup": cgroup,
                "quota_us": last.quota_us,
                "period_us": last.period_us,
                **_quota_delta(base, last),
            }
        )
    return n, totals


def _memory(samples: list[MemoryCgroupSample], shift: int, window: Window) -> list[dict[str, Any]]:
    """Per memory cgroup with a limit: what the window added to its reclaim counters, from
    the last sample at or before the window's start (or the first one) to the first at or
    after its end (or the last one), for the info slice."""
    by_cgroup: dict[str, list[MemoryCgroupSample]] = defaultdict(list)
    for s in samples:
        by_cgroup[s.cgroup].append(s)
    out: list[dict[str, Any]] = []
    for cgroup in sorted(by_cgroup):
        series = sorted(by_cgroup[cgroup], key=lambda s: s.ts_ns)
        before = [s for s in series if s.ts_ns + shift <= window.start_ns]
        after = [s for s in series if s.ts_ns + shift >= window.end_ns]
        base = before[-1] if before else series[0]
        last = after[0] if after else series[-1]
        out.append(
            {
                "cgroup": cgroup,
                "limit_bytes": last.limit_bytes,
                "limit_hits": max(0, last.limit_hits - base.limit_hits),
                "refaults": max(0, last.refaults - base.refaults),
                "major_faults": max(0, last.major_faults - base.major_faults),
                "stall_ms": round(max(0, last.stall_ns - base.stall_ns) / 1e6, 3),
            }
        )
    return out


def _quota_delta(base: CpuQuotaSample, s: CpuQuotaSample) -> dict[str, Any]:
    return {
        "periods": s.periods - base.periods,
        "throttled_periods": s.throttled_periods - base.throttled_periods,
        "throttled_ms": round((s.throttled_ns - base.throttled_ns) / 1e6, 3),
    }


def _offcpu_slices(iv: OffCpu, shift: int, window: Window) -> list[_Slice]:
    """One slice for a preempted interval; "blocked" then "runnable: woken" otherwise."""
    off, on = iv.off_ns + shift, iv.on_ns + shift
    base: dict[str, Any] = {"tid": iv.tid, "cpu": iv.cpu, "state": causes.state_letter(iv.state)}
    if iv.pid:
        base["child_pid"] = iv.pid  # a child process of the traced one (a DataLoader worker)
    if off < window.start_ns or on > window.end_ns:
        base["clipped_to_window"] = True
    lo, hi = max(off, window.start_ns), min(on, window.end_ns)
    held: dict[str, Any] = {}
    if iv.held_tid:
        held = {
            "held_by_pid": iv.held_pid,
            "held_by_tid": iv.held_tid,
            "held_by_comm": iv.held_comm,
        }
    if iv.runnable:
        args = {**base, "cause": causes.RUNNABLE, **held}
        if inside := causes.syscall_name(iv.syscall):
            args["syscall"] = inside  # preempted inside it (a long read, a big copy)
        return [_Slice(lo, hi, "runnable: preempted", CAT_SCHED, args)]
    cause = causes.cause(iv.state, iv.syscall)
    syscall = causes.syscall_name(iv.syscall)
    label = f"blocked: {cause}" + (f" ({syscall})" if syscall else "")
    out = []
    wake = iv.wake_ns + shift if iv.wake_ns else on
    b_lo, b_hi = lo, min(max(wake, lo), hi)
    blocked = {**base, "cause": cause, "syscall": syscall}
    if iv.waker_tid:
        blocked.update(woken_by_pid=iv.waker_pid, woken_by_tid=iv.waker_tid)
    if b_hi > b_lo or wake == off:
        out.append(_Slice(b_lo, b_hi, label, CAT_SCHED, blocked))
    if iv.wake_ns and hi > b_hi:
        after = {**base, "cause": causes.RUNNABLE, "after": cause, **held}
        out.append(_Slice(b_hi, hi, "runnable: woken", CAT_SCHED, after))
    return out


def _nccl(w: _Writer, calls: list[NcclCall], shift: int, window: Window) -> int:
    rows: dict[str, list[_Slice]] = defaultdict(list)
    by_tid: dict[int, list[NcclCall]] = defaultdict(list)
    for c in calls:
        by_tid[c.tid].append(c)
    for tid, mine in by_tid.items():
        mine.sort(key=lambda c: c.start_ns)
        row = f"NCCL: thread {tid}"
        open_groups: list[NcclCall] = []
        for c in mine:
            start, end = c.start_ns + shift, c.end_ns + shift
            if c.function == "ncclGroupStart":
                open_groups.append(c)
            elif c.function == "ncclGroupEnd" and open_groups:
                g = open_groups.pop()
                g_start = g.start_ns + shift
                if _overlaps(g_start, end, window):
                    rows[row].append(
                        _Slice(g_start, end, "ncclGroup", CAT_NCCL, {"depth": len(open_groups)})
                    )
            if not _overlaps(start, end, window):
                continue
            rows[row].append(_Slice(start, end, c.function, CAT_NCCL, nccl_args(c)))
    n = 0
    for name in sorted(rows):
        n += w.slices(name, rows[name])
    return n


def nccl_args(c: NcclCall) -> dict[str, Any]:
    """The args of an NCCL call's slice: its arguments, named as in nccl.h."""
    args: dict[str, Any] = {"result": RESULTS.get(c.ret, str(c.ret))}
    if c.function in ("ncclGroupStart", "ncclGroupEnd"):
        return args
    args["count"] = c.count
    args["datatype"] = DATATYPES.get(c.datatype, str(c.datatype))
    size = DATATYPE_BYTES.get(c.datatype)
    if size is not None:
        args["bytes"] = c.count * size
    if c.op >= 0:
        args["op"] = REDOPS.get(c.op, f"user-defined {c.op}")
    if c.peer >= 0:
        args["peer" if c.function in ("ncclSend", "ncclRecv") else "root"] = c.peer
    args["comm"] = f"{c.comm:#x}"
    args["stream"] = f"{c.stream:#x}"
    if c.sendbuff:
        args["sendbuff"] = f"{c.sendbuff:#x}"
    if c.recvbuff:
        args["recvbuff"] = f"{c.recvbuff:#x}"
    args["tid"] = c.tid
    return args


def _gpu(w: _Writer, samples: list[GpuSample], shift: int, window: Window) -> int:
    by_gpu: dict[int, list[tuple[int, GpuSample]]] = defaultdict(list)
    for s in samples:
        by_gpu[s.gpu].append((s.ts_ns + shift, s))
    n = 0
    for gpu in sorted(by_gpu):
        series = sorted(by_gpu[gpu], key=lambda x: x[0])
        inside = [i for i, (ts, _) in enumerate(series) if window.start_ns <= ts <= window.end_ns]
        if inside:
            lo, hi = max(inside[0] - 1, 0), min(inside[-1] + 1, len(series) - 1)
        else:  # a window shorter than the sampling period: the samples around it
            before = [i for i, (ts, _) in enumerate(series) if ts < window.start_ns]
            lo = before[-1] if before else 0
            hi = min(lo + 1, len(series) - 1)
        for ts, s in series[lo : hi + 1]:
            for key, value in s.values.items():
                label = GPU_COUNTERS.get(key)
                if label is None or math.isnan(value):
                    continue
                w.counter(f"GPU {gpu} {label[0]} ({label[1]})", ts, CAT_GPU, {"value": value})
                n += 1
    return n


def fabric_counter_name(device: str, group: str) -> str:
    """The counter of a fabric device's group: ``fabric rdma mlx5_0:1 bytes``,
    ``fabric cpu interrupt time (ns)``."""
    return f"fabric {device} {group}" + (" (ns)" if group == "interrupt time" else "")


def _fabric(
    w: _Writer, deltas: list[FabricDelta], events: list[FabricEvent], shift: int, window: Window
) -> int:
    """Each (device, group) as a counter: at each interval's start, what the interval added;
    after the last interval, a point of zeros (a counter keeps its value until the next one)."""
    series: dict[tuple[str, str], list[FabricDelta]] = defaultdict(list)
    for d in deltas:
        if _overlaps(d.start_ns + shift, d.end_ns + shift, window):
            series[(d.device, d.group)].append(d)
    n = 0
    for (device, group), points in sorted(series.items()):
        points.sort(key=lambda d: d.start_ns)
        name = fabric_counter_name(device, group)
        for d in points:
            w.counter(name, d.start_ns + shift, CAT_FABRIC, dict(d.values))
            n += 1
        last = points[-1]
        w.counter(name, last.end_ns + shift, CAT_FABRIC, dict.fromkeys(last.values, 0))
    for e in sorted(events, key=lambda e: e.ts_ns):
        ts = e.ts_ns + shift
        if window.start_ns <= ts <= window.end_ns:
            w.instant("fabric events", ts, e.kind.replace("_", " "), CAT_FABRIC, dict(e.attrs))
            n += 1
    return n


#: How far into Kineto's window the recording may begin before the tracks say they miss its
#: start (the clock offset between CLOCK_MONOTONIC and the wall clock is measured to µs).
LATE_START_TOLERANCE_NS = 1_000_000


def late_start_ns(capture: ProcessCapture, base_ns: int, window: Window) -> int:
    """How long after the start of Kineto's window the recording began (0: before it, or
    the window is the capture's own). A config handed out before the probes were attached
    (a start too close to wait for them) leaves the window's first part without tracks."""
    if window.source != "kineto":
        return 0
    late = capture.begin_ns + capture.offset_ns - base_ns - window.start_ns
    return late if late > LATE_START_TOLERANCE_NS else 0


def _info(
    capture: ProcessCapture, window: Window, counts: dict[Track, int], base_ns: int
) -> dict[str, Any]:
    """What the reader needs to trust the tracks: sources, limits, losses, clock alignment."""
    info: dict[str, Any] = {
        "tracks": [t.value for t in ALL_TRACKS if t in counts],
        "requested": list(capture.request.names()),
        "window": window.source,
        "events": {t.value: counts[t] for t in ALL_TRACKS if t in counts},
        "clock": (
            "CLOCK_MONOTONIC + offset to the wall clock measured at the start and the end of "
            "the capture (mean), minus baseTimeNanoseconds"
        ),
        "clock_offset_ns": capture.offset_ns,
        "clock_drift_ns": capture.drift_ns,
        "capture_start_ts": format_us(capture.begin_ns + capture.offset_ns - base_ns).decode(),
        "records_over_cap_dropped": capture.dropped_over_cap,
        "records_cap": capture.cap,
    }
    late = late_start_ns(capture, base_ns, window)
    if late:
        # Readers must not take the uncovered part for time without off-CPU slices (running).
        info["capture_late_us"] = round(late / 1000, 3)
    if capture.distributed:
        info["distributed_from_environment"] = capture.distributed
    if capture.host_pid:
        # The sched track's thread ids and child pids are the host's: the reader matches
        # the main thread by this.
        info["host_pid"] = capture.host_pid
    if Track.NET in counts:
        gap, most = (
            capture.settings.get("net_coalesce_gap_us", 0),
            capture.settings.get("net_coalesce_max_us", 0),
        )
        info["net_coalescing"] = (
            f"one thread's calls on one socket in one direction, each within {gap} us of the "
            f"previous one and spanning at most {most} us, are one slice (calls = how many)"
            if gap
            else "none: one slice per call"
        )
        info["pre_window_s"] = capture.request.pre_window_s
        sample = capture.settings.get("net_tcp_sample_us", 0)
        info["net_tcp_sampling"] = (
            f"each TCP connection's round-trip time, window and bytes in flight at its socket "
            f"calls, at most every {sample} us (counters 'kernel net tcp: ...')"
            if sample
            else "none: only retransmits, resets and state changes carry a sample"
        )
    if Track.SCHED in counts:
        info["sched_min_offcpu_us"] = capture.settings.get("sched_min_offcpu_us", 0)
    for track, st in capture.stats.items():
        key = track.value
        if st.lost_kernel:
            info[f"{key}_lost_ring_buffer_full"] = st.lost_kernel
        if track is Track.NET and st.calls:
            info["net_calls"] = st.calls
        if track is Track.SCHED and st.short_offcpu:
            info["sched_short_offcpu_not_written"] = st.short_offcpu
            info["sched_short_offcpu_total_us"] = round(st.short_offcpu_ns / 1000, 3)
        if st.note:
            info[f"{key}_note"] = st.note
        for name, value in st.info.items():
            info[f"{key}_{name}"] = value
    return info
