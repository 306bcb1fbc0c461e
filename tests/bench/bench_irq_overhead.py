"""What the interrupt collector's BPF program (bpf/irq.bpf.c) costs, and what it sees.

Run as root, as one command: ``python tests/bench/bench_irq_overhead.py [--rounds 8]
[--write-doc docs/performance.md]``.

1. Two workloads in interleaved rounds of two kinds, ``off`` (nothing loaded) and ``irq``
   (the interrupt collector started in this process: its four programs on the
   ``irq:softirq_*`` and ``irq:irq_handler_*`` raw tracepoints), the order rotating each
   round so that drift of the shared machine hits both alike:

   * ``pipe``: ``taskset -c 0 perf bench sched pipe -l 200000``, the scheduler benchmark
     the other programs are held to (it raises few softirqs: the programs must not be in
     the scheduler's way);
   * ``packets``: 64-byte UDP datagrams over loopback, sent with sendmmsg in batches of 32
     by a small C program pinned to CPU 0 and received with recvmmsg by one pinned to CPU 1:
     every datagram is one NET_RX softirq run on the sender's CPU (loopback delivers through
     the per-CPU backlog), the worst case for softirq probes. Reported: datagrams per second
     and the sender's CPU time (user + system, its NET_RX runs included) per datagram.

   Medians per kind and the ratio of the medians.
2. ns per event of each program from the kernel's run statistics (``BPF_ENABLE_STATS``; they
   add ~20 ns per run themselves, included) over one packets run, beside the scheduler
   collector's ``bpfdyno_switch`` over one pipe run, measured in the same process.
3. What the program sees: softirq runs counted by it and by the kernel (/proc/softirqs) per
   softirq over an idle window and over a packets run, and its softirq time against
   /proc/stat's over packets runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from bench_sched_overhead import pipe_run
from doc_blocks import write_results

from bpfdyno.ebpf.runstats import BpfRunStats, enable_bpf_stats
from bpfdyno.sources.irq.collector import SOFTIRQS, IrqCollector
from bpfdyno.sources.irq.procfs import read_softirqs
from bpfdyno.sources.sched.collector import SchedCollector

SECTION = "## Interrupt telemetry overhead"
T = TypeVar("T")

#: The packet workload: "recv PORT_FILE" counts datagrams until a 1-byte one; "send PORT N"
#: sends N 64-byte datagrams in sendmmsg batches of 32, then 1-byte end markers for a second.
BLASTER = r"""
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#define BATCH 32
int main(int argc, char **argv) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[BATCH][64];
    struct iovec iov[BATCH];
    struct mmsghdr m[BATCH];
    memset(buf, 'x', sizeof(buf));
    memset(m, 0, sizeof(m));
    for (int i = 0; i < BATCH; i++) {
        iov[i].iov_base = buf[i];
        iov[i].iov_len = 64;
        m[i].msg_hdr.msg_iov = &iov[i];
        m[i].msg_hdr.msg_iovlen = 1;
    }
    if (!strcmp(argv[1], "recv")) {
        int size = 8 << 20;
        setsockopt(s, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
        bind(s, (struct sockaddr *)&a, sizeof(a));
        socklen_t len = sizeof(a);
        getsockname(s, (struct sockaddr *)&a, &len);
        FILE *f = fopen(argv[2], "w");
        fprintf(f, "%d\n", ntohs(a.sin_port));
        fclose(f);
        long got = 0;
        for (;;) {
            int n = recvmmsg(s, m, BATCH, 0, NULL);
            for (int i = 0; i < n; i++) {
                if (m[i].msg_len == 1) { printf("%ld\n", got); return 0; }
                got++;
            }
        }
    }
    a.sin_port = htons(atoi(argv[2]));
    connect(s, (struct sockaddr *)&a, sizeof(a));
    long total = atol(argv[3]);
    for (long sent = 0; sent < total; sent += BATCH) {
        int n = sendmmsg(s, m, BATCH, 0);
        if (n < 0) { perror("sendmmsg"); return 1; }
    }
    /* The end marker, repeated: the receiver's buffer may be full and drop one. */
    for (int i = 0; i < 200; i++) {
        usleep(5000);
        send(s, "e", 1, 0);
    }
    return 0;
}
"""


def build_blaster(into: Path) -> Path:
    src, exe = into / "blaster.c", into / "blaster"
    src.write_text(BLASTER)
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return exe


def packets_run(blaster: Path, count: int, tmp: Path) -> tuple[float, float, float, float]:
    """One packets run: (datagrams per second sent, the sender's CPU ns per datagram, the
    receiver's, fraction received).

    The sender's CPU time holds the NET_RX softirq runs (they run in its context, at the end
    of each send), so the probes' cost shows there; the receiver's depends on how often it
    is scheduled and how many datagrams each wakeup finds.
    """
    port_file = tmp / "port"
    port_file.unlink(missing_ok=True)
    receiver = subprocess.Popen(
        ["taskset", "-c", "1", str(blaster), "recv", str(port_file)],
        stdout=subprocess.PIPE,
        text=True,
    )
    while not port_file.exists() or not port_file.read_text().endswith("\n"):
        time.sleep(0.01)
    sender = subprocess.Popen(
        ["taskset", "-c", "0", str(blaster), "send", port_file.read_text().strip(), str(count)]
    )
    t0 = time.perf_counter()
    assert receiver.stdout is not None
    got = int(receiver.stdout.readline())  # at the first end marker
    t1 = time.perf_counter()
    sent_cpu, recv_cpu = _cpu_s(sender), _cpu_s(receiver)
    return count / (t1 - t0), sent_cpu * 1e9 / count, recv_cpu * 1e9 / count, got / count


def _cpu_s(p: subprocess.Popen[str] | subprocess.Popen[bytes]) -> float:
    """Reap ``p`` (``taskset`` execs the program: same process) and return its CPU seconds."""
    _, _, usage = os.wait4(p.pid, 0)
    p.returncode = 0
    return usage.ru_utime + usage.ru_stime


@contextmanager
def under(kind: str) -> Iterator[IrqCollector | None]:
    if kind == "off":
        yield None
        return
    c = IrqCollector()
    c.start()
    try:
        yield c
    finally:
        c.close()


def interleaved(rounds: int, measure: Callable[[], T]) -> dict[str, list[T]]:
    kinds = ("off", "irq")
    out: dict[str, list[T]] = {k: [] for k in kinds}
    for i in range(rounds):
        for kind in kinds[i % 2 :] + kinds[: i % 2]:
            with under(kind):
                out[kind].append(measure())
        print(
            f"  round {i + 1}/{rounds}: " + " ".join(f"{k}={v[-1]}" for k, v in out.items()),
            flush=True,
        )
    return out


def run_stats(
    program_fds: dict[str, int], work: Callable[[], object]
) -> dict[str, tuple[float, float]]:
    """Program -> (ns per run, runs per second) over ``work()``."""
    stats = BpfRunStats(program_fds)
    fd = enable_bpf_stats()
    try:
        before, t0 = stats.read_counters(), time.monotonic()
        work()
        after, t1 = stats.read_counters(), time.monotonic()
    finally:
        os.close(fd)
    out = {}
    for name, (cnt1, ns1) in after.items():
        cnt0, ns0 = before[name]
        runs = cnt1 - cnt0
        out[name] = ((ns1 - ns0) / runs if runs else float("nan"), runs / (t1 - t0))
    return out


def proc_stat_softirq_ns() -> int:
    """/proc/stat's softirq time, every CPU together (USER_HZ = 100 ticks), in ns."""
    with open("/proc/stat") as f:
        return int(f.readline().split()[7]) * 10_000_000


def softirq_time(c: IrqCollector, work: Callable[[], object]) -> tuple[float, float]:
    """(the program's softirq time, /proc/stat's) over ``work()``, all CPUs, in ms."""

    def bpf() -> int:
        return sum(sum(t.softirq_ns) for t in (c.cpu_interrupt_times() or {}).values())

    b0, p0 = bpf(), proc_stat_softirq_ns()
    work()
    return (bpf() - b0) / 1e6, (proc_stat_softirq_ns() - p0) / 1e6


def seen(c: IrqCollector, work: Callable[[], object]) -> dict[str, tuple[int, int]]:
    """Softirq -> (runs the kernel counted, runs the program counted) over ``work()``."""

    def bpf() -> dict[str, int]:
        times = c.cpu_interrupt_times() or {}
        return {
            name: sum(t.softirq_runs[v] for t in times.values()) for v, name in enumerate(SOFTIRQS)
        }

    def kernel() -> dict[str, int]:
        return {name: sum(per_cpu.values()) for name, per_cpu in read_softirqs().items()}

    b0, k0 = bpf(), kernel()
    work()
    b1, k1 = bpf(), kernel()
    return {name: (k1[name] - k0[name], b1[name] - b0[name]) for name in SOFTIRQS}


def median_row(label: str, unit: str, off: list[float], on: list[float], fmt: str) -> str:
    a, b = statistics.median(off), statistics.median(on)
    return f"| {label} | {a:{fmt}} | {b:{fmt}} | {(b / a - 1) * 100:+.1f} % | {unit} |"


def report(args: argparse.Namespace, tmp: Path) -> str:
    blaster = build_blaster(tmp)
    load = os.getloadavg()[0]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"{args.rounds} interleaved rounds, load average {load:.2f} at the start.",
        "",
        "| workload | off | irq | change | unit |",
        "|---|---|---|---|---|",
    ]
    print("perf bench sched pipe:", flush=True)
    pipe = interleaved(args.rounds, lambda: pipe_run(args.loops))
    print("packets:", flush=True)
    packets = interleaved(args.rounds, lambda: packets_run(blaster, args.packets, tmp))
    lines += [
        median_row(
            "pipe ops/s", "ops/s", [r[0] for r in pipe["off"]], [r[0] for r in pipe["irq"]], ",.0f"
        ),
        median_row(
            "pipe CPU per op",
            "ns",
            [r[1] for r in pipe["off"]],
            [r[1] for r in pipe["irq"]],
            ",.0f",
        ),
        median_row(
            "packets sent",
            "datagrams/s",
            [r[0] for r in packets["off"]],
            [r[0] for r in packets["irq"]],
            ",.0f",
        ),
        median_row(
            "packets: sender CPU per datagram (the NET_RX runs are in it)",
            "ns",
            [r[1] for r in packets["off"]],
            [r[1] for r in packets["irq"]],
            ",.0f",
        ),
    ]
    received = [r[3] for v in packets.values() for r in v]
    lines += [
        "",
        f"Datagrams the receiver got: {min(received) * 100:.1f}-{max(received) * 100:.1f} % of "
        "those sent (the rest were dropped at its full socket buffer, in the sender's NET_RX "
        "runs all the same; the receiver's own CPU time depends on how often it was scheduled "
        "and is not reported).",
    ]
    print("run statistics and coverage:", flush=True)
    irq = IrqCollector()
    irq.start()
    sched = SchedCollector()
    sched.start()
    try:
        assert irq._program is not None and sched._program is not None
        pkt = run_stats(irq._program.program_fds(), lambda: packets_run(blaster, args.packets, tmp))
        sw = run_stats(sched._program.program_fds(), lambda: pipe_run(args.loops))
        idle = seen(irq, lambda: time.sleep(args.idle_s))
        busy = seen(irq, lambda: packets_run(blaster, args.packets, tmp))
        times = [
            softirq_time(irq, lambda: packets_run(blaster, args.packets, tmp))
            for _ in range(args.rounds)
        ]
    finally:
        irq.close()
        sched.close()
    lines += ["", "| program | ns/event | runs/s | during |", "|---|---|---|---|"]
    for name, (ns, rate) in sorted(pkt.items()):
        lines.append(f"| `{name}` | {'-' if ns != ns else f'{ns:.0f}'} | {rate:,.0f} | packets |")
    ns, rate = sw["bpfdyno_switch"]
    lines.append(f"| `bpfdyno_switch` (sched, for comparison) | {ns:.0f} | {rate:,.0f} | pipe |")
    lines += [
        "",
        f"Softirq runs counted by the kernel (/proc/softirqs) and by the program, all CPUs, over "
        f"{args.idle_s:.0f} s idle and over one packets run:",
        "",
        "| softirq | idle: kernel | idle: program | packets: kernel | packets: program |",
        "|---|---|---|---|---|",
    ]
    for name in SOFTIRQS:
        (ki, bi), (kb, bb) = idle[name], busy[name]
        if ki or kb:
            lines.append(f"| {name} | {ki:,} | {bi:,} | {kb:,} | {bb:,} |")
    ratios = sorted(proc / bpf for bpf, proc in times if bpf > 0)
    lines += [
        "",
        f"Softirq time over {len(times)} packets runs, the program's against /proc/stat's "
        "(sampled at each tick on this kernel): "
        + ", ".join(f"{bpf:,.0f} / {proc:,.0f} ms" for bpf, proc in times)
        + (
            f"; /proc/stat at {ratios[0]:.2f}-{ratios[-1]:.2f} times the program's "
            f"(median {statistics.median(ratios):.2f})."
            if ratios
            else "."
        ),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="rounds of each kind")
    parser.add_argument("--loops", type=int, default=200_000, help="perf bench pipe loops")
    parser.add_argument("--packets", type=int, default=500_000, help="datagrams per packets run")
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle window for coverage")
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs")
    with tempfile.TemporaryDirectory(prefix="bd-irq-") as tmp:
        results = report(args, Path(tmp))
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_irq_overhead", results)


if __name__ == "__main__":
    main()
