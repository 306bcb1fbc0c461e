"""A read(2) that waits for a throttled disk is named a disk wait, end to end: a real
process reads a file on a real block device (a loop device under a blkio read limit of
1 MiB/s) and then a pipe, while the capture program records its off-CPU intervals in the
kernel; the writer makes its sched track, the reader summarises the file. The disk read
sleeps in state D and must not be called a socket, pipe or event wait; the pipe read
sleeps in S and is one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.core.config import load
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import KernelTrackRequest, Track
from bpfdyno.tracing.capture.tracks import Window, build_tracks

pytestmark = [pytest.mark.root, pytest.mark.slow]

BLKIO = Path("/sys/fs/cgroup/blkio")  # cgroup v1
UNIFIED = Path("/sys/fs/cgroup")  # cgroup v2, where the io controller is enabled
READ_BPS = 1 << 20
DATA_BYTES = 2 << 20  # two seconds of reading at the limit

#: Reads the file once its pages are evicted, then a line from stdin (a pipe).
READER = r"""
import os, sys
path = sys.argv[1]
sys.stdin.readline()  # go
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # not in the page cache: from the disk
while os.read(fd, 1 << 16):
    pass
os.close(fd)
print("read", flush=True)
sys.stdin.readline()  # blocks on the pipe until the test writes
print("done", flush=True)
"""


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def slow_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a file on a loop device, a cgroup whose reads of that device are limited)."""
    v1 = (BLKIO / "blkio.throttle.read_bps_device").exists()
    subtree = UNIFIED / "cgroup.subtree_control"
    v2 = subtree.exists() and "io" in subtree.read_text().split()
    if not (v1 or v2):
        pytest.fail(
            "this test limits a disk's reads with a cgroup: it needs the v1 blkio controller "
            "at /sys/fs/cgroup/blkio or the v2 io controller enabled at /sys/fs/cgroup"
        )
    image = tmp_path / "disk.img"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    device = run("losetup", "--find", "--show", str(image))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    group = (BLKIO if v1 else UNIFIED) / f"bpfdyno-test-{os.getpid()}"
    try:
        run("mkfs.ext4", "-q", device)
        run("mount", device, str(mnt))
        data = mnt / "data"
        data.write_bytes(os.urandom(DATA_BYTES))
        os.sync()
        group.mkdir()
        rdev = os.stat(device).st_rdev
        dev = f"{os.major(rdev)}:{os.minor(rdev)}"
        if v1:
            (group / "blkio.throttle.read_bps_device").write_text(f"{dev} {READ_BPS}\n")
        else:
            (group / "io.max").write_text(f"{dev} rbps={READ_BPS}\n")
        yield data, group
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", device], check=False)
        if group.exists():
            group.rmdir()


@pytest.fixture
def manager() -> Iterator[CaptureManager]:
    m = CaptureManager(load(None, []).capture)
    m.start()
    assert m.wait_loaded(120)
    yield m
    m.stop()


def test_a_throttled_disk_read_is_a_disk_wait_and_a_pipe_read_is_not(
    slow_disk: tuple[Path, Path], manager: CaptureManager, tmp_path: Path
) -> None:
    data, group = slow_disk
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, str(data)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert reader.stdin is not None and reader.stdout is not None
    try:
        (group / "cgroup.procs").write_text(f"{reader.pid}\n")
        key = CaptureKey("t", reader.pid)
        manager.begin(key, KernelTrackRequest(frozenset({Track.SCHED}), 0.0)).result(30)
        started = time.monotonic()
        reader.stdin.write("go\n")
        reader.stdin.flush()
        assert reader.stdout.readline() == "read\n"
        read_seconds = time.monotonic() - started
        time.sleep(0.5)  # the reader blocks on the pipe meanwhile
        reader.stdin.write("more\n")
        reader.stdin.flush()
        assert reader.stdout.readline() == "done\n"
        capture = manager.end(key).result(60)
    finally:
        reader.kill()
        reader.wait(10)
    # The limit held the read back: 2 MiB at 1 MiB/s.
    assert read_seconds >= 0.8 * DATA_BYTES / READ_BPS
    base_ns = capture.begin_ns + capture.offset_ns
    window = Window(0, capture.end_ns - capture.begin_ns, "kineto")
    built = build_tracks(capture, base_ns, window, [Track.SCHED])
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
            "tid": "x", "ts": 0.0, "dur": window.end_ns / 1000}  # fmt: skip
    doc = {
        "baseTimeNanoseconds": base_ns,
        "traceEvents": [span, *(json.loads(e) for e in built.events)],
    }
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    s = summarize_file(str(path))
    assert s.error == ""
    by_cause = s.blocked_seconds_by_cause
    # Most of the read's time asleep in D, named the disk's; the pipe's half second (or more,
    # on a loaded machine) in S, named a pipe wait.
    assert by_cause.get("disk/uninterruptible", 0.0) >= 0.7 * DATA_BYTES / READ_BPS, by_cause
    assert by_cause.get("io wait", 0.0) >= 0.4, by_cause
    names = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "bpfdyno.sched"}
    assert "blocked: disk/uninterruptible (read)" in names, names
    assert "blocked: io wait (read)" in names, names
