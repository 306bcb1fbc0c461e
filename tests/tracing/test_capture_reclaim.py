"""A traced thread's time in direct memory reclaim (`bpfdyno_creclaimin/out` on vmscan's
memcg and direct reclaim tracepoints): recorded for the traced process only, written as
"memory reclaim" slices around the off-CPU slices inside them, and read back as memory, not
as the rank's own work (`bpfdyno.analysis.evidence`).

Found in a fresh-clone run of the real job: a rank reading a 64 MiB file through a 16 MiB
limit "ran 2.73 s longer than the other ranks" first, the limit second: the kernel reclaims
at the limit on the CPU of the task that charges the page, and nothing timed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from memory_limit import memory_limited
from test_capture_bpf import manager_with, read_back, record

from bpfdyno.tracing.capture.records import KernelTrackRequest, OffCpu, Reclaim, Track
from bpfdyno.tracing.capture.tracks import Window, build_tracks

pytestmark = pytest.mark.root

#: Reads its file through the page cache, 64 KiB at a time, three times over.
READER = r"""
import os, sys
path = sys.argv[1]
print("ready", flush=True)
sys.stdin.readline()
fd = os.open(path, os.O_RDONLY)
size = os.fstat(fd).st_size
for _ in range(3):
    for off in range(0, size, 1 << 16):
        os.pread(fd, 1 << 16, off)
print("done", flush=True)
sys.stdin.readline()
"""

LIMIT = 16 << 20
FILE = 64 << 20


def reader(path: Path) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", READER, str(path)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def go(p: subprocess.Popen[str]) -> None:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline() == "done\n"


def test_a_traced_readers_reclaim_at_its_limit_is_timed_and_read_back_as_memory(
    tmp_path: Path,
) -> None:
    files = [tmp_path / "traced", tmp_path / "other"]
    for path in files:
        with path.open("wb") as f:
            f.write(os.urandom(FILE))
            f.flush()
            os.fsync(f.fileno())  # clean, so that it leaves the page cache: the readers'
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # reads charge them
    manager = manager_with()
    traced, other = (reader(path) for path in files)
    try:
        with memory_limited("traced", traced.pid, LIMIT), memory_limited("other", other.pid, LIMIT):

            def work() -> None:
                go(other)  # untraced, reclaiming as much: nothing of it may appear
                go(traced)

            cap = record(manager, traced.pid, KernelTrackRequest(frozenset({Track.SCHED})), work)
    finally:
        manager.stop()
        for p in (traced, other):
            p.kill()
            p.wait()
    reclaims = [r for r in cap.records if isinstance(r, Reclaim)]
    # Reading 192 MiB through 16 MiB: 34 reclaims of several MiB each here.
    assert len(reclaims) >= 10, (len(reclaims), cap.stats)
    assert {r.tid for r in reclaims} == {traced.pid}, {r.tid for r in reclaims}
    assert {r.pid for r in reclaims} == {0}  # the traced process's own thread
    assert all(0 < r.end_ns - r.start_ns < 1_000_000_000 for r in reclaims)
    assert all(r.comm == "python" or r.comm.startswith("python") for r in reclaims)
    # Written as "memory reclaim" slices on the thread's sched row, around its off-CPU
    # slices (a reclaim may wait for the disk), and read back apart from them.
    first = min(r.start_ns for r in reclaims) - 1_000_000
    last = max(r.end_ns for r in reclaims) + 1_000_000
    # The file's base: the first reclaim's moment less 1 ms, on the capture's wall clock.
    base = cap.offset_ns + first
    built = build_tracks(cap, base, Window(0, last - first, "kineto"), [Track.SCHED])
    events = [json.loads(e) for e in built.events]
    slices = [e for e in events if e.get("name") == "memory reclaim"]
    assert len(slices) == len(reclaims)
    assert {e["args"]["cause"] for e in slices} == {"memory reclaim"}
    facts = read_back(tmp_path / "t.json", base, last - first, events)
    assert len(facts.reclaims) == len(reclaims)
    assert sorted(t for t, _, _ in facts.reclaims) == [traced.pid] * len(reclaims)
    offcpu = [r for r in cap.records if isinstance(r, OffCpu) and r.tid == traced.pid]
    assert len(facts.offcpu) >= len([r for r in offcpu if r.on_ns > first])
    total_ms = sum(r.end_ns - r.start_ns for r in reclaims) / 1e6
    print(f"{len(reclaims)} reclaims, {total_ms:.1f} ms; {len(offcpu)} off-CPU intervals")
