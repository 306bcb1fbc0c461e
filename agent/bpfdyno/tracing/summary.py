"""What a merged trace file says about its process, in numbers: `summarize_file`.

Used by ``bpfdyno trace-summary FILE...`` and the gRPC ``GetTraceSummary``: per traced
process, the trace window, the time in PyTorch CPU ops, its network traffic and TCP trouble,
the off-CPU time of its threads by cause, and its NCCL calls — so the ranks of a job can be
compared side by side and the one that was starved, blocked or retransmitting stands out.

The file is read as a stream of events (`iter_trace_events`), never loaded whole: memory stays
bounded however large the trace (about 5 s per 100 MB of JSON on a slow machine). Only what
is in the file is counted: the kernel tracks' events (categories ``bpfdyno.*``, see
`bpfdyno.tracing.capture.tracks`) and Kineto's own ``cpu_op`` events, inside the window.
"""

from __future__ import annotations

import codecs
import gzip
import json
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import fields, replace
from typing import IO, Any

from bpfdyno.rpc.traces import ProcessSummary
from bpfdyno.tracing.capture.tracks import CAT_INFO, CAT_NCCL, CAT_NET, CAT_SCHED

_CHUNK = 1 << 20
_WS = " \t\r\n"


class SummaryError(Exception):
    """The file cannot be summarised; says why."""


def _open(path: str) -> IO[bytes] | gzip.GzipFile:
    f = open(path, "rb")  # noqa: SIM115 (returned)
    if f.read(2) == b"\x1f\x8b":
        f.close()
        return gzip.GzipFile(path, "rb")
    f.seek(0)
    return f


def iter_trace_events(path: str) -> Iterator[tuple[str, Any]]:
    """The file's top-level members as ("member", (key, value)) and each event as
    ("event", dict), in file order, reading it in chunks.

    Raises:
        SummaryError: not a JSON object with a ``traceEvents`` array, or truncated.
        OSError: unreadable.
    """
    decoder = json.JSONDecoder()
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")
    with _open(path) as f:
        buf = ""
        pos = 0
        dropped = 0  # characters of the file before buf
        eof = False

        def need(n: int = 1) -> bool:
            """Make at least n characters available from pos; False at the end of the file."""
            nonlocal buf, pos, eof, dropped
            while len(buf) - pos < n and not eof:
                chunk = f.read(_CHUNK)
                if not chunk:
                    eof = True
                    break
                dropped += pos
                buf = buf[pos:] + text.decode(chunk)
                pos = 0
            return len(buf) - pos >= n

        def skip_ws() -> None:
            nonlocal pos
            while need() and buf[pos] in _WS:
                pos += 1

        def value() -> Any:
            nonlocal pos
            while True:
                try:
                    obj, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as e:
                    if eof or not need(len(buf) - pos + _CHUNK):
                        raise SummaryError(
                            f"{path} is not complete JSON near character {dropped + e.pos}: "
                            f"{e.msg} (truncated?)"
                        ) from e
                    continue
                if end == len(buf) and not eof:  # a number may continue in the next chunk
                    need(len(buf) - pos + 1)
                    continue
                pos = end
                return obj

        def expect(ch: str) -> None:
            nonlocal pos
            skip_ws()
            if not need() or buf[pos] != ch:
                got = buf[pos] if need() else "the end of the file"
                raise SummaryError(f"{path}: expected {ch!r}, found {got!r}")
            pos += 1

        expect("{")
        seen_events = False
        while True:
            skip_ws()
            if need() and buf[pos] == "}":
                break
            if need() and buf[pos] == ",":
                pos += 1
                skip_ws()
            key = value()
            expect(":")
            skip_ws()
            if key == "traceEvents":
                seen_events = True
                expect("[")
                skip_ws()
                if need() and buf[pos] == "]":
                    pos += 1
                    continue
                while True:
                    skip_ws()
                    event = value()
                    if isinstance(event, dict):
                        yield "event", event
                    skip_ws()
                    if not need():
                        raise SummaryError(f'{path} ends inside "traceEvents" (truncated?)')
                    if buf[pos] == ",":
                        pos += 1
                        continue
                    if buf[pos] == "]":
                        pos += 1
                        break
                    raise SummaryError(f"{path}: unexpected {buf[pos]!r} between events")
            else:
                yield "member", (key, value())
        if not seen_events:
            raise SummaryError(f'{path} has no "traceEvents" array: not a Kineto trace')


def _union_s(intervals: list[tuple[float, float]]) -> float:
    """Total length in seconds of the union of (start_us, end_us) intervals."""
    total = 0.0
    end_so_far = float("-inf")
    start_run = 0.0
    for start, end in sorted(intervals):
        if start > end_so_far:
            if end_so_far > float("-inf"):
                total += end_so_far - start_run
            start_run, end_so_far = start, end
        else:
            end_so_far = max(end_so_far, end)
    if end_so_far > float("-inf"):
        total += end_so_far - start_run
    return total / 1e6


#: The numbers of a summary as they are added up (its fields but ``path``).
_Totals = dict[str, Any]


def summarize_file(path: str) -> ProcessSummary:
    """Summarise one trace file (see the module doc); errors go into ``error``."""
    empty = ProcessSummary(path)
    out: _Totals = {f.name: getattr(empty, f.name) for f in fields(empty) if f.name != "path"}
    try:
        _summarize(path, out)
    except (SummaryError, OSError, EOFError, gzip.BadGzipFile) as e:
        why = str(e) if isinstance(e, SummaryError) else f"cannot read {path}: {e}"
        return replace(empty, error=why)
    return ProcessSummary(path, **out)


def _summarize(path: str, out: _Totals) -> None:
    base_ns = 0
    window: tuple[float, float] | None = None
    ops: dict[tuple[Any, Any], list[tuple[float, float]]] = defaultdict(list)
    op_pids: dict[int, int] = defaultdict(int)
    nccl: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    net: list[tuple[float, dict[str, Any], str]] = []
    rare: list[tuple[float, str]] = []
    sched: list[tuple[float, float, str, dict[str, Any]]] = []
    info_pid = 0
    for kind, item in iter_trace_events(path):
        if kind == "member":
            key, value = item
            if key == "baseTimeNanoseconds" and isinstance(value, int):
                base_ns = value
            elif key == "trace_id":
                out["trace_id"] = str(value)
            elif key == "distributedInfo" and isinstance(value, dict):
                rank = value.get("rank")
                out["rank"] = rank if isinstance(rank, int) else -1
            continue
        e = item
        cat = e.get("cat")
        ph = e.get("ph")
        ts = e.get("ts")
        if not isinstance(ts, int | float):
            continue
        dur = e.get("dur", 0)
        dur = dur if isinstance(dur, int | float) else 0
        if cat == "cpu_op" and ph == "X":
            ops[(e.get("pid"), e.get("tid"))].append((ts, ts + dur))
            if isinstance(e.get("pid"), int):
                op_pids[e["pid"]] += 1
        elif cat == "Trace" and ph == "X" and str(e.get("name", "")).startswith("PyTorch Profiler"):
            window = (ts, ts + dur)
        elif cat == CAT_NET and ph == "X":
            net.append((ts, e.get("args", {}), str(e.get("name"))))
        elif cat == CAT_NET and ph == "i":
            rare.append((ts, str(e.get("name"))))
        elif cat == CAT_SCHED and ph == "X":
            sched.append((ts, dur, str(e.get("name")), e.get("args", {})))
        elif cat == CAT_NCCL and ph == "X" and e.get("name") != "ncclGroup":
            nccl[e.get("tid")].append((ts, ts + dur))
        elif cat == CAT_INFO and ph == "X":
            info_pid = e.get("pid") if isinstance(e.get("pid"), int) else 0
            _read_info(e.get("args", {}), out)
    out["pid"] = info_pid or (max(op_pids, key=lambda p: op_pids[p]) if op_pids else 0)
    if window is not None:
        out["window_start_unix_seconds"] = (base_ns / 1e3 + window[0]) / 1e6
        out["window_seconds"] = (window[1] - window[0]) / 1e6
    lo, hi = window if window is not None else (float("-inf"), float("inf"))
    clipped: dict[Any, list[tuple[float, float]]] = defaultdict(list)
    for key, intervals in ops.items():
        if key[0] == out["pid"]:
            clipped[key[1]] = [
                (max(s, lo), min(e, hi)) for s, e in intervals if e >= lo and s <= hi
            ]
    out["pytorch_op_seconds"] = sum(_union_s(v) for v in clipped.values())
    for _ts, args, name in net:
        nbytes = args.get("bytes", 0)
        calls = args.get("calls", 0)
        if name == "send":
            out["net_sent_bytes"] += int(nbytes)
        elif name == "recv":
            out["net_received_bytes"] += int(nbytes)
        out["net_calls"] += int(calls)
    for ts, name in rare:
        if not lo <= ts <= hi:
            continue
        if name == "tcp_retransmit":
            out["tcp_retransmits"] += 1
        elif name.startswith("tcp_reset"):
            out["tcp_resets"] += 1
        elif name == "packet_drop":
            out["packet_drops"] += 1
    by_cause: dict[str, float] = defaultdict(float)
    for _ts, dur, name, args in sched:
        seconds = dur / 1e6
        main = args.get("tid") == out["pid"]
        if name.startswith("runnable"):
            out["offcpu_runnable_seconds"] += seconds
            if main:
                out["main_thread_runnable_seconds"] += seconds
        elif name.startswith("blocked"):
            out["offcpu_blocked_seconds"] += seconds
            by_cause[str(args.get("cause", "blocked"))] += seconds
            if main:
                out["main_thread_blocked_seconds"] += seconds
    out["blocked_seconds_by_cause"] = dict(sorted(by_cause.items(), key=lambda kv: -kv[1]))
    out["nccl_calls"] = sum(len(v) for v in nccl.values())
    out["nccl_seconds"] = sum(_union_s(v) for v in nccl.values())


def _read_info(args: dict[str, Any], out: _Totals) -> None:
    tracks = args.get("tracks")
    if isinstance(tracks, list):
        out["kernel_tracks"] = tuple(str(t) for t in tracks)
    lost = args.get("records_over_cap_dropped", 0)
    total = int(lost) if isinstance(lost, int) else 0
    for key, value in args.items():
        if key.endswith("_lost_ring_buffer_full") and isinstance(value, int):
            total += value
    out["kernel_records_lost"] = total
