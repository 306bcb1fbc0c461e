"""What the detection's interrupt share costs: the CPU time one detection round spends on its
ranks' interrupt share (the interrupt collector's per-CPU books read once, each rank's
threads' on-CPU time kept per thread, the last CPU read for each thread that ran, the
weighted share), per round and per rank.

Run as root, as one command: ``python tests/bench/bench_irq_share.py [--ranks 4]
[--threads 24] [--busy 8] [--pinned] [--rounds 100] [--repeats 5] [--spacing 0.2]``.

It starts the real interrupt collector (BPF) and ``--ranks`` processes that look like
training ranks to the detection (``RANK`` in their environment), each with ``--threads``
threads of which ``--busy`` wake every 50 ms (so every one of them ran in every round, each
costing a stat read: a training rank's compute, loader and communication
threads) and the rest sleep (a rank's idle pool threads), while the main thread writes 1 MiB
every 0.1 s (it moves: the hang watch stays out). Per round two detection collectors
read the same ranks, one with the interrupt share (``interrupts`` = the interrupt collector)
and one without, in alternating order, each timed with ``time.thread_time_ns`` (the
collector thread's own CPU: other work on a shared machine does not inflate it). Reported:
the median over ``--repeats`` of the mean per-round CPU time of each, their difference per
round and per rank, and that difference's share of one core at one round per 5 s.
``--pinned`` pins each rank to one CPU (rank modulo the CPUs), as launchers bind ranks: its
threads are then placed by their affinity, without a stat read. With
``--ranks 0`` (a node at rest: no trainer) the share reads nothing.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import time

from bpfdyno.detection.collector import DetectionCollector
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess
from bpfdyno.sources.irq.collector import IrqCollector

INTERVAL_S = 5.0

#: A rank: ``threads`` threads, the first ``busy`` of them waking every 50 ms (each runs in
#: every round: what the share pays for; little CPU, so the machine's other users keep theirs).
RANK_CODE = """
import sys, threading, time
import os
threads, busy, cpu = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})  # before the threads: they inherit it
def work():
    while True:
        time.sleep(0.05)
def idle():
    time.sleep(3600)
for i in range(threads - 1):  # the main thread is one of them, and sleeps
    threading.Thread(target=work if i < busy else idle, daemon=True).start()
print("ready", flush=True)
null, block = open("/dev/null", "wb", buffering=0), bytes(1 << 20)
while True:  # the main thread moves 1 MiB every 0.1 s, as a rank's all-reduce does
    null.write(block)
    time.sleep(0.1)
"""


def timed(collector: DetectionCollector) -> int:
    start = time.thread_time_ns()
    collector.collect()
    return time.thread_time_ns() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--threads", type=int, default=24, help="threads per rank")
    p.add_argument("--busy", type=int, default=8, help="of them, waking every 50 ms")
    p.add_argument("--pinned", action="store_true", help="each rank on one CPU")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--spacing", type=float, default=0.2, help="seconds between rounds")
    args = p.parse_args()
    irq = IrqCollector()
    irq.start()
    cpus = sorted(os.sched_getaffinity(0))
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK_CODE,
                str(args.threads),
                str(args.busy),
                str(r % len(cpus) if args.pinned else -1),
            ],
            env={**os.environ, "RANK": str(r), "SLURM_JOB_ID": "1"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(args.ranks)
    ]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stopped: its ranks go too
    try:
        for pr in procs:
            assert pr.stdout is not None and pr.stdout.readline().strip() == "ready"
        refs = [RankProcess(pr.pid, "1") for pr in procs]
        scored = DetectionCollector(lambda: refs, EventLog(), "bench", interrupts=irq)
        plain = DetectionCollector(lambda: refs, EventLog(), "bench")
        for _ in range(3):  # environments read, bases taken
            time.sleep(args.spacing)
            scored.collect()
            plain.collect()
        with_share, without = [], []
        for _ in range(args.repeats):
            spent = {True: 0, False: 0}
            for i in range(args.rounds):
                time.sleep(args.spacing)
                first = i % 2 == 0  # alternate which goes first
                spent[first] += timed(scored if first else plain)
                spent[not first] += timed(plain if first else scored)
            with_share.append(spent[True] / args.rounds)
            without.append(spent[False] / args.rounds)
        w, wo = statistics.median(with_share), statistics.median(without)
        shares = [s.interrupt_share for s in scored.sampler.sample(refs, time.monotonic())]
        per_rank = (w - wo) / args.ranks / 1e3 if args.ranks else math.nan
        print(
            f"{args.ranks} ranks x {args.threads} threads ({args.busy} busy"
            f"{', pinned' if args.pinned else ''}), {args.rounds} "
            f"rounds x {args.repeats} repeats, load average {os.getloadavg()[0]:.1f}:\n"
            f"  per round with the interrupt share: {w / 1e3:.0f} us "
            f"({min(with_share) / 1e3:.0f}-{max(with_share) / 1e3:.0f}), without: "
            f"{wo / 1e3:.0f} us ({min(without) / 1e3:.0f}-{max(without) / 1e3:.0f})\n"
            f"  the share's cost: {(w - wo) / 1e3:.0f} us a round, {per_rank:.1f} us per rank; "
            f"at one round per {INTERVAL_S:g} s {(w - wo) / (INTERVAL_S * 1e9) * 100:.4f} % of "
            f"one core\n"
            f"  the ranks' last shares: " + ", ".join(f"{v:.4f}" for v in shares)
        )
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
        irq.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
