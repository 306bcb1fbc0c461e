"""Draw one process of a merged trace file as a timeline PNG (the picture in docs/tracing.md).

    pip install matplotlib          # only for this script; bpfdyno does not need it
    python docs/render_trace.py TRACE.json OUT.png [--title TEXT]

Rows, top to bottom: the process's PyTorch threads (top-level CPU ops and annotations such
as ``gloo:all_reduce``), then bpfdyno's kernel tracks (``kernel net: ...`` bursts,
``kernel sched: ...`` off-CPU slices coloured by cause, ``NCCL``), over the trace window.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLOURS = {
    "cpu_op": "#4c78a8",
    "user_annotation": "#9467bd",
    "send": "#f58518",
    "recv": "#54a24b",
    "runnable": "#e45756",
    "lock": "#72b7b2",
    "io wait": "#b279a2",
    "sleep": "#bab0ac",
    "blocked": "#9d755d",
    "nccl": "#eeca3b",
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    with open(args.trace, encoding="utf-8") as f:
        data = json.load(f)
    events: list[dict[str, Any]] = data["traceEvents"]
    span = next(e for e in events if e.get("cat") == "Trace" and e.get("ph") == "X")
    lo, hi = span["ts"], span["ts"] + span["dur"]
    info = next(e for e in events if e.get("cat") == "bpfdyno.info")
    pid = info["pid"]
    names = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name" and e.get("pid") == pid
    }
    rows: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for e in events:
        if e.get("pid") != pid or e.get("ph") != "X" or e["ts"] + e.get("dur", 0) < lo:
            continue
        cat = str(e.get("cat", ""))
        start, end = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
        if cat in ("cpu_op", "user_annotation"):
            thread = names.get(e["tid"], "thread " + str(e["tid"]))
            rows[f"PyTorch: {thread}"].append((start, end, cat))
        elif cat == "bpfdyno.net":
            rows[names[e["tid"]]].append((start, end, e["name"]))
        elif cat == "bpfdyno.sched":
            rows[names[e["tid"]]].append((start, end, e["args"].get("cause", "blocked")))
        elif cat == "bpfdyno.nccl":
            rows[names[e["tid"]]].append((start, end, "nccl"))
    order = sorted(rows, key=lambda r: (not r.startswith("PyTorch"), r.startswith("kernel sched"), r))
    fig, ax = plt.subplots(figsize=(14, 0.42 * len(order) + 1.6), dpi=110)
    for y, row in enumerate(order):
        for start, end, kind in rows[row]:
            width = max((end - start) / 1000, 0.004)  # µs -> ms; very short ones stay visible
            ax.barh(y, width, left=(start - lo) / 1000, height=0.7, color=COLOURS.get(kind, "#999"))
    ax.set_yticks(range(len(order)))
    ax.set_yticklabels([r if len(r) < 70 else r[:67] + "..." for r in order], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, (hi - lo) / 1000)
    ax.set_xlabel("ms since the trace window started")
    ax.set_title(args.title or f"pid {pid}: PyTorch ops and bpfdyno's kernel tracks", fontsize=10)
    legend = [Patch(color=c, label=k) for k, c in COLOURS.items()]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=10, fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)


if __name__ == "__main__":
    main()
