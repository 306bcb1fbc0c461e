"""What the Kineto guard costs a Unix datagram: ``sendto`` with and without it, interleaved.

Usage (as root, on Linux >= 6.7): ``python tests/bench/bench_kineto_guard.py [--rounds 21]
[--sends 50000] [--write-doc docs/performance.md]``

The guard's two programs run on every ``sendto``/``sendmsg`` with an address and every
``connect`` of a Unix socket on the node, so its cost is paid by all of them, not only by
trainers' traffic. Each round sends ``--sends`` datagrams from one socket, for each case,
first without the guard and then with it loaded (order alternating between rounds), and
times the loop (ns per ``sendto``, the Python loop included — the same in both):

* **other traffic**: to an abstract name the guard does not know (its map lookup misses):
  what every other program's Unix datagrams pay;
* **a trainer's own user**: to a guarded name, from its owner (lookup hits, uid compared,
  allowed): what the agent's replies and a user's own traffic pay.

The receiver never reads, so after the first few the kernel answers ``EAGAIN`` (its queue
is full) once the hook has run: the loop measures the hook plus the system call, without the
copy of a delivered datagram (the same with and without the guard). Reported: medians over
the rounds, the difference (the guard's cost per datagram) and the ratio.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from doc_blocks import write_results

from bpfdyno.tracing.ipc.guard import KernelGuard

SECTION = "## Kineto guard"
CASES = ("other traffic", "a trainer's own user")


def _loop(sock: socket.socket, address: bytes, n: int) -> tuple[float, float]:
    """(wall-clock ns, this thread's CPU ns) per sendto over ``n`` sends. The CPU time
    leaves out the time spent waiting for a CPU, which on a crowded machine swamps the
    wall clock; the guard's programs run in the sender's system call, on its CPU time."""
    payload = b"\0" * 48
    send = sock.sendto
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    for _ in range(n):
        try:  # noqa: SIM105 (a context manager per call would swamp what is measured)
            send(payload, address)
        except BlockingIOError:
            pass
    return (time.perf_counter_ns() - t0) / n, (time.thread_time_ns() - c0) / n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--sends", type=int, default=50_000)
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    tag = os.urandom(4).hex()
    names = {
        CASES[0]: f"\0bench-guard-other-{tag}\0".encode(),
        CASES[1]: f"\0dynoconfigclient-bench-{tag}\0".encode(),
    }
    receivers = []
    for address in names.values():
        r = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        r.bind(address)
        receivers.append(r)
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)
    times: dict[tuple[str, bool], list[tuple[float, float]]] = {
        (c, g): [] for c in CASES for g in (False, True)
    }
    for rnd in range(args.rounds):
        for on in (False, True) if rnd % 2 == 0 else (True, False):
            guard = KernelGuard()
            if on:
                guard.load()
                guard.protect(names[CASES[1]], os.geteuid())
            try:
                for case in CASES:
                    times[(case, on)].append(_loop(sender, names[case], args.sends))
            finally:
                guard.close()
    lines = [
        f"{args.rounds} interleaved rounds of {args.sends} `sendto` per case, kernel "
        f"{os.uname().release}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
        "ns per call (median over rounds), by the wall clock and by the sending thread's CPU "
        "time:",
        "",
        "| destination | clock | without the guard | with it | guard's cost | ratio |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for case in CASES:
        for i, clock in enumerate(("wall", "CPU")):
            off = statistics.median(t[i] for t in times[(case, False)])
            on_ = statistics.median(t[i] for t in times[(case, True)])
            lines.append(
                f"| {case} | {clock} | {off:.0f} | {on_:.0f} | {on_ - off:+.0f} | {on_ / off:.3f} |"
            )
    text = "\n".join(lines)
    print(text)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_kineto_guard", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
