"""What the API's records cost on the wire: one metrics round encoded by the agent and
decoded by a client, the generic mapping (`bpfdyno.rpc.wire`) against hand-written code.

Usage: ``python tests/bench/bench_wire.py [--rounds 30] [--series 150,1000]``

- **Encode** (the agent, once per round shared by every stream subscriber): the store's
  series (`SeriesView`) into a ``MetricsSnapshot`` message. Hand-written: the message built
  field by field, as the servicer did before the records. Records: ``series_record`` then
  ``to_pb``, as the servicer does now.
- **Decode** (every client, every round): the message into what the client reads.
  Hand-written: each series' name, labels and last value into a small dataclass, as the
  TUI's converter did. Records: ``from_pb(MetricsSnapshot, ...)``.

A round of ``--series`` series of one point each (a host round has about 150 on a small
node; 1000 is a big one with every core's series). The two ways run interleaved, round by
round, so load on the machine hits both alike; medians and their ratio are printed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bpfdyno.core.metrics import MetricKind, MetricSpec
from bpfdyno.core.store import Point, SeriesView
from bpfdyno.rpc.agent import MetricsSnapshot
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.wire import from_pb
from bpfdyno.server.agent import snapshot_to_pb
from bpfdyno.services.agent import Snapshot

SPEC = MetricSpec("cpu_user_ratio", MetricKind.RATIO, "ratio", "user time", ("cpu", "mode"))


def snapshot(series: int) -> Snapshot:
    """A round of ``series`` series, two labels and one point each."""
    views = [
        SeriesView(SPEC, (("cpu", str(i)), ("mode", "user")), (Point(1.7e9, i / series),))
        for i in range(series)
    ]
    return Snapshot(1.7e9, "host", views)


def hand_written_encode(s: Snapshot) -> pb.MetricsSnapshot:
    """The servicer's conversion before the records: every message built field by field."""
    return pb.MetricsSnapshot(
        unix_seconds=s.ts,
        collector=s.collector,
        series=[
            pb.Series(
                name=v.spec.name,
                labels=[pb.Label(name=k, value=val) for k, val in v.labels],
                points=[pb.Point(unix_seconds=p.ts, value=p.value) for p in v.points],
            )
            for v in s.series
        ],
    )


@dataclass(frozen=True, slots=True)
class _Value:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def hand_written_decode(msg: pb.MetricsSnapshot) -> tuple[float, str, tuple[_Value, ...]]:
    """The TUI's converter before the records: a value per series."""
    values = tuple(
        _Value(
            s.name,
            tuple((lab.name, lab.value) for lab in s.labels),
            s.points[-1].value if s.points else float("nan"),
        )
        for s in msg.series
    )
    return msg.unix_seconds, msg.collector, values


def _time(f: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    f()
    return time.perf_counter() - t0


def measure(series: int, rounds: int) -> dict[str, float]:
    """Median ms of each way, interleaved round by round."""
    snap = snapshot(series)
    msg = hand_written_encode(snap)
    assert snapshot_to_pb(snap) == msg  # the same message either way
    ways: dict[str, Callable[[], Any]] = {
        "encode, hand-written": lambda: hand_written_encode(snap),
        "encode, records": lambda: snapshot_to_pb(snap),
        "decode, hand-written": lambda: hand_written_decode(msg),
        "decode, records": lambda: from_pb(MetricsSnapshot, msg),
    }
    for f in ways.values():  # warm up (the converters are built at the first call)
        f()
    times: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(rounds):
        for name, f in ways.items():
            times[name].append(_time(f))
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--series", default="150,1000")
    args = p.parse_args()
    print("| series | way | hand-written (ms) | records (ms) | ratio |")
    print("|---|---|---|---|---|")
    for n in (int(x) for x in args.series.split(",")):
        m = measure(n, args.rounds)
        for way in ("encode", "decode"):
            old, new = m[f"{way}, hand-written"], m[f"{way}, records"]
            print(f"| {n} | {way} | {old:.2f} | {new:.2f} | {new / old:.2f}x |")


if __name__ == "__main__":
    main()
