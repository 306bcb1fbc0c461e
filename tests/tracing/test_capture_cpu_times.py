"""Each off-CPU record carries the thread's user and system CPU time at its switch-out
(task_struct's utime and stime, read by the capture's sched_switch program): the sched
track writes their differences on each slice (``user_us``, ``system_us``: what the thread
ran in each mode since its previous slice), and the evidence counts the system time before
a disk sleep with the disk (tests/analysis/test_read_cpu_evidence.py).

Real BPF, a real process: it spins in user space for a known CPU time, then reads a file
the page cache does not hold; the kernel charges whole ticks, so the spin's time is checked
to a few ticks, the reads' system time to be there at all."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_capture_bpf import manager_with, read_back, record

from bpfdyno.tracing.capture.records import KernelTrackRequest, OffCpu, Track
from bpfdyno.tracing.capture.tracks import Window, build_tracks

pytestmark = pytest.mark.root

SPIN_S = 0.3
FILE = 64 << 20

#: Sleeps the reads must have made (voluntary switches while reading; the test then counts
#: the disk sleeps the capture recorded).
READ_SLEEPS = 1200

#: Spins for SPIN_S of its own CPU time, sleeps 100 ms, reads its file 16 KiB at a time at
#: random places (4,096 reads, each from the disk) until it has slept READ_SLEEPS times in
#: its reads (a pass at most 8 times, the file dropped from the page cache before each: on
#: one CI machine a pass slept only 223 times, for reasons not found),
#: sleeps 100 ms; prints its CPU time around the spin (CLOCK_THREAD_CPUTIME_ID: exact).
WORKER = rf"""
import os, random, resource, sys, time
print("ready", flush=True)
sys.stdin.readline()
time.sleep(0.1)
t0 = time.thread_time()
while time.thread_time() - t0 < {SPIN_S}:  # a system call: once per 100k iterations
    for _ in range(100_000):
        pass
spun = time.thread_time() - t0
time.sleep(0.1)
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # no readahead: each read goes to the disk
pieces = list(range(0, os.fstat(fd).st_size, 1 << 14))
slept = lambda: resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
before = slept()
for _ in range(8):
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    random.shuffle(pieces)
    for off in pieces:
        os.pread(fd, 1 << 14, off)
    if slept() - before >= {READ_SLEEPS}:
        break
time.sleep(0.1)
print(spun, flush=True)
sys.stdin.readline()
"""


def test_each_slice_says_what_its_thread_ran_in_user_and_kernel_mode(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with data.open("wb") as f:
        f.write(os.urandom(FILE))
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # read from the disk
    manager = manager_with()
    p = subprocess.Popen([sys.executable, "-c", WORKER, str(data)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdin is not None and p.stdout is not None
    try:
        assert p.stdout.readline() == "ready\n"
        spun: list[float] = []

        def work() -> None:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("\n")
            p.stdin.flush()
            spun.append(float(p.stdout.readline()))

        cap = record(manager, p.pid, KernelTrackRequest(frozenset({Track.SCHED})), work)
    finally:
        manager.stop()
        p.kill()
        p.wait()
    mine = sorted(
        (r for r in cap.records if isinstance(r, OffCpu) and r.tid == p.pid),
        key=lambda r: r.off_ns,
    )
    assert mine and all(r.user_ns >= 0 and r.system_ns >= 0 for r in mine)
    # The three 100 ms sleeps mark the phases: the spin runs between the first two.
    sleeps = [i for i, r in enumerate(mine) if r.on_ns - r.off_ns >= 90_000_000 and r.state]
    assert len(sleeps) >= 3, [(r.off_ns, r.on_ns, r.state) for r in mine]
    a, b, c = sleeps[-3:]
    user = mine[b].user_ns - mine[a].user_ns
    system = mine[b].system_ns - mine[a].system_ns
    # Charged by the 250 Hz tick (4 ms) where the kernel accounts by the tick: undisturbed
    # the spin read 300-304 ms for 300-302 ms; beside two busy processes on the two CPUs,
    # 240 ms for 302 ms (preempted at the ticks, it is charged fewer of them). Its few
    # system calls are a tick or two of system time at most.
    assert 0.5 * spun[0] * 1e9 <= user <= 1.2 * spun[0] * 1e9 + 12_000_000, (user, spun)
    assert system <= 0.1 * (user + system) + 8_000_000, (user, system)
    # The reads: the kernel's work filling the page cache from the disk, in system time
    # (4,096 reads or more at 10-40 us each: dozens of ticks), most of it before their sleeps.
    read_system = mine[c].system_ns - mine[b].system_ns
    disk = [r for r in mine[b + 1 : c + 1] if r.state & 0x2]
    assert len(disk) >= 1000, len(disk)
    before_disk = sum(
        mine[i].system_ns - mine[i - 1].system_ns
        for i in range(b + 1, c + 1)
        if mine[i].state & 0x2
    )
    assert 0 < before_disk <= read_system, (before_disk, read_system)
    # Written on each slice as the differences from the thread's previous one, and read
    # back as the slice's system time before it.
    first, last = mine[0].off_ns - 1_000_000, mine[-1].on_ns + 1_000_000
    base = cap.offset_ns + first
    built = build_tracks(cap, base, Window(0, last - first, "kineto"), [Track.SCHED])
    events = [json.loads(e) for e in built.events]
    rows = [e for e in events if e.get("cat") == "bpfdyno.sched" and e["args"]["tid"] == p.pid]
    told = [e["args"] for e in rows if "system_us" in e["args"]]
    assert len(told) == len(mine) - 1  # each interval but the thread's first
    assert sum(a["user_us"] for a in told) == sum(
        (y.user_ns - x.user_ns) // 1000 for x, y in itertools.pairwise(mine)
    )
    facts = read_back(tmp_path / "t.json", base, last - first, events)
    back = sum(
        s.system_before_us for s in facts.offcpu if s.tid == p.pid and s.system_before_us > 0
    )
    assert back == sum(a["system_us"] for a in told)
    print(f"spin {spun[0] * 1e3:.1f} ms: user {user / 1e6:.0f} ms, system {system / 1e6:.0f} ms; "
          f"reads: system {read_system / 1e6:.0f} ms over {len(disk)} disk sleeps")  # fmt: skip


#: Pinned to CPU 0 beside a busy process: reads 256 MiB of /dev/zero at a time (the kernel
#: copies it in a loop that yields the CPU when asked: preempted inside read), then spins
#: in user space (preempted there: in no system call).
CONTENDED = r"""
import os, sys, time
os.sched_setaffinity(0, {0})
print("ready", flush=True)
sys.stdin.readline()
fd = os.open("/dev/zero", os.O_RDONLY)
buf = bytearray(256 << 20)
for _ in range(4):
    os.readv(fd, [buf])
t0 = time.thread_time()
while time.thread_time() - t0 < 0.3:
    for _ in range(100_000):
        pass
print("done", flush=True)
sys.stdin.readline()
"""

HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


def test_a_preemption_says_the_system_call_it_came_inside(tmp_path: Path) -> None:
    manager = manager_with()
    hog = subprocess.Popen([sys.executable, "-c", HOG])
    p = subprocess.Popen([sys.executable, "-c", CONTENDED], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdin is not None and p.stdout is not None
    try:
        assert p.stdout.readline() == "ready\n"

        def work() -> None:
            assert p.stdin is not None and p.stdout is not None
            p.stdin.write("\n")
            p.stdin.flush()
            assert p.stdout.readline() == "done\n"

        cap = record(manager, p.pid, KernelTrackRequest(frozenset({Track.SCHED})), work)
    finally:
        manager.stop()
        for q in (p, hog):
            q.kill()
            q.wait()
    preempted = [r for r in cap.records if isinstance(r, OffCpu) and r.tid == p.pid and r.runnable]
    inside = {r.syscall for r in preempted}
    # readv (19) while copying; in user space (negative: an interrupt's frame) while spinning.
    assert 19 in inside, inside
    assert any(nr < 0 for nr in inside), inside
    first, last = preempted[0].off_ns - 1_000_000, preempted[-1].on_ns + 1_000_000
    built = build_tracks(cap, cap.offset_ns + first, Window(0, last - first, "kineto"),
                         [Track.SCHED])  # fmt: skip
    events = [json.loads(e) for e in built.events]
    said = {
        e["args"].get("syscall")
        for e in events
        if e.get("name") == "runnable: preempted" and e["args"]["tid"] == p.pid
    }
    assert said >= {"readv", None}, said
