"""The verdict on a matrix of real faults: the 4-rank DDP job of
tests/tracing/test_straggler_verdict.py (gloo over TCP, each rank in its own network namespace,
traced through a real agent with the net and sched tracks), each fault at two strengths, on
different ranks, several runs each; and healthy runs, with background load and with windows
that start apart as ``gputrace --job-id`` starts them (no hold). Run as root:

    python tests/bench/bench_verdict_matrix.py [--runs 5] [--classes latency,quota,...]
        [--out results.jsonl]

Long classes run in short invocations, each appending to the same results file:
``--round N`` goes on rotating the faulted ranks from round N.

Per class it reports: right (the faulted rank named with the fault's cause), partial (two
faults, one of them named), wrong (another rank, or the right rank with another cause),
"no straggler", errors (the trace failed), and
any finding whose share of the compared time is over 100 %. Not CI-timed: a run takes 8-60 s,
the whole matrix at 5 runs (150 runs, with the healthy classes named twice) about 50 minutes
on a loaded 2-CPU machine. ``--report results.jsonl`` prints the table of a results file.

Classes and what each expects (`FAULTS`):

- ``latency``: what the rank sends held 5 or 20 ms on its link -> that rank, slow network
  links (``network_latency``);
- ``bandwidth``: what the rank sends capped at 200 or 50 kbit/s (tbf) -> that rank, slow
  network links;
- ``loss``: 5 or 15 % of the TCP packets the rank receives dropped (nftables, at the
  receiver) -> that rank, network loss;
- ``wire-loss``: 5 or 15 % of what the rank sends lost on the wire (seen only as the
  sender's retransmits) -> that rank, network loss;
- ``hog``: a busy process on the rank's CPU at nice -10, -15 or -20 -> that rank, waiting
  for a CPU (rank 2 only: it has CPU 1 to itself; the others share CPU 0);
- ``quota``: the rank's process under a CPU quota of 10, 5 or 3 ms per 100 ms -> that rank,
  throttled by its CPU quota (2 ms was measured before: 5 of 5). The record says how many
  of the cgroup's periods were throttled: the light steps may fit in 10 ms, and then there
  is no fault to find. (Every rank computing 4 ms more per step did not make 10 ms bite on
  the loaded machine, 0 of 63 periods throttled, and left the rank sharing CPU 0 late for
  its own gloo threads: not used.)
- ``slow-read``: each batch delivered 60 or 120 ms late -> that rank, blocked on its read
  (``io_wait``);
- ``slow-worker``: the rank's DataLoader worker waits 60 or 120 ms before each item (when
  this class is among those run — all, by default — the job gives every rank one DataLoader
  worker, for every class of the run) -> that rank, waiting for its DataLoader
  workers (``data_loader``; the detail says they were sleeping: checked in
  tests/tracing/test_dataloader_verdict.py);
- ``more-work``: the rank computes 15 or 40 ms more CPU time each step -> that rank, its
  own work on a CPU (``on_cpu``), no kernel cause;
- ``evict``: the rank reads 100 or 300 samples of 64 KiB of its 64 MiB data file at random
  places each step, the file dropped from the page cache first -> that rank,
  uninterruptible disk reads (``disk``);
- ``disk``: the rank reads 2 MiB (at 20 MB/s) or 1 MiB (at 5 MB/s) each step past the page
  cache from a disk throttled for it (blkio) -> that rank, ``disk``. At 20 MB/s, 1 MiB a
  step was tried first: the throttle lets a read that comes after an idle gap through at
  once up to its slice's allowance (1 MiB reads took 3-114 ms, median 39 ms, against 50 ms
  at the rate), so the rank slept on the disk 4 ms a step and was held back mostly by
  waits for its shared CPU; ``disk-20``: both step sizes at 20 MB/s;
- ``memory``: the rank's process in a memory cgroup of its own limited to 32 or 16 MiB
  while it reads 300 samples of 64 KiB of its 64 MiB data file at random places each step
  through the page cache (which the limit cannot hold: it reclaims its own pages and reads
  them again from the disk; unlimited, the same reads hit the cache) -> that rank, memory
  pressure (``memory``: the cgroup's limit hits and refaults);
- ``irq``: UDP datagrams of 64 bytes whose softirqs take 25 or 45 % of the rank's CPU
  (the rate set per run from one datagram's measured cost: `storm_rate`), steered (RPS) to
  the rank's CPU, sent from the other CPU, each checked against 14000 firewall rules in the
  rank's namespace before it is dropped (`costly_receive`: the work is the receiver's, in its
  CPU's softirqs; the sender's is one small send a datagram), while every rank computes
  4 ms more per step (the storm takes CPU time from work; the job's steps are mostly a
  sleep); that CPU's ``ksoftirqd`` at the weight of nice -20 meanwhile (interrupt threads
  run above normal tasks with ``threadirqs`` or PREEMPT_RT), the sender at nice 0 -> that
  rank, CPU time taken by interrupts (``interrupts``). Each record says what the storm
  cost (``storm``): its rate and one datagram's measured cost, the rank's CPU's softirq
  seconds (its ``ksoftirqd``'s among them) against the sender's CPU seconds — 27-32 % of
  the rank's CPU for 3.5 % of the sender's, measured (2026-12-01). Until 2026-11-29 the
  datagrams were 64 KiB (45 IP fragments) with no firewall: sending cost about what
  receiving did, the sender shared CPU 0 with ranks 0, 1 and 3, and every rank slowed
  alike. Its job has two ranks on each CPU (`IRQ_CPUS`: 0 and 1 on CPU 0, 2 and 3 on CPU
  1), so that no rank has more CPU than another before the storm; the storm is steered to
  rank 2's or rank 3's CPU, CPU 1, and takes from both: ranks 2 and 3 are expected, each
  late with ``interrupts``;
- ``irq-control``: that job and its extra work per step, no storm -> no straggler;
- ``irq-own-cpu``: the storm in the usual job (rank 2 alone on CPU 1, ranks 0, 1 and 3 on
  CPU 0) -> rank 2, ``interrupts``. It seldom is (0 of 12 named until 2026-11-29, see
  docs/tracing.md): rank 2 has a CPU to itself and slack while three ranks share CPU 0, so
  the storm must take two thirds of its CPU to make it the slowest;
- ``two``: 20 ms of latency on one rank and a CPU hog on rank 2 at once -> both named;
- ``healthy``: no fault -> no straggler; ``healthy-load``: with background work beside the
  job at the lowest CPU weight (two busy processes and a disk reader, unpinned, in an idle
  cpu cgroup: `background_load`); ``healthy-apart``: traced without the hold, each rank
  from its own poll; ``healthy-apart-load``: both.

Other runs on the same machine (this bench, the straggler tests) pin their CPU hogs and
steer their interrupt storms to the same CPUs: a run waits until none is left
(`wait_for_no_foreign`), and a run during which one appeared is counted *disturbed*, not
right or wrong. Every process a run starts dies with it, however it is stopped.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tracing"))

from straggler_job import (
    StragglerJob,
    Trace,
    describe,
    foreign_faults,
    run,
    short_base,
    spawn,
    wait_for,
)
from straggler_job import _softirq_thread as softirq_thread

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import Verdict

CPUS = (0, 0, 1, 0)
RANKS = len(CPUS)
ITERATIONS = 60

#: What a right answer is: (rank, finding kind, first cause).
Expected = tuple[int, str, str]
Fault = Callable[[StragglerJob, int, int], AbstractContextManager[object]]

#: Background work beside the job (`background_load`): a busy loop, and reads of a file of
#: its own from the disk (dropped from the page cache before each pass) with a pause between.
BUSY = "import os\nos.nice(19)\nwhile True:\n    pass\n"
READER = """
import os, sys, time
os.nice(19)
path = sys.argv[1]
while True:
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    while os.read(fd, 1 << 20):
        pass
    os.close(fd)
    time.sleep(0.2)
"""
#: The background file's size.
READER_BYTES = 32 << 20


@contextlib.contextmanager
def background_load(job: StragglerJob) -> Iterator[None]:
    """Background work beside the job, as batch work runs beside training: two busy
    processes free to run on either CPU and a process reading a file of its own from the
    disk, at the lowest CPU weight — in a cpu cgroup marked idle (``cpu.idle``: the weight
    of SCHED_IDLE tasks; they take what CPU time nobody else wants). Not nice 19 alone: each
    process this bench starts is in a session of its own, and with autogroups (the Linux
    default) a nice value weighs only inside its session, so a "nice 19" busy loop took a
    CPU from every other session on the machine like any busy process: a CPU hog."""
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.idle").exists():
        root = Path("/sys/fs/cgroup")  # v2: the cpu controller's files in the root's children
    group = root / f"bdm{os.getpid()}-background"
    group.mkdir(exist_ok=True)  # one per invocation, its runs one after the other
    (group / "cpu.idle").write_text("1")
    data = job.base / "background-data"
    if not data.exists():
        with open(data, "wb") as f:
            for _ in range(READER_BYTES >> 20):
                f.write(os.urandom(1 << 20))
    procs = [spawn([sys.executable, "-c", BUSY], job.base / f"busy-{i}.out") for i in range(2)]
    procs.append(spawn([sys.executable, "-c", READER, str(data)], job.base / "reader.out"))
    try:
        for p in procs:
            (group / "cgroup.procs").write_text(str(p.pid))
        yield
    finally:
        for p in procs:
            p.kill()
        # A killed task leaves its cgroup a moment after its parent reaped it (once seen:
        # the next run found the directory there).
        with contextlib.suppress(AssertionError):
            wait_for(lambda: _removed(group), 10, f"{group} to be empty", step=0.1)


def _removed(group: Path) -> bool:
    """Remove the cgroup ``group``: whether it is gone (it may still hold exiting tasks)."""
    with contextlib.suppress(OSError):
        group.rmdir()
    return not group.exists()


#: CPU time every rank computes per step in the ``irq`` class: a storm takes CPU time from
#: a rank's work, and the job's own steps are mostly a sleep (a rank that uses 2 % of its
#: CPU hardly notices a storm that takes 30 %).
IRQ_WORK_MS = 4.0
#: The weight of the rank's CPU's softirq thread during the storm (`irq_storm`): at nice 0
#: the storm took at most about a third of rank 2's CPU, less than the three ranks sharing
#: CPU 0 lose to each other, and no rank was late (0 of 10).
IRQ_SOFTIRQ_NICE = -20
#: The sender's weight. At nice -20 it woke every millisecond above the three ranks sharing
#: its CPU and took it from them: with 64 KiB datagrams (45 fragments each to build) every
#: rank slowed alike; with small ones it cost 4 % of the CPU and still held the ranks' CPU
#: for 37 % of their waits (10 ms a step). Small datagrams cost little enough to send at
#: nice 0. (With the 64 KiB datagrams at nice 0, on the loaded CPU 0, it sent too little to
#: matter: rank 2's interrupt time 1.1 ms a run-up, load 34.)
IRQ_SENDER_NICE = 0
#: The storm's datagrams, in bytes: small, one packet each (no IP fragments), so that the
#: sender's cost per datagram is one system call. Until 2026-11-29 they were 64 KiB (45
#: fragments each), which cost the sender about what they cost the receiver: the sender, on
#: CPU 0 with ranks 0, 1 and 3, slowed those ranks as much as the storm slowed rank 2 (every
#: step 89 ms against 49 ms healthy, no rank late).
IRQ_DATAGRAM = 64
#: Rules of the firewall every storm datagram is checked against on arrival, in the rank's
#: namespace (`costly_receive`): the receiving side's work per packet, in the rank CPU's
#: softirq, as a host firewall, conntrack or a NIC driver's per-packet work is on a real
#: host. The sender's cost stays one small send.
IRQ_RULES = 14000
#: The storm's strengths: the share of the rank's CPU its softirqs are to take. The rate
#: that takes it is set per run from what one datagram costs that CPU then (`storm_rate`):
#: the same 14000 rules cost 2-3 times as much on one host as on another (3000 a second took
#: 35-41 % of the CPU on one, all of it on another, and the job stopped). Fixed rates, used
#: until 2026-12-01: 3000 and 4500 a second (35-56 % on the host they were chosen on).
IRQ_SHARES = (0.25, 0.45)
#: The probe `storm_rate` measures a datagram's cost with: this many a second for this long,
#: against as long without.
IRQ_PROBE_RATE, IRQ_PROBE_S = 1000, 4.0
#: The storm's port on the rank (nothing listens; the firewall drops them after its rules).
IRQ_PORT = 9
#: The ``irq`` class's layout: two ranks on each CPU, so that no rank has more CPU than
#: another before the storm (in `CPUS` rank 2 has CPU 1 to itself while three ranks share
#: CPU 0: a storm had to take two thirds of its CPU to make it the slowest, and never did;
#: that layout stays as ``irq-own-cpu``). A storm steered to CPU 1 takes from both ranks
#: there: both are expected, each late with ``interrupts``.
IRQ_CPUS = (0, 0, 1, 1)
IRQ_CPU_RANKS = (2, 3)
IRQ_STRENGTHS = tuple(f"{x:.0%} of its CPU, {IRQ_RULES} rules" for x in IRQ_SHARES)


@dataclass
class StormCost:
    """What a storm cost whom over a run: CPU seconds the rank's CPU spent in softirqs (all
    of them, its ``ksoftirqd`` thread's among them, and that thread's apart), and the
    sender's CPU seconds — the victim's
    loss against the cost of making it (`/proc/stat`, the threads' own times)."""

    cpu: int
    sender_pid: int
    softirqd_pid: int
    rate: int = 0  # datagrams a second
    us_per_datagram: float = 0.0  # what one cost the rank's CPU in softirqs (the probe's)
    start: tuple[float, float, float] = (0.0, 0.0, 0.0)  # softirq, ksoftirqd, sender
    seconds: float = 0.0
    softirq_s: float = 0.0
    ksoftirqd_s: float = 0.0
    sender_s: float = 0.0
    _t0: float = 0.0

    def read(self) -> tuple[float, float, float]:
        return (
            _cpu_softirq_s(self.cpu),
            _task_cpu_s(self.softirqd_pid),
            _task_cpu_s(self.sender_pid),
        )

    def begin(self) -> None:
        self.start, self._t0 = self.read(), time.monotonic()

    def end(self) -> None:
        now = self.read()
        self.seconds = time.monotonic() - self._t0
        self.softirq_s, self.ksoftirqd_s, self.sender_s = (
            round(b - a, 3) for a, b in zip(self.start, now, strict=True)
        )

    def record(self) -> dict[str, float]:
        return {
            "rate": self.rate,
            "us_per_datagram": round(self.us_per_datagram, 1),
            "seconds": round(self.seconds, 1),
            "victim_softirq_s": self.softirq_s,
            "victim_ksoftirqd_s": self.ksoftirqd_s,
            "sender_s": self.sender_s,
        }


TICK = os.sysconf("SC_CLK_TCK")


def _cpu_softirq_s(cpu: int) -> float:
    """CPU ``cpu``'s time in softirqs taken on the spot (seconds since boot: /proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith(f"cpu{cpu} "):
            return int(line.split()[7]) / TICK
    raise AssertionError(f"no cpu{cpu} in /proc/stat")


def _task_cpu_s(pid: int) -> float:
    """Process or thread ``pid``'s CPU time, user and system (seconds; 0 when gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


@contextlib.contextmanager
def costly_receive(job: StragglerJob, rank: int, rules: int) -> Iterator[None]:
    """Every UDP datagram to `IRQ_PORT` that rank ``rank``'s namespace receives goes through
    ``rules`` firewall rules that never match (each loads a header field and compares it)
    before it is dropped: work per packet in the receiving CPU's softirq. The job's own
    traffic (TCP) leaves the chain at its first rule."""
    checks = "".join("    udp length 1 counter\n" for _ in range(rules))
    ruleset = (
        "table ip bdm_storm {\n  chain pre {\n"
        "    type filter hook prerouting priority -300; policy accept;\n"
        "    meta l4proto != udp accept\n"
        f"    udp dport != {IRQ_PORT} accept\n"
        f"{checks}    drop\n  }}\n}}\n"
    )
    ns = job.network.namespaces[rank]
    run("ip", "netns", "exec", ns, "nft", "-f", "-", stdin=ruleset)
    try:
        yield
    finally:
        with contextlib.suppress(AssertionError):
            run("ip", "netns", "exec", ns, "nft", "delete", "table", "ip", "bdm_storm")


def _softirq_over(cpu: int, seconds: float) -> float:
    """CPU ``cpu``'s softirq seconds over the next ``seconds``."""
    before = _cpu_softirq_s(cpu)
    time.sleep(seconds)
    return _cpu_softirq_s(cpu) - before


def storm_rate(job: StragglerJob, rank: int, share: float) -> tuple[int, float]:
    """The datagrams a second whose softirqs take ``share`` of rank ``rank``'s CPU, and what
    one costs it (seconds): `IRQ_PROBE_RATE` a second for `IRQ_PROBE_S`, against as long
    without (the job's own softirqs), with the firewall in place (`costly_receive`)."""
    cpu = job.cpus[rank]
    quiet = _softirq_over(cpu, IRQ_PROBE_S)
    with job.interrupt_storm(rank, IRQ_PROBE_RATE, IRQ_DATAGRAM, IRQ_SOFTIRQ_NICE, IRQ_SENDER_NICE):
        loud = _softirq_over(cpu, IRQ_PROBE_S)
    per = max(loud - quiet, 1 / TICK) / (IRQ_PROBE_RATE * IRQ_PROBE_S)
    return round(share / per), per


@contextlib.contextmanager
def irq_control(job: StragglerJob, rank: int, strength: int) -> Iterator[None]:
    """The ``irq`` class's job without its storm: every rank's `IRQ_WORK_MS` more per step."""
    with contextlib.ExitStack() as stack:
        for r in range(job.ranks):
            stack.enter_context(job.more_work(r, IRQ_WORK_MS))
        yield


@contextlib.contextmanager
def irq_storm(job: StragglerJob, rank: int, strength: int) -> Iterator[StormCost]:
    """Every rank computes `IRQ_WORK_MS` more per step, and small datagrams, each costly to
    receive (`costly_receive`), are steered to rank ``rank``'s CPU at the rate whose softirqs
    take `IRQ_SHARES` of it (`storm_rate`); yields what the storm cost the rank's CPU and the
    sender (measured over the run)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(irq_control(job, rank, strength))
        stack.enter_context(costly_receive(job, rank, IRQ_RULES))
        rate, per = storm_rate(job, rank, IRQ_SHARES[strength])
        flood = stack.enter_context(
            job.interrupt_storm(rank, rate, IRQ_DATAGRAM, IRQ_SOFTIRQ_NICE, IRQ_SENDER_NICE)
        )
        cost = StormCost(job.cpus[rank], flood.pid, softirq_thread(job.cpus[rank]), rate, per * 1e6)
        cost.begin()
        try:
            yield cost
        finally:
            cost.end()


@contextlib.contextmanager
def two_faults(job: StragglerJob, rank: int, strength: int) -> Iterator[None]:
    with job.slow_link(rank, 20.0), job.cpu_hog(2, -20 if strength else -10):
        yield


@dataclass(frozen=True)
class FaultClass:
    name: str
    ranks: tuple[int, ...]  # the runs go round these
    strengths: tuple[str, ...]  # the runs go through each
    inject: Fault | None
    expect: Callable[[int], list[Expected]]  # per faulted rank: the findings expected
    aligned: bool = True
    tracks: str = "net,sched"
    #: The CPU each rank is pinned to: the class's job has this many ranks.
    cpus: tuple[int, ...] = CPUS


def late(cause: str) -> Callable[[int], list[Expected]]:
    return lambda rank: [(rank, "late", cause)]


FAULTS = [
    FaultClass(
        "latency", (3, 1, 0), ("5 ms", "20 ms"),
        lambda j, r, s: j.slow_link(r, (5.0, 20.0)[s]),
        lambda r: [(r, "latency", "network_latency")],
    ),
    FaultClass(
        "bandwidth", (1, 3, 0), ("200 kbit/s", "50 kbit/s"),
        lambda j, r, s: j.bandwidth_cap(r, ("200kbit", "50kbit")[s]),
        lambda r: [(r, "latency", "network_latency")],
    ),
    FaultClass(
        "loss", (1, 3, 0), ("5 %", "15 %"),
        lambda j, r, s: j.packet_loss(r, (50, 150)[s]),
        lambda r: [(r, "network", "network_loss")],
    ),
    FaultClass(
        "wire-loss", (3, 1, 0), ("5 %", "15 %"),
        lambda j, r, s: j.slow_link(r, 0.0, (0.05, 0.15)[s]),
        lambda r: [(r, "network", "network_loss")],
    ),
    FaultClass(
        "hog", (2,), ("nice -10", "nice -15", "nice -20"),
        lambda j, r, s: j.cpu_hog(r, (-10, -15, -20)[s]),
        late("cpu_wait"),
    ),
    FaultClass(
        "quota", (1, 3, 0, 2), ("10 ms / 100 ms", "5 ms / 100 ms", "3 ms / 100 ms"),
        lambda j, r, s: j.cpu_quota(r, (10_000, 5000, 3000)[s]),
        late("cpu_quota"),
    ),
    FaultClass(
        "slow-read", (3, 1, 0, 2), ("60 ms", "120 ms"),
        lambda j, r, s: j.slow_batches(r, (60.0, 120.0)[s]),
        late("io_wait"),
    ),
    FaultClass(
        "slow-worker", (3, 1, 0, 2), ("60 ms", "120 ms"),
        lambda j, r, s: j.slow_worker(r, (60.0, 120.0)[s]),
        late("data_loader"),
    ),
    FaultClass(
        "more-work", (1, 3, 0, 2), ("15 ms", "40 ms"),
        lambda j, r, s: j.more_work(r, (15.0, 40.0)[s]),
        late("on_cpu"),
    ),
    FaultClass(
        "evict", (3, 1, 0, 2), ("100 x 64 KiB a step", "300 x 64 KiB a step"),
        lambda j, r, s: j.evicted_reads(r, samples=(100, 300)[s]),
        late("disk"),
    ),
    FaultClass(
        "disk", (1, 3, 0, 2), ("20 MB/s, 2 MiB a step", "5 MB/s, 1 MiB a step"),
        lambda j, r, s: j.throttled_disk(r, (20 << 20, 5 << 20)[s], (2 << 20, 1 << 20)[s]),
        late("disk"),
    ),
    FaultClass(
        "disk-20", (1, 3, 0, 2), ("20 MB/s, 1 MiB a step", "20 MB/s, 2 MiB a step"),
        lambda j, r, s: j.throttled_disk(r, 20 << 20, (1 << 20, 2 << 20)[s]),
        late("disk"),
    ),
    FaultClass(
        "memory", (2, 0, 3, 1), ("32 MiB, 300 x 64 KiB a step", "16 MiB, 300 x 64 KiB a step"),
        lambda j, r, s: j.memory_limit(r, (32 << 20, 16 << 20)[s], samples=300),
        late("memory"),
    ),
    FaultClass(
        "irq", (2, 3), IRQ_STRENGTHS,
        irq_storm,
        lambda r: [(k, "late", "interrupts") for k in IRQ_CPU_RANKS],
        tracks="net,sched,fabric",
        cpus=IRQ_CPUS,
    ),
    FaultClass(
        "irq-control", (-1,), ("", ""), irq_control, lambda r: [], tracks="net,sched,fabric",
        cpus=IRQ_CPUS,
    ),
    FaultClass(
        "irq-own-cpu", (2,), IRQ_STRENGTHS,
        irq_storm,
        late("interrupts"),
        tracks="net,sched,fabric",
    ),
    FaultClass(
        "two", (3, 1, 0), ("+ hog nice -10", "+ hog nice -20"),
        two_faults,
        lambda r: [(r, "latency", "network_latency"), (2, "late", "cpu_wait")],
    ),
    FaultClass("healthy", (-1,), ("", ""), None, lambda r: []),
    FaultClass(
        "healthy-load", (-1,), ("", ""), lambda j, r, s: background_load(j), lambda r: []
    ),
    FaultClass("healthy-apart", (-1,), ("", ""), None, lambda r: [], aligned=False),
    FaultClass(
        "healthy-apart-load", (-1,), ("", ""), lambda j, r, s: background_load(j),
        lambda r: [], aligned=False,
    ),
]  # fmt: skip


def findings(trace: Trace) -> set[Expected]:
    """What the verdict named: (rank, kind, first cause) per finding."""
    return {
        (f.rank, f.kind, f.causes[0].cause if f.causes else "") for f in trace.verdict.stragglers
    }


def sched_lost(trace: Trace) -> bool:
    """Whether the sched track lost every rank's main thread: no rank's step shows any time
    off a CPU (a rank sleeps 30 ms of each step). Seen once, after the eviction class, for
    the rest of that job's life; such runs are flagged, and the job started afresh."""
    return all(
        not any(
            p.seconds > 0
            for p in ev.steps.parts
            if p.cause not in ("on_cpu", "collectives", "gpu_busy", "interrupts")
        )
        for ev in trace.evidence.values()
    )


#: How long a run waits for another run's CPU hog or interrupt storm to end before it starts.
FOREIGN_WAIT = 600.0


class ForeignWatch:
    """Another run's faults (`foreign_faults`) seen while this run traced: polled from a
    thread of its own, so a hog that comes and goes within a run is seen too."""

    def __init__(self) -> None:
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.25):
            self.seen.update(foreign_faults())

    def __enter__(self) -> ForeignWatch:
        self.seen.update(foreign_faults())
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seen.update(foreign_faults())


def wait_for_no_foreign(timeout: float = FOREIGN_WAIT) -> None:
    """Refuse to run while another run's hog or storm is on the machine: wait for it to end,
    up to ``timeout`` seconds, then fail naming it."""
    deadline = time.monotonic() + timeout
    said = False
    while found := foreign_faults():
        if time.monotonic() > deadline:
            raise SystemExit(
                f"another run's faults are still on this machine after {timeout:g} s: "
                f"{found} (pid: what); stop that run, or kill them, and start again"
            )
        if not said:
            print(f"waiting for another run's faults to end: {found}", flush=True)
            said = True
        time.sleep(1.0)


def keep_lost(trace: Trace, job: StragglerJob, into: Path) -> None:
    """The files of a run whose sched track was lost, and the agent's log, for a look."""
    into.mkdir(parents=True, exist_ok=True)
    for path in [*trace.paths, str(job.agent.log)]:
        with contextlib.suppress(OSError):
            shutil.copy(path, into)


def judge(trace: Trace, expected: list[Expected]) -> str:
    """``right``, ``wrong``, ``partial`` (two faults, one named right) or ``none`` (no
    straggler)."""
    return judge_verdict(trace.verdict, expected)


def judge_verdict(verdict: Verdict, expected: list[Expected]) -> str:
    found = {(f.rank, f.kind, f.causes[0].cause if f.causes else "") for f in verdict.stragglers}
    if not expected:
        return "right" if not found else "wrong"
    if not found:
        return "none"
    if set(expected) <= found:
        return "right"
    return "partial" if set(expected) & found else "wrong"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--runs", type=int, default=5, help="runs per class and strength")
    ap.add_argument("--classes", default="", help="comma list (default: all)")
    ap.add_argument("--out", default="verdict-matrix.jsonl", help="one JSON line per run")
    ap.add_argument("--describe", action="store_true", help="print each run's evidence")
    ap.add_argument(
        "--keep-lost",
        default="",
        metavar="DIR",
        help="copy the trace files and the agent's log of runs whose sched track was lost here",
    )
    ap.add_argument(
        "--report", default="", metavar="JSONL", help="only print the table of a results file"
    )
    ap.add_argument(
        "--keep", default="", metavar="DIR", help="keep each run's trace files under DIR"
    )
    ap.add_argument(
        "--rejudge",
        action="store_true",
        help="with --report: judge each run's kept trace files again with this checkout's "
        "analysis (a rule changed since the runs)",
    )
    ap.add_argument(
        "--round",
        type=int,
        default=0,
        help="number this invocation's rounds from ROUND: the faulted ranks go on rotating "
        "from an earlier invocation's (one class at a time, in short invocations)",
    )
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            ran = [json.loads(line) for line in f if line.strip()]
        report([rejudge(r) for r in ran] if args.rejudge else ran)
        return
    wait_for_no_foreign()
    # A class named twice runs twice per round (more healthy runs: healthy,healthy,...).
    names = [n for n in args.classes.split(",") if n]
    by_name = {c.name: c for c in FAULTS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        ap.error(f"unknown classes {unknown}: choose from {', '.join(by_name)}")
    classes = [by_name[n] for n in names] if names else list(FAULTS)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    # A stop (SIGTERM) closes the job: its namespaces, agent and ranks go with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # A DataLoader worker per rank only when a class needs one (the other classes' job as is).
    workers = int(any(c.name == "slow-worker" for c in classes))
    jobs = Jobs(workers)
    records: list[dict[str, object]] = []
    traced = 0
    try:
        with open(args.out, "a") as out:
            for run in range(args.runs):
                if run:  # each round on a fresh job: what a round did to it stays there
                    jobs.close()
                for c in classes:
                    job = jobs.of(c.cpus)
                    strengths = range(len(c.strengths)) if c.strengths[0] else range(1)
                    for s in strengths:
                        rank = c.ranks[(args.round + run + s) % len(c.ranks)]
                        traced += 1
                        blind = False
                        started = time.monotonic()
                        outcome, headline, shares = "error", "", []
                        named: list[Expected] = []
                        throttled: dict[int, list[str]] = {}
                        kept: list[str] = []
                        wait_for_no_foreign()
                        watch = ForeignWatch()
                        incomplete: dict[int, str] = {}
                        injected: object = None
                        try:
                            ctx = (
                                c.inject(job, rank, s)
                                if c.inject is not None
                                else contextlib.nullcontext()
                            )
                            with watch, ctx as injected:
                                trace = job.trace(
                                    f"{c.name}-{s}-{args.round + run}-{traced}",
                                    ITERATIONS,
                                    aligned=c.aligned,
                                    tracks=c.tracks,
                                )
                            if args.keep:
                                kept = keep(trace, Path(args.keep))
                            outcome = judge(trace, c.expect(rank))
                            blind = sched_lost(trace)
                            # Why a rank's sched track misses intervals, as its file says.
                            incomplete = {
                                k: ev.sched_incomplete
                                for k, ev in trace.evidence.items()
                                if ev.sched_incomplete
                            }
                            if blind and args.keep_lost:
                                keep_lost(trace, job, Path(args.keep_lost) / trace.name)
                            if args.describe:
                                print(describe(trace), flush=True)
                            headline = trace.verdict.headline
                            step_ms = job_step_ms(trace.verdict)
                            shares = [f.share for f in trace.verdict.stragglers]
                            named = sorted(findings(trace))
                            throttled = {
                                k: [f"{q.throttled_periods}/{q.periods} {q.throttled_seconds:.3f} s"
                                    for q in ev.cpu_quotas]
                                for k, ev in trace.evidence.items() if ev.cpu_quotas
                            }  # fmt: skip
                        except Exception as e:  # one run's failure is counted, not fatal
                            headline = f"{type(e).__name__}: {str(e)[:300]}"
                            step_ms = None
                            blind = True  # start the job afresh
                        judged = outcome
                        if watch.seen and outcome != "error":
                            # Another run's hog or storm shared the machine: what it did to
                            # the ranks is not this class's fault; counted apart.
                            outcome = "disturbed"
                        if blind:
                            # A failed run may leave the job stuck (a rank mid-step); an
                            # agent whose capture lost the ranks' threads stays so: a fresh job.
                            jobs.close()
                            job = jobs.of(c.cpus)
                        record = {
                            "class": c.name, "strength": c.strengths[s], "rank": rank,
                            "cpus": list(c.cpus),
                            "run": args.round + run, "outcome": outcome, "shares": shares,
                            "named": named,
                            "throttled": throttled, "sched_lost": blind and outcome != "error",
                            "sched_incomplete": incomplete,
                            "headline": headline, "step_ms": step_ms,
                            "seconds": round(time.monotonic() - started, 1),
                            "load": os.getloadavg()[0], "judged": judged,
                            "foreign": {str(k): v for k, v in watch.seen.items()},
                            "expected": c.expect(rank), "kept": kept,
                        }  # fmt: skip
                        if isinstance(injected, StormCost):
                            record["storm"] = injected.record()
                        records.append(record)
                        out.write(json.dumps(record) + "\n")
                        out.flush()
                        print(
                            f"{c.name} {c.strengths[s]} rank {rank}: {outcome}: {headline}",
                            flush=True,
                        )
    finally:
        jobs.close()
    report(records)


class Jobs:
    """The bench's job: one at a time (two would share the two CPUs), started when a class
    needs it, of the CPU layout that class asks for (`FaultClass.cpus`); a class of another
    layout closes it and starts its own."""

    def __init__(self, loader_workers: int) -> None:
        self._workers = loader_workers
        self._job: StragglerJob | None = None

    def of(self, cpus: tuple[int, ...]) -> StragglerJob:
        """The started job whose ranks are pinned to ``cpus``."""
        if self._job is not None and tuple(self._job.cpus) != cpus:
            self.close()
        if self._job is None:
            job = StragglerJob(
                short_base(), len(cpus), cpus, interrupts=True, loader_workers=self._workers
            )
            self._job = job
            job.start()
        return self._job

    def close(self) -> None:
        if self._job is not None:
            job, self._job = self._job, None
            job.close()
            shutil.rmtree(job.base, ignore_errors=True)


def keep(trace: Trace, where: Path) -> list[str]:
    """Copy the run's trace files under ``where`` (a directory per run): they can be
    judged again with a changed rule (``--report --rejudge``)."""
    d = where / trace.name
    d.mkdir(parents=True, exist_ok=True)
    out = []
    for path in trace.paths:
        shutil.copy(path, d / Path(path).name)
        out.append(str(d / Path(path).name))
    return out


def rejudge(record: dict[str, object]) -> dict[str, object]:
    """The run judged again from its kept files with this checkout's analysis (a run kept
    nothing, or was disturbed or failed: as it was)."""
    kept = [str(p) for p in record.get("kept", [])]  # type: ignore[attr-defined]
    if not kept or record["outcome"] in ("error", "disturbed"):
        return record
    evidence = [e for p in kept if (e := summarize_file(p).evidence) is not None]
    verdict = compare(evidence)
    expected: list[Expected] = [
        (int(x[0]), str(x[1]), str(x[2]))
        for x in record["expected"]  # type: ignore[attr-defined]
    ]
    found = {(f.rank, f.kind, f.causes[0].cause if f.causes else "") for f in verdict.stragglers}
    return record | {
        "outcome": judge_verdict(verdict, expected),
        "shares": [f.share for f in verdict.stragglers],
        "named": sorted(found),
        "headline": verdict.headline,
        "step_ms": job_step_ms(verdict),
    }


def job_step_ms(verdict: Verdict) -> float | None:
    """The job's step (ms): the median of its ranks' median steps (None: no rank had one)."""
    steps = [t.step_seconds for t in verdict.ranks if t.step_seconds > 0]
    return round(statistics.median(steps) * 1000, 1) if steps else None


def step_of(record: dict[str, object]) -> float | None:
    """A run's job step (ms): recorded, or (records from before it was) the one a verdict of
    no straggler states in its headline ("... of a 58.8 ms step")."""
    if isinstance(record.get("step_ms"), (int, float)):
        return float(record["step_ms"])  # type: ignore[arg-type]
    m = re.search(r"of a ([0-9.]+) (µs|ms|s) step", str(record.get("headline", "")))
    if m is None:
        return None
    return float(m[1]) * {"µs": 1e-3, "ms": 1.0, "s": 1e3}[m[2]]


def _layout(record: dict[str, object]) -> tuple[int, ...]:
    """The CPUs a run's ranks were pinned to (records from before it was kept: `CPUS`)."""
    cpus = record.get("cpus")
    return tuple(int(c) for c in cpus) if isinstance(cpus, list) else CPUS


def _unfaulted(record: dict[str, object]) -> bool:
    """A run without a fault: a healthy class, or a class's control (its job, no fault)."""
    name = str(record["class"])
    return name.startswith("healthy") or name.endswith("-control")


def bite(records: list[dict[str, object]]) -> None:
    """Did each fault slow the job at all? A fault that leaves the job's step within what
    the runs without a fault took on the same layout of CPUs (the healthy classes; a class
    with a layout of its own, its control) cannot be named, and "no straggler" is then the
    true answer: per class and strength, the job's median step against the slowest such
    run's, and the runs called "no straggler" whose job was not slower than that."""
    unfaulted: dict[tuple[int, ...], list[float]] = defaultdict(list)
    for r in records:
        if _unfaulted(r) and (x := step_of(r)):
            unfaulted[_layout(r)].append(x)
    if not unfaulted:
        print("\nno run without a fault had a step: the faults' effect is not judged")
        return
    for layout, steps in unfaulted.items():
        print(
            f"\nruns without a fault, ranks on CPUs {layout}: job step median "
            f"{statistics.median(steps):.1f} ms, {min(steps):.1f}-{max(steps):.1f} ms "
            f"({len(steps)} runs)"
        )
    print("\n| class | strength | runs with a step | job step, ms (median, range) "
          "| slower than every run without a fault | no straggler, not slower |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    rows: dict[tuple[str, str], list[dict[str, object]]] = defaultdict(list)
    for r in records:
        if not _unfaulted(r) and r["outcome"] != "disturbed":
            rows[(str(r["class"]), str(r["strength"]))].append(r)
    for (name, strength), runs in rows.items():
        steps = [(x, r) for r in runs if (x := step_of(r)) is not None]
        ceilings = unfaulted.get(_layout(runs[0]))
        if not steps or not ceilings:
            continue
        ceiling = max(ceilings)
        values = [x for x, _ in steps]
        slower = sum(1 for x in values if x > ceiling)
        quiet_none = sum(1 for x, r in steps if x <= ceiling and r["outcome"] == "none")
        print(
            f"| {name} | {strength or '-'} | {len(steps)} of {len(runs)} | "
            f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}) | "
            f"{slower} | {quiet_none} |"
        )


def report(records: list[dict[str, object]]) -> None:
    """The table of outcomes per class and strength (docs/tracing.md's), from the runs'
    records, in the order the classes were first run."""
    rows: dict[tuple[str, str], list[dict[str, object]]] = defaultdict(list)
    for r in records:
        rows[(str(r["class"]), str(r["strength"]))].append(r)
    print(
        "\n| class | strength | faulted ranks | runs | right | partial | wrong | no straggler "
        "| errors | sched track lost | disturbed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (name, strength), runs in rows.items():
        t = Counter(str(r["outcome"]) for r in runs)
        ranks = ", ".join(str(x) for x in sorted({int(str(r["rank"])) for r in runs}) if x >= 0)
        print(
            f"| {name} | {strength or '-'} | {ranks or '-'} | {len(runs)} | {t['right']} | "
            f"{t['partial']} | {t['wrong']} | {t['none']} | {t['error']} | "
            f"{sum(1 for r in runs if r.get('sched_lost'))} | {t['disturbed']} |"
        )
    over = [r for r in records if any(float(x) > 1.0 for x in r["shares"])]  # type: ignore[attr-defined]
    print(f"\nfindings with a share over 100 %: {len(over)}")
    reasons = Counter(
        why.split(":")[0]
        for r in records
        for why in dict(r.get("sched_incomplete") or {}).values()  # type: ignore[call-overload]
    )
    incomplete = sum(1 for r in records if r.get("sched_incomplete"))
    print(
        f"runs with a rank's sched track incomplete by its file's account: {incomplete}"
        + (f" ({', '.join(f'{n}x {w}' for w, n in reasons.most_common())})" if reasons else "")
    )
    loads = [float(str(r["load"])) for r in records]
    if loads:
        print(f"load average during the runs: {min(loads):.1f}-{max(loads):.1f}")
    bite(records)
    storm_costs(records)


def storm_costs(records: list[dict[str, object]]) -> None:
    """What each storm strength cost whom (`StormCost`, per second of the fault): the
    rank's CPU in softirqs, on the spot and in its ``ksoftirqd``, against the sender's CPU
    time — the storm must cost its victim far more than its maker."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for r in records:
        if isinstance(r.get("storm"), dict) and r["storm"]["seconds"]:  # type: ignore[index]
            rows[str(r["strength"])].append(r["storm"])  # type: ignore[arg-type]
    if not rows:
        return
    print(
        "\n| storm | runs | rank's CPU in softirqs, % (median) | of it in ksoftirqd, % "
        "| sender's CPU, % | victim / sender |"
    )
    print("|---|---|---|---|---|---|")
    for strength, costs in rows.items():
        # The CPU's softirq time counts its ksoftirqd's too: the kernel's tick accounting
        # charges a tick in a softirq to softirq whichever task runs it (and to the task).
        victim = statistics.median(c["victim_softirq_s"] / c["seconds"] for c in costs)
        thread = statistics.median(c["victim_ksoftirqd_s"] / c["seconds"] for c in costs)
        sender = statistics.median(c["sender_s"] / c["seconds"] for c in costs)
        print(
            f"| {strength} | {len(costs)} | {victim:.0%} | {thread:.0%} | {sender:.1%} | "
            f"{victim / sender if sender else float('inf'):.1f} |"
        )


if __name__ == "__main__":
    main()
