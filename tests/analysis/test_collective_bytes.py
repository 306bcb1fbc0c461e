"""What a rank's collectives moved over TCP: the net track's bytes inside its collectives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bpfdyno.analysis.summary import summarize_file

PID = 41


def burst(kind: str, ts: float, dur: float, nbytes: int) -> dict[str, Any]:
    args = {"bytes": nbytes, "calls": 1, "local": "10.0.0.1:1", "peer": "10.0.0.2:2"}
    return {"ph": "X", "cat": "bpfdyno.net", "name": kind, "pid": PID, "tid": 1_000_000_001,
            "ts": ts, "dur": dur, "args": args}  # fmt: skip


def test_bytes_inside_the_collectives(tmp_path: Path) -> None:
    """Collectives 1100-1200 and 1500-1600 µs: a send inside (1000 B), a receive half inside
    (2000 B over 1150-1250: 1000 B), a one-call send inside (24 B), a send between them
    (500 B, not counted)."""
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 1000.0, "dur": 1000.0},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": PID, "tid": 7,
         "ts": 1100.0, "dur": 100.0, "args": {}},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": PID, "tid": 7,
         "ts": 1500.0, "dur": 100.0, "args": {}},
        burst("send", 1110.0, 20.0, 1000),
        burst("recv", 1150.0, 100.0, 2000),
        burst("send", 1550.0, 0.0, 24),
        burst("send", 1300.0, 50.0, 500),
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": 0, "traceEvents": events}))
    ev = summarize_file(str(path)).evidence
    assert ev is not None and len(ev.collectives) == 2
    assert ev.collective_net_bytes == 1000 + 1000 + 24
