"""A rank's loss events as its evidence lists them: a drop of data the socket already had
(the copy of a retransmit that was not needed) is a ``duplicate``, not a loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bpfdyno.analysis.summary import summarize_file

PID = 41
BASE_NS = 1_700_000_000_000_000_000
LOCAL, PEER = "10.18.0.11:40000", "10.18.0.12:50000"


def net(name: str, ts: float, reason: str = "") -> dict[str, Any]:
    args: dict[str, Any] = {"protocol": "tcp", "local": LOCAL, "peer": PEER}
    if reason:
        args["reason"] = reason
    return {"ph": "i", "s": "t", "cat": "bpfdyno.net", "name": name, "pid": PID, "tid": 9,
            "ts": ts, "args": args}  # fmt: skip


def allreduce(ts: float, dur: float) -> dict[str, Any]:
    return {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": PID,
            "tid": 7, "ts": ts, "dur": dur, "args": {}}  # fmt: skip


def test_duplicates_are_listed_apart_and_counted_as_no_loss(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "Trace",
            "name": "PyTorch Profiler (0)",
            "pid": "Spans",
            "tid": "x",
            "ts": 1000.0,
            "dur": 1000.0,
        },
        allreduce(1100.0, 100.0),
        allreduce(1500.0, 100.0),
        net("tcp_retransmit", 1150.0),  # in the first collective
        net("packet_drop", 1160.0, "TCP_OLD_DATA"),  # the peer had it: no loss
        net("packet_drop", 1550.0, "TCP_OFOMERGE"),  # already queued out of order: no loss
        net("packet_drop", 1560.0, "NETFILTER_DROP"),  # in the second: a loss
        net("tcp_retransmit", 2500.0),  # after the window
    ]
    doc = {"baseTimeNanoseconds": BASE_NS, "traceEvents": events}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    assert [(e.kind, e.ts_us, e.unix_ns, e.local, e.peer) for e in ev.loss_events] == [
        ("tcp_retransmit", 1150.0, BASE_NS + 1_150_000, LOCAL, PEER),
        ("duplicate", 1160.0, BASE_NS + 1_160_000, LOCAL, PEER),
        ("duplicate", 1550.0, BASE_NS + 1_550_000, LOCAL, PEER),
        ("packet_drop", 1560.0, BASE_NS + 1_560_000, LOCAL, PEER),
    ]
    # Per collective, from its run-up's start (the window's, then the previous arrival: the
    # second collective's run-up holds the first) to its end; duplicates not counted.
    assert [c.loss_events for c in ev.collectives] == [1, 2]
