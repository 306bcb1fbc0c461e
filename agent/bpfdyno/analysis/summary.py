"""What a merged trace file says about its process, in numbers: `summarize_file`.

Used by ``bpfdyno trace-summary FILE...`` and the gRPC ``GetTraceSummary``: per traced
process, the trace window, the time in PyTorch CPU ops, its network traffic and TCP trouble,
the off-CPU time of its threads by cause, and its NCCL calls — so the ranks of a job can be
compared side by side and the one that was starved, blocked or retransmitting stands out.

The file is read once, as a stream (`bpfdyno.analysis.trace_facts`), never loaded whole:
memory stays bounded however large the trace. Only what is in the file is counted — the
kernel tracks' events (categories ``bpfdyno.*``, see `bpfdyno.tracing.capture.tracks`) and
Kineto's own ``cpu_op`` events — and only inside the window (the profiler's span): slices
that cross its edges count for their part inside it. The same pass gives the process's
evidence for the job's verdict (`bpfdyno.analysis.evidence`): which collectives it joined
when, and what the kernel saw it do before each.
"""

from __future__ import annotations

import operator
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import fields, replace
from types import SimpleNamespace
from typing import Any

from bpfdyno.analysis.evidence import build_evidence
from bpfdyno.analysis.trace_facts import TraceFacts, read_facts
from bpfdyno.analysis.tracefile import DEFAULT_LIMITS, ReadLimits, TraceFileError, open_regular
from bpfdyno.rpc.traces import ProcessSummary


def summarize_file(
    path: str, limits: ReadLimits = DEFAULT_LIMITS, name: str = ""
) -> ProcessSummary:
    """Summarise one trace file, with its evidence; errors go into ``error``.

    The file is opened without following a link and only if it is a regular file
    (`bpfdyno.analysis.tracefile.open_regular`); the caller chooses whose rights it is read
    with (the agent reads a user's file as that user).

    Args:
        path: where to read it.
        limits: bounds on reading it.
        name: the file as its user knows it, in the summary and its errors (default:
            ``path``; the agent reads a containerized trainer's file through
            ``/proc/PID/root``).
    """
    name = name or path
    try:
        with open_regular(path, name) as f:
            facts = read_facts(f, name, limits)
    except TraceFileError as e:
        return ProcessSummary(name, error=str(e))
    return replace(summarize_facts(facts), evidence=build_evidence(facts))


def union_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length in seconds of the union of (start_us, end_us) intervals."""
    total = 0.0
    run: list[float] | None = None  # [start, end] of the run being merged
    for start, end in sorted(intervals):
        if run is None or start > run[1]:
            if run is not None:
                total += run[1] - run[0]
            run = [start, end]
        elif end > run[1]:
            run[1] = end
    if run is not None:
        total += run[1] - run[0]
    return total / 1e6


def _pairs(times: array[float], lo: float, hi: float) -> list[tuple[float, float]]:
    """The (start, end) pairs of ``times`` clipped to [lo, hi] (those overlapping it)."""
    starts, ends = times[0::2], times[1::2]
    if starts and min(starts) >= lo and max(ends) <= hi and all(map(operator.le, starts, ends)):
        # All inside (the usual case: a thread's ops in its trace's window): nothing to clip
        # or leave out, and no Python step per pair.
        return list(zip(starts, ends, strict=True))
    return [
        (max(s, lo), min(e, hi)) for s, e in zip(starts, ends, strict=True) if e >= lo and s <= hi
    ]


def summarize_facts(facts: TraceFacts) -> ProcessSummary:
    """The numbers of one trace file (see the module doc), every one inside its window."""
    # Totals as they add up; the record (frozen) is made of them at the end.
    out = SimpleNamespace(**{f.name: getattr(_EMPTY, f.name) for f in fields(_EMPTY)})
    out.path, out.rank, out.trace_id = facts.path, facts.rank, facts.trace_id
    out.pid = facts.main_pid
    if facts.window is not None:
        out.window_start_unix_seconds = facts.abs_ns(facts.window[0]) / 1e9
        out.window_seconds = (facts.window[1] - facts.window[0]) / 1e6
    lo, hi = facts.window if facts.window is not None else (float("-inf"), float("inf"))
    out.pytorch_op_seconds = sum(
        union_seconds(_pairs(times, lo, hi))
        for (pid, _tid), times in facts.ops.items()
        if pid == out.pid
    )
    for start, end, name, nbytes, calls, _local, _peer in facts.net_bursts:
        if end < lo or start > hi:
            continue
        if name == "send":
            out.net_sent_bytes += nbytes
        elif name == "recv":
            out.net_received_bytes += nbytes
        out.net_calls += calls
    for e in facts.net_events:
        if not lo <= e.ts_us <= hi:
            continue
        if e.kind == "tcp_retransmit":
            out.tcp_retransmits += 1
        elif e.kind.startswith("tcp_reset"):
            out.tcp_resets += 1
        elif e.kind == "packet_drop":
            out.packet_drops += 1
    by_cause: dict[str, float] = defaultdict(float)
    threads: set[int] = set()
    for s in facts.offcpu:
        seconds = (min(s.end_us, hi) - max(s.start_us, lo)) / 1e6
        if seconds <= 0 or s.child_pid:  # its child processes' threads are not its own
            continue
        threads.add(s.tid)
        main = s.tid == out.pid
        if s.cause == "runnable":
            out.offcpu_runnable_seconds += seconds
            if main:
                out.main_thread_runnable_seconds += seconds
        else:
            out.offcpu_blocked_seconds += seconds
            by_cause[s.cause] += seconds
            if main:
                out.main_thread_blocked_seconds += seconds
    out.blocked_seconds_by_cause = dict(sorted(by_cause.items(), key=lambda kv: -kv[1]))
    out.offcpu_threads = len(threads)
    kernels = [pair for times in facts.gpu_busy.values() for pair in _pairs(times, lo, hi)]
    kernels += [
        (max(c.start_us, lo), min(c.end_us, hi))
        for c in facts.collectives
        if c.source == "gpu" and c.end_us >= lo and c.start_us <= hi
    ]
    out.gpu_busy_seconds = union_seconds(kernels)
    by_thread: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for c in facts.nccl_calls:
        if c.end_us >= lo and c.start_us <= hi:
            by_thread[c.tid].append((max(c.start_us, lo), min(c.end_us, hi)))
            out.nccl_calls += 1
    out.nccl_seconds = sum(union_seconds(v) for v in by_thread.values())
    _read_info(facts.info, out)
    return ProcessSummary(**vars(out))


_EMPTY = ProcessSummary("")


def _read_info(args: dict[str, Any], out: SimpleNamespace) -> None:
    tracks = args.get("tracks")
    if isinstance(tracks, list):
        out.kernel_tracks = tuple(str(t) for t in tracks)
    lost = args.get("records_over_cap_dropped", 0)
    total = int(lost) if isinstance(lost, int) else 0
    for key, value in args.items():
        if key.endswith("_lost_ring_buffer_full") and isinstance(value, int):
            total += value
    out.kernel_records_lost = total
