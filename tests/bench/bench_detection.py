"""What the always-on detection costs: CPU time of one detection round per rank, and its
share of one core at the default 5 s interval.

Run as one command: ``python tests/bench/bench_detection.py [--ranks 4] [--threads 24]
[--rounds 200] [--repeats 5] [--spacing 0.2] [--hung]``.

It starts ``--ranks`` processes that look like training ranks to the detection (``RANK`` in
their environment, ``--threads`` sleeping threads each: a PyTorch rank with gloo and its
pools has 20-30), then runs the detection collector's ``collect()`` ``--rounds`` times,
``--spacing`` seconds apart, measuring the CPU time of the calling thread
(``time.thread_time_ns``: what the collector's own thread spends, reading /proc included);
interleaved with as many rounds with no ranks (the fixed cost) per repeat. Reported: the
median over ``--repeats`` of the per-round CPU time, and that round's share of one core every
5 s. The machine may be shared: CPU time, not wall time, is what is measured, so other work
does not inflate it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from bpfdyno.detection.collector import DetectionCollector
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess

#: A rank: sleeping threads, and a main thread that moves 1 MiB every 0.1 s (its all-reduce),
#: or nothing (a hung job: the hang watch then reads every thread).
RANK_CODE = """
import os, threading, time, sys
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
null, block = os.open("/dev/null", os.O_WRONLY), bytes(1 << 20)
while True:
    if sys.argv[2] == "moving":
        os.write(null, block)
    time.sleep(0.1)
"""
INTERVAL_S = 5.0


def per_round_ns(collector: DetectionCollector, rounds: int, spacing_s: float) -> float:
    """Mean CPU time of one round, rounds ``spacing_s`` apart (healthy ranks move bytes in
    every such interval, as in every 5 s one: back to back, they would look still)."""
    spent = 0
    for _ in range(rounds):
        time.sleep(spacing_s)
        start = time.thread_time_ns()
        collector.collect()
        spent += time.thread_time_ns() - start
    return spent / rounds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--threads", type=int, default=24)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--hung", action="store_true", help="ranks that move nothing")
    p.add_argument("--spacing", type=float, default=0.2, help="seconds between rounds")
    args = p.parse_args()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK_CODE,
                str(args.threads),
                "still" if args.hung else "moving",
            ],
            env={**os.environ, "RANK": str(r), "SLURM_JOB_ID": "1"},
        )
        for r in range(args.ranks)
    ]
    try:
        time.sleep(1.0)
        refs = [RankProcess(pr.pid, "1") for pr in procs]
        with_ranks = DetectionCollector(lambda: refs, EventLog(), "bench")
        empty = DetectionCollector(list, EventLog(), "bench")
        with_ranks.collect()  # environments read once per process lifetime
        loaded, idle = [], []
        for _ in range(args.repeats):
            loaded.append(per_round_ns(with_ranks, args.rounds, args.spacing))
            idle.append(per_round_ns(empty, args.rounds, args.spacing))
        lo, em = statistics.median(loaded), statistics.median(idle)
        load = os.getloadavg()[0]
        print(
            f"{args.ranks} {'hung' if args.hung else 'healthy'} ranks x {args.threads} threads, "
            f"{args.rounds} rounds x "
            f"{args.repeats} repeats, load average {load:.1f}:\n"
            f"  per round: {lo / 1e3:.0f} us (range {min(loaded) / 1e3:.0f}-"
            f"{max(loaded) / 1e3:.0f}), {(lo - em) / args.ranks / 1e3:.0f} us per rank, "
            f"{em / 1e3:.1f} us with no ranks\n"
            f"  share of one core at one round per {INTERVAL_S:g} s: "
            f"{lo / (INTERVAL_S * 1e9) * 100:.4f} %"
        )
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
