"""What the detection's network scores cost: the CPU time one detection round spends on its
ranks' sockets (the net collector's last reading decoded for the ranks' pids, their
connections turned into links, the job's links judged), per round and per rank.

Run as root, as one command: ``python tests/bench/bench_net_scores.py [--ranks 4]
[--others 200] [--rounds 100] [--repeats 5] [--spacing 0.2]``.

It starts the real net collector (BPF), ``--ranks`` processes that look like training ranks
to the detection (``RANK`` in their environment), each on an address of its own
(127.0.0.10+i) with a TCP connection to every other rank (gloo's full mesh) that moves 4 KiB
each way every 50 ms (with write/read, so the detection's hang watch sees the ranks move),
and one process that is no rank holding ``--others`` loopback connections that each move a
few bytes a second (the node's other sockets, which the socket map holds too and the
decoding skips). Then, per round: the net collector reads its maps (not timed: it runs
whether or not the detection reads it), and two detection collectors read the same ranks,
one with the network scores (``connections`` = the net collector) and one without, in
alternating order, each timed with ``time.thread_time_ns`` (the collector thread's own CPU,
so other work on a shared machine does not inflate it). Reported: the median over
``--repeats`` of the mean per-round CPU time of each, their difference per round and per
rank, and that difference's share of one core at one round per 5 s.
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
from bpfdyno.sources.net.collector import NetCollector

INTERVAL_S = 5.0
BASE_PORT = 47100

#: A rank: listens on its address, connects to every higher rank, and on every connection
#: sends 4 KiB every 50 ms and reads what comes.
RANK_CODE = """
import os, socket, sys, threading, time
rank, ranks, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
addr = lambda r: f"127.0.0.{10 + r}"
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((addr(rank), port))
srv.listen(16)
conns = []
def accept():
    for _ in range(rank):
        conns.append(srv.accept()[0])
t = threading.Thread(target=accept)
t.start()
time.sleep(0.5)
for r in range(rank + 1, ranks):
    c = socket.socket()
    c.bind((addr(rank), 0))
    while True:
        try:
            c.connect((addr(r), port))
            break
        except OSError:
            time.sleep(0.1)
    conns.append(c)
t.join()
block = bytes(4096)
def pump(c):
    # write(2)/read(2), not send/recv: they count in /proc/PID/io, as a rank's moves do
    # (the detection's hang watch takes a rank that moves nothing for a hung one).
    fd = c.fileno()
    while True:
        sent = 0
        while sent < len(block):
            sent += os.write(fd, block[sent:])
        got = 0
        while got < len(block):
            got += len(os.read(fd, len(block) - got))
        time.sleep(0.05)
def pump_until_closed(c):
    try:
        pump(c)
    except OSError:
        pass
for c in conns:
    threading.Thread(target=pump_until_closed, args=(c,), daemon=True).start()
print("ready", flush=True)
time.sleep(3600)
"""

#: Not a rank: ``n`` loopback connections, each moving a byte a second.
OTHERS_CODE = """
import socket, sys, time
n = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(n)
pairs = []
for _ in range(n):
    c = socket.create_connection(srv.getsockname())
    pairs.append((c, srv.accept()[0]))
print("ready", flush=True)
while True:
    for a, b in pairs:
        a.send(b"x")
        b.recv(1)
    time.sleep(1.0)
"""


def timed(collector: DetectionCollector) -> int:
    start = time.thread_time_ns()
    collector.collect()
    return time.thread_time_ns() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--others", type=int, default=200, help="other sockets on the node")
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--spacing", type=float, default=0.2, help="seconds between rounds")
    args = p.parse_args()
    net = NetCollector()
    net.start()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RANK_CODE, str(r), str(args.ranks), str(BASE_PORT)],
            env={**os.environ, "RANK": str(r), "SLURM_JOB_ID": "1"},
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(args.ranks)
    ]
    procs.append(
        subprocess.Popen(
            [sys.executable, "-c", OTHERS_CODE, str(args.others)],
            stdout=subprocess.PIPE,
            text=True,
        )
    )
    try:
        for pr in procs:
            assert pr.stdout is not None and pr.stdout.readline().strip() == "ready"
        refs = [RankProcess(pr.pid, "1") for pr in procs[: args.ranks]]
        scored = DetectionCollector(lambda: refs, EventLog(), "bench", connections=net)
        plain = DetectionCollector(lambda: refs, EventLog(), "bench")
        for _ in range(3):  # environments read, counters' bases, every socket seen
            time.sleep(args.spacing)
            net.collect()
            scored.collect()
            plain.collect()
        links = scored.sampler.links
        assert links is not None and not links.error, "the net collector gave no reading"
        with_scores, without = [], []
        for _ in range(args.repeats):
            spent = {True: 0, False: 0}
            for i in range(args.rounds):
                time.sleep(args.spacing)
                net.collect()
                first = i % 2 == 0  # alternate which goes first
                spent[first] += timed(scored if first else plain)
                spent[not first] += timed(plain if first else scored)
            with_scores.append(spent[True] / args.rounds)
            without.append(spent[False] / args.rounds)
        reading = net.connections_of({r.pid for r in refs})
        assert reading is not None
        ranks_conns = len(reading[1])
        w, wo = statistics.median(with_scores), statistics.median(without)
        nets = [scored.detector.net_scores_of("1", r) for r in range(args.ranks)]
        print(
            f"{args.ranks} ranks, {args.others} other sockets, {args.rounds} rounds x "
            f"{args.repeats} repeats, load average {os.getloadavg()[0]:.1f}; the ranks' "
            f"{ranks_conns} connections decoded each round:\n"
            f"  per round with the network scores: {w / 1e3:.0f} us "
            f"({min(with_scores) / 1e3:.0f}-{max(with_scores) / 1e3:.0f}), without: "
            f"{wo / 1e3:.0f} us ({min(without) / 1e3:.0f}-{max(without) / 1e3:.0f})\n"
            f"  the scores' cost: {(w - wo) / 1e3:.0f} us a round, "
            f"{(w - wo) / args.ranks / 1e3:.1f} us per rank; at one round per "
            f"{INTERVAL_S:g} s {(w - wo) / (INTERVAL_S * 1e9) * 100:.4f} % of one core\n"
            f"  the ranks' last scores (RTT ms, retransmits/s): "
            + ", ".join(f"{n.rtt_s * 1000:.3f} {n.retransmits_per_s:.1f}" for n in nets)
        )
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
        net.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
