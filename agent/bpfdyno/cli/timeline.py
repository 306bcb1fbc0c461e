"""``bpfdyno timeline``: the ranks of a traced job side by side on one clock, as a picture.

    bpfdyno timeline /tmp/bpfdyno/$USER/trace_*.json -o job.svg

One band per trace file (one rank), on the wall clock every file carries
(``baseTimeNanoseconds`` + each event's ``ts``), so a straggler stands out: the others wait in
their collective while it is still computing, or off its CPU. Each band has four lanes: the
main thread's PyTorch ops, its collectives (``nccl:``/``gloo:`` annotations and bpfdyno's NCCL
calls), the GPU's kernels and copies, and — from bpfdyno's kernel tracks — the main thread off
its CPU, coloured by cause (waiting for a CPU, I/O, a lock, sleep). The picture is an SVG that
any browser shows; nothing beyond Python is needed to draw it.

Files are read whole (at most `MAX_JSON_BYTES` after decompression: a picture of a trace
larger than that would not be readable anyway); a file that is not a Kineto trace is said so
by name and the exit status is 2.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from bpfdyno.client.connection import EXIT_OK, EXIT_USAGE

#: Most bytes of JSON read from one file.
MAX_JSON_BYTES = 1 << 30
#: Picture geometry, in SVG pixels.
WIDTH = 1200
LABEL_W = 90
LANE_H = 14
#: Each band's title row above its lanes, and the space below them.
TITLE_H = 16
BAND_GAP = 8
TOP = 48
#: Lanes of a band, top to bottom: (key, title).
LANES = (("ops", "ops"), ("comm", "collectives"), ("gpu", "GPU"), ("off", "off-CPU"))
#: Fill of each kind of slice.
COLOURS = {
    "ops": "#4c78a8",
    "comm": "#9467bd",
    "gpu": "#54a24b",
    "runnable": "#e45756",
    "io wait": "#f58518",
    "lock": "#72b7b2",
    "sleep": "#bab0ac",
    "blocked": "#9d755d",
}
LEGEND = (
    ("ops", "PyTorch op"),
    ("comm", "collective"),
    ("gpu", "GPU kernel"),
    ("runnable", "waiting for a CPU"),
    ("io wait", "I/O wait"),
    ("lock", "lock"),
    ("sleep", "sleep"),
)
_COLLECTIVE_WORDS = (
    "nccl:", "gloo:", "all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter",
    "broadcast", "barrier", "all_to_all", "alltoall",
)  # fmt: skip


class TimelineError(ValueError):
    """A file that cannot be drawn; the message names it and why."""


@dataclass
class Rank:
    """One trace file's slices on the common clock (microseconds since the epoch)."""

    label: str
    start_us: float
    end_us: float
    #: Its rank in the job (Kineto's ``distributedInfo``), when the file says.
    number: int | None = None
    slices: dict[str, list[tuple[float, float, str]]] = field(default_factory=dict)

    def add(self, lane: str, start: float, dur: float, colour: str) -> None:
        self.slices.setdefault(lane, []).append((start, dur, colour))


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``timeline`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser(
        "timeline",
        help="draw the traced ranks side by side on one clock (an SVG picture)",
    )
    p.add_argument("files", nargs="+", type=Path, help="trace files, one per rank (.json, .gz)")
    p.add_argument("-o", "--out", type=Path, required=True, help="the picture to write (.svg)")
    p.add_argument("--title", default="", help="a title (default: the files' names)")
    p.set_defaults(handler=cmd_timeline)


def cmd_timeline(args: argparse.Namespace) -> int:
    """Run ``bpfdyno timeline``; returns the exit status."""
    try:
        ranks = [read_rank(path) for path in args.files]
    except TimelineError as e:
        print(f"bpfdyno timeline: {e}", file=sys.stderr)
        return EXIT_USAGE
    if all(r.number is not None for r in ranks):  # rank 0 first, as people count them
        ranks.sort(key=lambda r: r.number or 0)
    title = args.title or ", ".join(p.name for p in args.files[:4]) + (
        f" and {len(args.files) - 4} more" if len(args.files) > 4 else ""
    )
    svg = render(ranks, title)
    try:
        args.out.write_text(svg, encoding="utf-8")
    except OSError as e:
        print(f"bpfdyno timeline: cannot write {args.out}: {e.strerror}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.out}: {len(ranks)} rank(s), {sum(_count(r) for r in ranks)} slices")
    return EXIT_OK


def _count(rank: Rank) -> int:
    return sum(len(v) for v in rank.slices.values())


def load_trace(path: Path) -> dict[str, Any]:
    """The JSON object of a trace file (gzip-compressed or not).

    Raises:
        TimelineError: unreadable, too large, not JSON or not a trace.
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except (OSError, EOFError) as e:
        raise TimelineError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    if len(data) > MAX_JSON_BYTES:
        raise TimelineError(f"{path} holds more than {MAX_JSON_BYTES >> 20} MiB of JSON")
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise TimelineError(f"{path} is not JSON ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise TimelineError(f"{path} is not a trace: it has no traceEvents list")
    return obj


def read_rank(path: Path) -> Rank:
    """One rank's slices from its trace file.

    Raises:
        TimelineError: the file cannot be read, or holds no profiler span.
    """
    obj = load_trace(path)
    base_us = float(obj.get("baseTimeNanoseconds", 0)) / 1000.0
    events = [e for e in obj["traceEvents"] if isinstance(e, dict)]
    span = next((e for e in events if e.get("cat") == "Trace" and e.get("ph") == "X"), None)
    if span is None:
        raise TimelineError(f"{path} has no profiler span (a 'Trace' event): not a Kineto trace")
    info = next((e for e in events if e.get("cat") == "bpfdyno.info"), None)
    pid = info.get("pid") if info else _busiest_pid(events)
    dist = obj.get("distributedInfo")
    rank_no = dist.get("rank") if isinstance(dist, dict) else None
    label = f"rank {rank_no}" if rank_no is not None else path.name[:22]
    start = base_us + float(span["ts"])
    number = rank_no if isinstance(rank_no, int) else None
    rank = Rank(f"{label} (pid {pid})", start, start + float(span.get("dur", 0)), number)
    for e in events:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        ts, dur = base_us + float(e["ts"]), float(e.get("dur", 0))
        if ts + dur < rank.start_us or ts > rank.end_us:
            continue
        cat, name = str(e.get("cat", "")), str(e.get("name", ""))
        if cat in ("kernel", "gpu_memcpy", "gpu_memset"):
            rank.add("gpu", ts, dur, COLOURS["gpu"])
        elif e.get("pid") != pid:
            continue
        elif cat == "bpfdyno.nccl" or (
            cat == "user_annotation" and any(w in name.lower() for w in _COLLECTIVE_WORDS)
        ):
            rank.add("comm", ts, dur, COLOURS["comm"])
        elif cat == "cpu_op" and e.get("tid") == pid:
            rank.add("ops", ts, dur, COLOURS["ops"])
        elif cat == "bpfdyno.sched" and (e.get("args") or {}).get("tid") == pid:
            cause = str((e.get("args") or {}).get("cause", "blocked"))
            rank.add("off", ts, dur, COLOURS.get(cause, COLOURS["blocked"]))
    return rank


def _busiest_pid(events: Sequence[dict[str, Any]]) -> object:
    counts: dict[object, int] = {}
    for e in events:
        if e.get("cat") == "cpu_op":
            counts[e.get("pid")] = counts.get(e.get("pid"), 0) + 1
    return max(counts, key=lambda p: counts[p]) if counts else None


def render(ranks: Sequence[Rank], title: str) -> str:
    """The ranks as an SVG document: bands on one time axis, a legend, a title."""
    lo = min(r.start_us for r in ranks)
    hi = max(r.end_us for r in ranks)
    span = max(hi - lo, 1.0)
    scale = (WIDTH - LABEL_W - 10) / span
    band_h = TITLE_H + LANE_H * len(LANES) + BAND_GAP
    height = TOP + band_h * len(ranks) + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
        f'<text x="10" y="18" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    x = 10
    for key, words in LEGEND:
        out.append(f'<rect x="{x}" y="28" width="10" height="10" fill="{COLOURS[key]}"/>')
        out.append(f'<text x="{x + 14}" y="37">{escape(words)}</text>')
        x += 24 + 7 * len(words)
    for i, rank in enumerate(ranks):
        y0 = TOP + i * band_h
        out.append(f'<text x="10" y="{y0 + TITLE_H - 4}" font-weight="bold">'
                   f"{escape(rank.label)}</text>")  # fmt: skip
        for j, (key, lane_title) in enumerate(LANES):
            y = y0 + TITLE_H + j * LANE_H
            out.append(
                f'<text x="{LABEL_W - 6}" y="{y + LANE_H - 3}" text-anchor="end" '
                f'fill="#666">{lane_title}</text>'
            )
            bx, bw = LABEL_W + (rank.start_us - lo) * scale, (rank.end_us - rank.start_us) * scale
            out.append(
                f'<rect x="{bx:.2f}" y="{y + 1}" width="{bw:.2f}" height="{LANE_H - 2}" '
                'fill="#f3f3f3"/>'
            )
            for sx, sw, colour in _merged(rank.slices.get(key, []), lo, scale):
                out.append(
                    f'<rect x="{LABEL_W + sx:.2f}" y="{y + 1}" width="{sw:.2f}" '
                    f'height="{LANE_H - 2}" fill="{colour}"/>'
                )
    axis_y = TOP + band_h * len(ranks) + 4
    out.append(
        f'<line x1="{LABEL_W}" y1="{axis_y}" x2="{WIDTH - 10}" y2="{axis_y}" stroke="#333"/>'
    )
    step = _tick_step(span)
    t = 0.0
    while t <= span + 1e-9:
        tx = LABEL_W + t * scale
        out.append(f'<line x1="{tx:.2f}" y1="{axis_y}" x2="{tx:.2f}" y2="{axis_y + 4}" '
                   'stroke="#333"/>')  # fmt: skip
        out.append(f'<text x="{tx:.2f}" y="{axis_y + 16}" text-anchor="middle">'
                   f"{_ms(t)}</text>")  # fmt: skip
        t += step
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _merged(
    slices: Iterable[tuple[float, float, str]], lo: float, scale: float
) -> list[tuple[float, float, str]]:
    """Slices as (x, width, colour) in pixels, each at least half a pixel wide, neighbours of
    one colour closer than half a pixel drawn as one (a long trace stays a small file)."""
    out: list[tuple[float, float, str]] = []
    for start, dur, colour in sorted(slices):
        x, w = (start - lo) * scale, max(dur * scale, 0.5)
        if out and out[-1][2] == colour and x <= out[-1][0] + out[-1][1] + 0.5:
            px, pw, _ = out[-1]
            out[-1] = (px, max(pw, x + w - px), colour)
        else:
            out.append((x, w, colour))
    return out


def _tick_step(span_us: float) -> float:
    """A round tick interval giving 5-10 ticks over ``span_us``."""
    raw = span_us / 8
    mag = 10 ** math.floor(math.log10(raw))
    return float(next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw))


def _ms(us: float) -> str:
    return f"{us / 1000:g} ms" if us < 10_000_000 else f"{us / 1e6:g} s"


__all__ = ["Rank", "TimelineError", "cmd_timeline", "read_rank", "register", "render"]
