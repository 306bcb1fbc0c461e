"""The network scores' raw material on the real 4-rank job: every rank's TCP connections
(the net collector's RTT, retransmits and bytes, read through ``ListConnections`` every 2.5 s)
while the job is healthy and under each network fault in turn, each followed by a healthy
stretch. Run as root:

    python tests/bench/bench_net_links.py [--out net-links.jsonl] [--seconds 35]
    python tests/bench/bench_net_links.py --report net-links.jsonl [--verbose]

The report prints, per 5 s interval (non-overlapping pairs of readings), each rank's scores
as the detector makes them (`bpfdyno.detection.net_signal.link_scores`: its best active
link's RTT and retransmits per second) and the ranks the outlier test with the scores'
floors (`bpfdyno.detection.detector.SCORES`) would flag in that one interval (no
hysteresis); ``--verbose`` adds every socket that moved bytes. docs/detection.md ("The
network scores") holds a run's numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tracing"))

from straggler_job import StragglerJob, short_base

from bpfdyno.detection.detector import SCORES
from bpfdyno.detection.net_signal import LinkScores, link_scores
from bpfdyno.detection.outliers import outliers
from bpfdyno.detection.signals import RankSignals
from bpfdyno.rpc.detection import NetLink
from bpfdyno.rpc.v1 import kernel_pb2, kernel_pb2_grpc

RANKS, CPUS = 4, (0, 0, 1, 0)
READ_EVERY_S = 2.5


def reading(job: StragglerJob, phase: str) -> dict[str, Any]:
    with job.agent.channel() as ch:
        r = kernel_pb2_grpc.KernelStub(ch).ListConnections(
            kernel_pb2.ListConnectionsRequest(), timeout=10
        )
    ranks = {pid: rank for rank, pid in job.rank_pids.items()}
    conns = [
        {
            "rank": ranks[c.pid], "s": f"{c.saddr}:{c.sport}", "d": f"{c.daddr}:{c.dport}",
            "st": c.state, "tx": c.tx_bytes, "rx": c.rx_bytes, "rt": c.retransmits,
            "srtt": c.srtt_seconds if c.HasField("srtt_seconds") else None,
        }
        for c in r.connections
        if c.pid in ranks
    ]  # fmt: skip
    return {"t": time.time(), "phase": phase, "load": os.getloadavg()[0], "conns": conns}


def measure(out_path: str, seconds: float) -> None:
    base = short_base()
    job = StragglerJob(base, RANKS, CPUS)
    text = job.agent.config.read_text()
    job.agent.config.write_text(
        text.replace("[collectors.net]\nenabled = false", "[collectors.net]\nenabled = true")
    )
    faults = [
        ("lat20-r1", lambda: job.slow_link(1, 20.0)),
        ("lat20-r3", lambda: job.slow_link(3, 20.0)),
        ("lat5-r3", lambda: job.slow_link(3, 5.0)),
        ("loss15-r1", lambda: job.packet_loss(1, 150)),
        ("loss5-r3", lambda: job.packet_loss(3, 50)),
        ("bw50-r3", lambda: job.bandwidth_cap(3, "50kbit")),
        ("bw200-r1", lambda: job.bandwidth_cap(1, "200kbit")),
        ("wire15-r1", lambda: job.slow_link(1, 0.0, 0.15)),
        ("wire5-r3", lambda: job.slow_link(3, 0.0, 0.05)),
    ]
    with open(out_path, "a") as out:

        def watch(phase: str, span: float) -> None:
            end = time.monotonic() + span
            while time.monotonic() < end:
                out.write(json.dumps(reading(job, phase)) + "\n")
                out.flush()
                time.sleep(READ_EVERY_S)

        try:
            job.start()
            watch("healthy", 60.0)
            for name, fault in faults:
                with fault():
                    watch(name, seconds)
                watch(f"healthy-after-{name}", 15.0)
        finally:
            job.close()
            shutil.rmtree(base, ignore_errors=True)


def interval_links(a: dict[str, Any], b: dict[str, Any]) -> dict[int, list[NetLink]]:
    """Each rank's links over the interval between two readings (as `LinkSampler` does)."""
    seconds = b["t"] - a["t"]
    before = {(c["rank"], c["s"], c["d"]): c for c in a["conns"]}
    out: dict[int, list[NetLink]] = {r: [] for r in range(RANKS)}
    for c in b["conns"]:
        p = before.get((c["rank"], c["s"], c["d"]))
        if c["st"] != "ESTABLISHED" or p is None:
            continue
        moved = c["tx"] + c["rx"] - p["tx"] - p["rx"]
        out[c["rank"]].append(
            NetLink(
                c["s"].rsplit(":", 1)[0], c["d"].rsplit(":", 1)[0], c["srtt"],
                max(0, c["rt"] - p["rt"]), max(0, moved), seconds,
                sent_bytes=max(0, c["tx"] - p["tx"]),
            )
        )  # fmt: skip
    return out


def as_signals(rank: int, net: LinkScores) -> RankSignals:
    """A rank's signals with only its network scores (what the network scores read)."""
    return RankSignals("", rank, 0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0, 0, net=net)


def flagged(scores: dict[int, LinkScores]) -> list[str]:
    """The ranks each network score's outlier test flags in this one interval."""
    found = []
    for score in SCORES:
        if not score.name.startswith("net_"):
            continue
        values = {r: score.value(as_signals(r, s)) for r, s in scores.items()}
        values = {r: v for r, v in values.items() if not math.isnan(v)}
        ranks = outliers(values, 3.0, score.floor, score.relative)
        if ranks:
            found.append(f"{score.name}:{sorted(ranks)}")
    return found


def report(path: str, verbose: bool) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(
        "| phase | load | "
        + " | ".join(f"rank {r}: RTT ms, retx/s" for r in range(RANKS))
        + " | flagged |"
    )
    for a, b in zip(rows[::2], rows[2::2], strict=False):
        if a["phase"] != b["phase"]:
            continue
        links = interval_links(a, b)
        scores = link_scores(links)
        cells = " | ".join(
            f"{s.rtt_s * 1000:.2f}, {s.retransmits_per_s:.2f}" for _, s in sorted(scores.items())
        )
        print(f"| {b['phase']} | {b['load']:.1f} | {cells} | {' '.join(flagged(scores))} |")
        if verbose:
            for r, ls in sorted(links.items()):
                for link in ls:
                    if link.moved_bytes or link.retransmits:
                        rtt = math.nan if link.srtt_seconds is None else link.srtt_seconds * 1000
                        print(
                            f"    rank {r} -> {link.remote_address}: {rtt:.1f} ms, "
                            f"{link.retransmits} retransmits, {link.moved_bytes} bytes"
                        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default="net-links.jsonl")
    ap.add_argument("--seconds", type=float, default=35.0, help="per fault")
    ap.add_argument("--report", default="", metavar="JSONL")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if args.report:
        report(args.report, args.verbose)
    else:
        measure(args.out, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
