"""The agent's cost of NCCL late arrival across nodes, at the cap: each rank of a job sends the
latest 256 collectives of its interval (`signals.MAX_ARRIVALS`), every agent reads its peers'
answers off the wire and counts each collective once over the job's ranks
(`nccl_times.LateArrivals`). Run:

    python tests/bench/bench_nccl_late.py [--nodes 2 4 8] [--rounds 30]

Per job size (nodes of eight ranks, one world communicator), one agent's round: decoding its
peers' answers (protobuf bytes -> `from_record`, the pull's work) and the count (`apply`), in
CPU time of this thread (a loaded machine's waits are not counted), each the median of the
rounds; then the share of a core at the default 5 s interval, and the bytes one peer's
answer takes (arrivals packed per communicator). docs/performance.md ("NCCL late arrival
across nodes") holds runs' numbers, before and after the packing.
"""

from __future__ import annotations

import argparse
import statistics
import time

from bpfdyno.detection.nccl_times import LateArrivals
from bpfdyno.detection.signals import (
    MAX_ARRIVALS,
    Arrivals,
    RankSignals,
    from_record,
    to_record,
)
from bpfdyno.rpc.detection import GetRankSignalsResponse
from bpfdyno.rpc.v1 import detection_pb2
from bpfdyno.rpc.wire import from_pb, to_pb

RANKS_PER_NODE = 8
COMM = 0x9E3779B97F4A7C15
INTERVAL_S = 5.0
T0 = 1_795_000_000_000_000_000


def node_answer(node: int, nranks: int, first_seq: int) -> bytes:
    """One node's ``GetRankSignals`` answer: its eight ranks, 256 arrivals each."""
    signals = []
    for r in range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE):
        seqs = tuple(range(first_seq, first_seq + MAX_ARRIVALS))
        arrivals = (
            Arrivals(COMM, nranks, seqs, tuple(T0 + q * 10_000_000 + r * 1000 for q in seqs)),
        )
        s = RankSignals(
            "41", r, 1000 + r, 0.0, INTERVAL_S, 1.0, 0.0, 4.0, 0.0, 0, arrivals=arrivals
        )
        signals.append(to_record(s, f"node-{node}", 1000.0))
    return to_pb(GetRankSignalsResponse(tuple(signals))).SerializeToString()


def one_size(nodes: int, rounds: int) -> dict[str, float]:
    nranks = nodes * RANKS_PER_NODE
    late = LateArrivals()
    decode, count = [], []
    answer_bytes = 0
    for i in range(rounds):
        seq0 = i * MAX_ARRIVALS
        # Node 0 is this agent: its own ranks come from the sampler, not the wire.
        local_wire = node_answer(0, nranks, seq0)
        peer_wire = [node_answer(n, nranks, seq0) for n in range(1, nodes)]
        answer_bytes = len(peer_wire[0]) if peer_wire else len(local_wire)
        local_resp = detection_pb2.GetRankSignalsResponse.FromString(local_wire)
        local = [from_record(r) for r in from_pb(GetRankSignalsResponse, local_resp).signals]
        t = time.thread_time()
        peers = []
        for wire in peer_wire:
            resp = detection_pb2.GetRankSignalsResponse.FromString(wire)
            peers += [from_record(r, 1234) for r in from_pb(GetRankSignalsResponse, resp).signals]
        t_decode = time.thread_time() - t
        t = time.thread_time()
        late.apply(local, peers)
        t_count = time.thread_time() - t
        if i >= 2:  # the first rounds fill the pending table
            decode.append(t_decode)
            count.append(t_count)
    d, c = statistics.median(decode), statistics.median(count)
    return {
        "nodes": nodes,
        "ranks": nranks,
        "arrivals_per_round": nranks * MAX_ARRIVALS,
        "decode_ms": d * 1e3,
        "count_ms": c * 1e3,
        "us_per_arrival": (d + c) / (nranks * MAX_ARRIVALS) * 1e6,
        "core_share_pct": (d + c) / INTERVAL_S * 100,
        "answer_kb": answer_bytes / 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    print(
        f"{'nodes':>5} {'ranks':>5} {'arrivals':>8} {'decode ms':>9} {'count ms':>8}"
        f" {'us/arrival':>10} {'% core @5s':>10} {'answer KB':>9}"
    )
    for n in args.nodes:
        r = one_size(n, args.rounds)
        print(
            f"{r['nodes']:>5} {r['ranks']:>5} {r['arrivals_per_round']:>8}"
            f" {r['decode_ms']:>9.1f} {r['count_ms']:>8.1f} {r['us_per_arrival']:>10.2f}"
            f" {r['core_share_pct']:>10.2f} {r['answer_kb']:>9.1f}"
        )


if __name__ == "__main__":
    main()
