"""The hang verdict with real processes: ranks waiting on a socket like peers in a collective,
and one that holds them — stopped by SIGSTOP, blocked reading a FIFO, or spinning."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from bpfdyno.detection.hang import HangSettings, HangWatch, classify, read_threads
from bpfdyno.detection.signals import RankProcess, SignalSampler
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind, HangState

#: Each program says "r" on its stdout once its start-up is over, just before what it does
#: for the rest of its life (on a loaded machine an interpreter's start-up takes seconds).
#: A rank waiting for its peers: asleep in a read on a socket nobody writes to.
WAITING = (
    "import os, socket\na, b = socket.socketpair()\nos.write(1, b'r')\nos.read(a.fileno(), 1)\n"
)
#: A rank blocked forever reading a FIFO (argv[1]) that nobody writes to.
FIFO_READER = (
    "import os, sys\nfd = os.open(sys.argv[1], os.O_RDWR)\nos.write(1, b'r')\nos.read(fd, 1)\n"
)
SPINNER = "import os\nos.write(1, b'r')\nwhile True:\n    pass\n"
#: A rank that keeps moving bytes (a healthy one).
MOVING = (
    "import os, time\nnull = os.open('/dev/null', os.O_WRONLY)\nblock = bytes(1 << 20)\n"
    "os.write(1, b'r')\nwhile True:\n    os.write(null, block)\n    time.sleep(0.05)\n"
)


@contextlib.contextmanager
def ranks(*programs: tuple[str, ...]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One process per program (its source, then its arguments), ranks 0, 1, ..."""
    procs = []
    try:
        for rank, (source, *args) in enumerate(programs):
            env = {**os.environ, "RANK": str(rank)}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", source, *args], env=env, stdout=subprocess.PIPE
                )
            )
        for p, (source, *_) in zip(procs, programs, strict=True):
            # Past the interpreters' start-up reads; a reader into its last read.
            assert p.stdout is not None and p.stdout.read(1) == b"r"
            if source in (WAITING, FIFO_READER):
                wait_asleep(p.pid)
        yield procs
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


def wait_asleep(pid: int) -> None:
    """Until the process sleeps (in its read): on a loaded machine it may wait for a CPU
    between saying it is ready and the read."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rfind(")") + 2] == "S":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never went to sleep")


def watch(
    procs: list[subprocess.Popen[bytes]], after_s: float = 1.5, for_s: float = 8.0
) -> tuple[list[DetectionEvent], float]:
    """Sample every 0.25 s until the first events (or ``for_s``); the events and how long."""
    sampler = SignalSampler()
    hangs = HangWatch("node-a", HangSettings(after_s=after_s))
    refs = [RankProcess(p.pid, "7") for p in procs]
    start = time.monotonic()
    sampler.sample(refs, start)
    while time.monotonic() - start < for_s:
        time.sleep(0.25)
        now = time.monotonic()
        events = hangs.update(sampler.sample(refs, now), now, time.time())
        if events:
            return events, now - start
    return [], time.monotonic() - start


def test_a_stopped_rank_is_named_stopped() -> None:
    with ranks((WAITING,), (WAITING,), (WAITING,), (WAITING,)) as procs:
        os.kill(procs[2].pid, signal.SIGSTOP)
        events, took = watch(procs)
    (e,) = events
    assert (e.kind, e.job_id, e.rank, e.pid, e.hang_state) == (
        DetectionKind.HANG,
        "7",
        2,
        procs[2].pid,
        "stopped",
    )
    assert e.threads[0].tid == procs[2].pid
    assert e.threads[0].state == "T"
    assert e.threads[0].offcpu_seconds >= 1.5
    assert "rank 2 is stopped" in e.summary and "ranks 0, 1, 3 wait" in e.summary
    assert took >= 1.5  # not before hang_after_s


def test_a_rank_blocked_reading_a_fifo_is_named_with_its_read(tmp_path: Path) -> None:
    fifo = tmp_path / "input"
    os.mkfifo(fifo)
    with ranks((WAITING,), (FIFO_READER, str(fifo)), (WAITING,)) as procs:
        events, _ = watch(procs)
    (e,) = events
    assert (e.rank, e.hang_state) == (1, "blocked_read")
    main = e.threads[0]
    assert (main.state, main.syscall, main.waiting_on) == ("S", "read", "pipe")
    assert main.wchan.endswith("pipe_read")  # anon_pipe_read on newer kernels
    assert f"rank 1 is blocked_read (main thread S in read on a pipe ({main.wchan}))" in e.summary


def test_a_spinning_rank_is_named_spinning() -> None:
    with ranks((WAITING,), (WAITING,), (SPINNER,)) as procs:
        events, _ = watch(procs)
    (e,) = events
    assert (e.rank, e.hang_state) == (2, "spinning")
    assert e.threads[0].state == "R"
    # It ran whenever it got a CPU: a quarter of one, or on a machine loaded 15 times over
    # its CPUs less than a tenth (named all the same: runnable in every reading).
    assert e.threads[0].oncpu_share > 0.0
    assert e.threads[0].offcpu_seconds == 0.0


@contextlib.contextmanager
def cpu_quota(pid: int, share: float) -> Iterator[None]:
    """Process ``pid`` in a cgroup of its own limited to ``share`` of a CPU."""
    root = Path("/sys/fs/cgroup/cpu")
    v2 = not (root / "cpu.cfs_quota_us").exists()
    if v2:
        root = Path("/sys/fs/cgroup")
    d = root / f"bpfdyno-hang-{os.getpid()}"
    d.mkdir()
    try:
        quota = int(100_000 * share)
        if v2:
            (d / "cpu.max").write_text(f"{quota} 100000")
        else:
            (d / "cpu.cfs_period_us").write_text("100000")
            (d / "cpu.cfs_quota_us").write_text(str(quota))
        (d / "cgroup.procs").write_text(str(pid))
        yield
    finally:
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(str(pid))
        d.rmdir()


def test_a_spinner_that_gets_little_of_a_cpu_is_still_named_spinning() -> None:
    # A loaded machine (or a CPU limit) gives a spinner less than `spin_share` of a CPU: 4 %
    # here, throttled the rest. It never sleeps: its main thread runnable in every reading.
    with ranks((WAITING,), (SPINNER,), (WAITING,)) as procs, cpu_quota(procs[1].pid, 0.04):
        events, _ = watch(procs)
    (e,) = events
    assert (e.rank, e.hang_state) == (1, "spinning")
    assert e.threads[0].state == "R"
    assert e.threads[0].oncpu_share < HangSettings().spin_share


def test_ranks_all_waiting_hang_without_a_rank_to_name() -> None:
    with ranks((WAITING,), (WAITING,), (WAITING,)) as procs:
        events, _ = watch(procs)
    (e,) = events
    assert (e.rank, e.pid, e.hang_state, e.threads) == (-1, 0, "waiting", ())
    assert "(0, 1, 2) all wait" in e.summary


def test_a_job_that_moves_bytes_does_not_hang() -> None:
    with ranks((WAITING,), (MOVING,), (WAITING,)) as procs:
        events, took = watch(procs, after_s=1.0, for_s=3.0)
    assert events == []
    assert took >= 3.0


def test_a_hang_is_reported_once() -> None:
    sampler = SignalSampler()
    hangs = HangWatch("node-a", HangSettings(after_s=0.5))
    with ranks((WAITING,), (WAITING,), (WAITING,)) as procs:
        refs = [RankProcess(p.pid, "7") for p in procs]
        sampler.sample(refs, time.monotonic())
        seen = []
        for _ in range(8):
            time.sleep(0.2)
            now = time.monotonic()
            seen += hangs.update(sampler.sample(refs, now), now, time.time())
    assert [e.kind for e in seen] == [DetectionKind.HANG]


def test_the_main_thread_comes_first_and_classify_reads_it() -> None:
    with ranks((WAITING,)) as (p,):
        threads = read_threads(Path("/proc"), p.pid)
    assert threads[0].tid == p.pid
    assert (threads[0].syscall, threads[0].fd_target) == ("read", "socket")
    assert classify(threads, 0.0, 0.5) is HangState.WAITING
    assert classify(threads, 0.5, 0.5) is HangState.SPINNING
    assert classify([], 0.0, 0.5) is HangState.WAITING


@pytest.mark.parametrize("state", ["T", "t"])
def test_stop_states_are_stopped(state: str) -> None:
    with ranks((WAITING,)) as (p,):
        (main, *_) = read_threads(Path("/proc"), p.pid)
    assert classify([replace(main, state=state)], 0.0, 0.5) is HangState.STOPPED
