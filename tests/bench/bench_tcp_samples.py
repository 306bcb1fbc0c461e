"""What sampling traced processes' TCP connections costs (``[capture] net_tcp_sample_us``).
Run as root: ``python tests/bench/bench_tcp_samples.py [--rounds 9] [--trips 20000]``.

A child ping-pongs 1 KiB messages with an echo server over loopback (a send and a blocking
receive per round trip: the socket-call functions run twice per trip, in each process), and
reports the mean round trip of ``--trips`` trips. Rounds interleave, order rotated:

- ``off``: nothing traced (the capture functions are detached);
- ``net``: the child traced with the net track, TCP samples off (``net_tcp_sample_us = 0``);
- ``net+tcp``: the same with samples at the default 5 ms (at most one per connection per
  5 ms);
- ``net+tcp every call``: ``net_tcp_sample_us = 1``, a sample at every call (a loopback
  round trip takes longer than 1 us): the worst case, the bound on what a sample costs.

Each mode's median round trip, and its ratio to ``off``. The machine is a shared 2-vCPU VM;
treat ratios as indicative.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

# Run as a script: its directory (tests/bench) is on the path.
from bench_capture import ask, child, echo_server

from bpfdyno.core.config import load
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import KernelTrackRequest, TcpSample, Track

NET = KernelTrackRequest(frozenset({Track.NET}), 0.0)

PINGPONG = r"""
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
msg = b"p" * 1024
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    t0 = time.perf_counter()
    for _ in range(n):
        c.sendall(msg)
        got = 0
        while got < 1024:
            got += len(c.recv(1024 - got))
    print((time.perf_counter() - t0) / n * 1e6, flush=True)
"""


def manager(sample_us: int) -> CaptureManager:
    m = CaptureManager(load(None, [("capture.net_tcp_sample_us", str(sample_us))]).capture)
    m.start()
    assert m.wait_loaded(120)
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--trips", type=int, default=20000)
    args = ap.parse_args()
    print(
        f"{time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"load average {os.getloadavg()[0]:.1f}\n"
    )
    managers = {"net": manager(0), "net+tcp": manager(5000), "net+tcp every call": manager(1)}
    modes = ["off", *managers]
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    samples: dict[str, int] = {}
    try:
        with echo_server() as port, child(PINGPONG, str(port), stdin=True) as p:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            ask(p, str(args.trips // 4))  # warm-up
            for r in range(args.rounds):
                for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:
                    m = managers.get(mode)
                    key = CaptureKey(f"bench-{r}", p.pid)
                    if m is not None:
                        m.begin(key, NET).result(30)
                    times[mode].append(float(ask(p, str(args.trips))))
                    if m is not None:
                        cap = m.end(key).result(60)
                        samples[mode] = sum(isinstance(x, TcpSample) for x in cap.records)
    finally:
        for m in managers.values():
            m.stop()
    base = statistics.median(times["off"])
    print(f"{args.rounds} rounds of {args.trips} round trips of 1 KiB over loopback:\n")
    print("| mode | median round trip (us) | ratio to off | TCP samples in the last round |")
    print("|---|---|---|---|")
    for mode in modes:
        med = statistics.median(times[mode])
        print(f"| {mode} | {med:.2f} | {med / base:.3f} | {samples.get(mode, 0)} |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
