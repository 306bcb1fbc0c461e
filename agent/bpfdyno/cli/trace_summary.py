"""`bpfdyno trace-summary`: the ranks of a traced job side by side, without opening a UI.

    bpfdyno trace-summary /tmp/traces/t_*.pt.trace.json     # files (read here)
    bpfdyno trace-summary --trace-id 3f2a...                # a trace's files (read by the agent)

Per traced process (one column each, headed by its rank and pid): the window, its GPUs' busy
time (with "GPU-bound" said in words when they were busy most of the window), the time in
PyTorch ops, the network bytes, calls, retransmits, resets and drops, the off-CPU time of its
threads (waiting for a CPU; blocked, by cause: sums over its threads, which the rows say, so
they can exceed the window), the same for its main thread, and its NCCL calls and their time.
A value that stands out — at least `OUTLIER_RATIO` times the median of the row and clearly
above it — is marked ``!``: HTA names the slow rank, this says why it was slow.

Then the verdict (`bpfdyno.analysis.verdict`): which rank held the others back, and why, from
what the kernel saw — or that the ranks are within noise (docs/tracing.md, "Why is rank N
slow?").

``--json`` prints ``{"processes": [ProcessSummary...], "verdict": Verdict}`` with the .proto
field names (the evidence each file holds is left out: the verdict says what it showed), the
same for files and for a trace id.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from bpfdyno.analysis.readings import GPU_BOUND_SHARE, gpu_bound
from bpfdyno.analysis.verdict import compare, verdict_text
from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_target_argument,
    default_target,
)
from bpfdyno.rpc.diagnosis import Verdict
from bpfdyno.rpc.traces import ProcessSummary
from bpfdyno.rpc.wire import record_dict

#: A value at least this many times the row's median is marked as standing out...
OUTLIER_RATIO = 1.5


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``trace-summary`` to ``bpfdyno``."""
    p = subparsers.add_parser(
        "trace-summary",
        help="compare traced processes (ranks) side by side: ops, network, off-CPU, NCCL",
        description="Summarise merged trace files (or a trace's files, with --trace-id) side "
        "by side, marking with '!' what stands out.",
    )
    p.add_argument("files", nargs="*", metavar="FILE", help="trace files (.json or .json.gz)")
    p.add_argument("--trace-id", default="", help="summarise this trace's files (on the agent)")
    add_target_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_trace_summary)


def cmd_trace_summary(args: argparse.Namespace) -> int:
    """Run ``bpfdyno trace-summary``; returns the exit status."""
    if bool(args.files) == bool(args.trace_id):
        print("bpfdyno: give trace files, or --trace-id (not both)", file=sys.stderr)
        return EXIT_USAGE
    if args.files:
        from bpfdyno.analysis.summary import summarize_file

        summaries = [summarize_file(f) for f in args.files]
        verdict = compare([s.evidence for s in summaries if s.evidence is not None])
        return _show(summaries, verdict, args.json)

    async def ask(agent: AgentClient) -> int:
        summary = await agent.trace_summary(args.trace_id)
        return _show(summary.processes, summary.verdict, args.json)

    return with_agent(args.target or default_target(), ask)


def _show(summaries: Sequence[ProcessSummary], verdict: Verdict | None, as_json: bool) -> int:
    """Print the summaries, by rank, and the verdict; 1 when no file could be summarised."""
    rows = [record_dict(replace(s, evidence=None), with_defaults=True) for s in summaries]
    for row in rows:
        row.pop("evidence", None)  # in --json of the API; the table and the verdict say it
    rows.sort(key=lambda r: (r["rank"] if r["rank"] >= 0 else 1 << 30, r["pid"], r["path"]))
    if as_json:
        doc: dict[str, Any] = {"processes": rows}
        if verdict is not None:
            doc["verdict"] = record_dict(verdict, with_defaults=True)
        print_json(doc)
    else:
        print(format_summary(rows))
        if verdict is not None and any(not r.get("error") for r in rows):
            print(verdict_text(verdict))
    return EXIT_FAIL if all(r.get("error") for r in rows) else EXIT_OK


def _seconds(v: float) -> str:
    if v >= 1:
        return f"{v:.3f} s"
    return f"{v * 1000:.3f} ms"


def _bytes(v: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if v >= size:
            return f"{v / size:.2f} {unit} ({int(v)} B)"
    return f"{int(v)} B"


def _count(v: float) -> str:
    return str(int(v))


#: (label, value of a row, formatter, smallest difference from the median that counts).
Row = tuple[str, Callable[[dict[str, Any]], float], Callable[[float], str], float]


def _rows(processes: Sequence[dict[str, Any]]) -> list[Row]:
    causes: list[str] = []
    for p in processes:
        for cause in p.get("blocked_seconds_by_cause", {}):
            if cause not in causes:
                causes.append(cause)
    rows: list[Row] = [
        ("window", lambda p: p["window_seconds"], _seconds, 0.0),
        ("PyTorch ops", lambda p: p["pytorch_op_seconds"], _seconds, 0.001),
        ("net sent", lambda p: p["net_sent_bytes"], _bytes, 4096),
        ("net received", lambda p: p["net_received_bytes"], _bytes, 4096),
        ("net calls", lambda p: p["net_calls"], _count, 16),
        ("TCP retransmits", lambda p: p["tcp_retransmits"], _count, 1),
        ("TCP resets", lambda p: p["tcp_resets"], _count, 1),
        ("packet drops", lambda p: p["packet_drops"], _count, 1),
        ("threads seen off-CPU", lambda p: p["offcpu_threads"], _count, 1),
        (
            f"off-CPU: waiting for a CPU ({_over_threads(processes)})",
            lambda p: p["offcpu_runnable_seconds"],
            _seconds,
            0.001,
        ),
        (
            f"off-CPU: blocked ({_over_threads(processes)})",
            lambda p: p["offcpu_blocked_seconds"],
            _seconds,
            0.001,
        ),
    ]
    for cause in causes:
        rows.append((f"  blocked: {cause}", _by_cause(cause), _seconds, 0.001))
    rows += [
        (
            "main thread: waiting for a CPU",
            lambda p: p["main_thread_runnable_seconds"],
            _seconds,
            0.001,
        ),
        ("main thread: blocked", lambda p: p["main_thread_blocked_seconds"], _seconds, 0.001),
        ("NCCL calls", lambda p: p["nccl_calls"], _count, 1),
        ("NCCL time", lambda p: p["nccl_seconds"], _seconds, 0.001),
        ("records lost", lambda p: p["kernel_records_lost"], _count, 1),
    ]
    return rows


def _over_threads(processes: Sequence[dict[str, Any]]) -> str:
    """What the off-CPU rows add up: each thread's own time, so more than the window."""
    counts = sorted({int(p.get("offcpu_threads", 0)) for p in processes})
    if len(counts) == 1:
        return f"sum over {counts[0]} thread{'' if counts[0] == 1 else 's'}"
    return f"sum over {counts[0]}-{counts[-1]} threads"


def _gpu_cell(p: dict[str, Any]) -> str:
    busy, window = float(p.get("gpu_busy_seconds", 0.0)), float(p["window_seconds"])
    if not window:
        return _seconds(busy)
    share = f"{busy / window:.0%} of the window"
    return f"{_seconds(busy)} ({share}{', GPU-bound' if gpu_bound(busy, window) else ''})"


def _by_cause(cause: str) -> Callable[[dict[str, Any]], float]:
    def get(p: dict[str, Any]) -> float:
        return float(p.get("blocked_seconds_by_cause", {}).get(cause, 0.0))

    return get


def format_summary(processes: Sequence[dict[str, Any]]) -> str:
    """The side-by-side table (one column per process)."""
    ok = [p for p in processes if not p.get("error")]
    lines: list[str] = []
    if ok:
        heads = [
            (f"rank {p['rank']}" if p["rank"] >= 0 else "no rank") + f" / pid {p['pid']}"
            for p in ok
        ]
        table: list[list[str]] = [["", *heads]]
        table.append(
            [
                "window start",
                *(
                    time.strftime("%H:%M:%S", time.localtime(p["window_start_unix_seconds"]))
                    + f".{int(p['window_start_unix_seconds'] % 1 * 1000):03d}"
                    if p["window_start_unix_seconds"]
                    else "-"
                    for p in ok
                ),
            ]
        )
        table.append(["kernel tracks", *(",".join(p["kernel_tracks"]) or "none" for p in ok)])
        marked = False
        for label, get, fmt, min_diff in _rows(ok):
            values = [float(get(p)) for p in ok]
            median = statistics.median(values)
            cells = []
            for v in values:
                out = fmt(v)
                if (
                    len(ok) > 1
                    and v - median >= min_diff
                    and (median == 0 or v >= OUTLIER_RATIO * median)
                ):
                    out += " !"
                    marked = True
                cells.append(out)
            table.append([label, *cells])
        if any(p.get("gpu_busy_seconds") for p in ok):
            table.insert(3, ["GPU busy", *(_gpu_cell(p) for p in ok)])
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        for row in table:
            lines.append(
                "  ".join(
                    cell.ljust(w) if i == 0 else cell.rjust(w)
                    for i, (cell, w) in enumerate(zip(row, widths, strict=True))
                ).rstrip()
            )
        if marked:
            lines.append(
                f"! stands out: at least {OUTLIER_RATIO:g}x the median of the row (and clearly "
                "above it)"
            )
        for head, p in zip(heads, ok, strict=True):
            if gpu_bound(float(p.get("gpu_busy_seconds", 0.0)), float(p["window_seconds"])):
                share = float(p["gpu_busy_seconds"]) / float(p["window_seconds"])
                lines.append(
                    f"{head} is GPU-bound: its GPUs ran kernels {share:.0%} of the window "
                    f"(GPU-bound from {GPU_BOUND_SHARE:.0%}): the GPU's work sets its pace, "
                    "not its CPU, data or network"
                )
        lines.append("files:")
        lines += [f"  pid {p['pid']}: {p['path']}" for p in ok]
    for p in processes:
        if p.get("error"):
            lines.append(f"not summarised: {p['path']}: {p['error']}")
    return "\n".join(lines)
