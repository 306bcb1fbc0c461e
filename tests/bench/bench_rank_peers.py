"""What one look at a rank's connections costs (docs/detection.md, "Across nodes"): the read
of its descriptors and its namespace's TCP tables that finds a torchrun job's other agents.

Run as root: ``python tests/bench/bench_rank_peers.py [--connections 10000] [--rounds 15]``.

A helper process (the "rank") opens ``--connections`` TCP connections to a listener in another
process on this machine (so the namespace's table holds twice as many established entries,
plus the rest of the machine's), then `rank_remotes` is timed on it ``--rounds`` times, and
on a process with no socket for the floor; reported: the median and range, in ms of one
thread. Every address here is loopback, so nothing is kept: the cost measured is the read
and the parse, which is the same whatever the addresses are.
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bpfdyno.app.rank_peers import rank_remotes

HOLDER = """\
import resource, socket, sys, time
n, port = int(sys.argv[1]), int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 64, n + 64))
held = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
print("ready", flush=True)
time.sleep(3600)
"""


def timed(pid: int, rounds: int) -> list[float]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        rank_remotes(Path("/proc"), pid)
        out.append((time.perf_counter() - t0) * 1000)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    n = args.connections
    resource.setrlimit(resource.RLIMIT_NOFILE, (n + 64, n + 64))
    listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(n), str(port)], stdout=subprocess.PIPE, text=True
    )
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    try:
        listener.setblocking(False)
        assert holder.stdout is not None
        while len(accepted) < n:
            try:
                accepted.append(listener.accept()[0])
            except BlockingIOError:
                time.sleep(0.001)
        assert holder.stdout.readline().strip() == "ready"
        got = rank_remotes(Path("/proc"), holder.pid)
        assert not got.truncated
        busy, floor = timed(holder.pid, args.rounds), timed(idle.pid, args.rounds)
        tcp = sum(len(Path(f"/proc/net/{t}").read_text().splitlines()) for t in ("tcp", "tcp6"))
        print(f"rank with {n} connections ({tcp} lines in the namespace's TCP tables):")
        print(
            f"  one look: median {statistics.median(busy):.1f} ms "
            f"(range {min(busy):.1f}-{max(busy):.1f}) over {args.rounds} rounds"
        )
        print(
            f"  a process with no socket: median {statistics.median(floor):.2f} ms "
            f"(range {min(floor):.2f}-{max(floor):.2f})"
        )
    finally:
        for p in (holder, idle):
            p.kill()
            p.wait()
        for s in accepted:
            s.close()
        listener.close()


if __name__ == "__main__":
    main()
