"""Waiting for whom, end to end on a real disk: a traced process waits in read(2) on a pipe
for its child (a worker forked before the trace) while the child reads a file from a loop
device under a read limit of 1 MiB/s; the capture program records both, the writer makes the
sched track, the reader's evidence says the main thread waited for that child, which was
blocked on the disk (state D) for most of the wait — woken by the disk's interrupt, whoever
that found running, so counted whoever woke it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_disk_read_state import DATA_BYTES, READ_BPS, slow_disk

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.core.config import load
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import KernelTrackRequest, OffCpu, Track
from bpfdyno.tracing.capture.tracks import Window, build_tracks

pytestmark = [pytest.mark.root, pytest.mark.slow]

__all__ = ["slow_disk"]  # the fixture, used by name
LOADER = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"

#: Forks a worker that, told to, reads the file (not from the page cache) and hands over a
#: byte; the parent waits for that byte in read(2).
PARENT = r"""
import os, sys
path = sys.argv[1]
go_r, go_w = os.pipe()
out_r, out_w = os.pipe()
worker = os.fork()
if worker == 0:
    os.read(go_r, 1)
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    while os.read(fd, 1 << 16):
        pass
    os.write(out_w, b"x")
    os._exit(0)
print("worker", worker, flush=True)
sys.stdin.readline()
os.write(go_w, b"g")
os.read(out_r, 1)
os.waitpid(worker, 0)
print("done", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def manager() -> Iterator[CaptureManager]:
    m = CaptureManager(load(None, []).capture)
    m.start()
    assert m.wait_loaded(120)
    yield m
    m.stop()


def test_a_worker_blocked_on_a_throttled_disk_is_what_the_main_thread_waited_for(
    slow_disk: tuple[Path, Path], manager: CaptureManager, tmp_path: Path
) -> None:
    data, group = slow_disk
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdin is not None and parent.stdout is not None
    try:
        words = parent.stdout.readline().split()
        assert words[0] == "worker"
        worker = int(words[1])
        (group / "cgroup.procs").write_text(f"{worker}\n")  # only the worker's reads limited
        key = CaptureKey("t", parent.pid)
        manager.begin(key, KernelTrackRequest(frozenset({Track.SCHED}), 0.0)).result(30)
        started = time.monotonic()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == "done\n"
        waited = time.monotonic() - started
        capture = manager.end(key).result(60)
    finally:
        parent.kill()
        parent.wait(10)
    # The limit held the worker's read back (2 MiB at 1 MiB/s), and the parent with it.
    assert waited >= 0.8 * DATA_BYTES / READ_BPS, waited
    # The parent's wait for the byte: woken by the worker.
    intervals = [r for r in capture.records if isinstance(r, OffCpu)]
    long = [r for r in intervals if r.tid == parent.pid and r.on_ns - r.off_ns > 500_000_000]
    assert len(long) == 1, intervals
    wait = long[0]
    assert (wait.pid, wait.waker_pid, wait.waker_tid) == (0, worker, worker)
    base_ns = capture.begin_ns + capture.offset_ns
    end_us = (capture.end_ns - capture.begin_ns) / 1000
    built = build_tracks(capture, base_ns, Window(0, round(end_us * 1000), "kineto"), [Track.SCHED])
    # What Kineto would have: the parent's wait inside enumerate(DataLoader), a collective
    # after it.
    wait_end_us = (wait.on_ns - capture.begin_ns) / 1000
    spans = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 0.0, "dur": end_us},
        {"ph": "X", "cat": "user_annotation", "pid": parent.pid, "tid": parent.pid, "ts": 0.0,
         "dur": wait_end_us, "name": LOADER},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": parent.pid,
         "tid": 7, "ts": wait_end_us + 1, "dur": 1.0, "args": {}},
    ]  # fmt: skip
    path = tmp_path / "t.json"
    doc = {"baseTimeNanoseconds": base_ns, "traceEvents": [*spans, *map(json.loads, built.events)]}
    path.write_text(json.dumps(doc))
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    [c] = ev.collectives
    assert c.before[0].cause == "data_loader" and c.before[0].detail == "read", c.before
    assert c.worker_pids == (worker,)
    disk = c.workers[0]
    assert (disk.cause, disk.detail) == ("disk", "read"), c.workers
    # Most of the read (2 MiB at 1 MiB/s) asleep in D, and never more than the wait.
    assert 0.7 * DATA_BYTES / READ_BPS <= disk.seconds <= c.before[0].seconds, c.workers
