"""`bpfdyno.core.workers`: calls parked in a real blocking ``open()`` (a FIFO nobody opens
for writing) stall only their own user's lane, and never the process's exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path

import pytest

from bpfdyno.core.workers import DaemonExecutor, StoppedError, UserLanes

ALICE, BOB = 1001, 1002


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield path
    # A reader still parked in open() goes once a writer opens it (ENXIO: none is).
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


def _read(path: Path) -> bytes:
    with open(path, "rb") as f:  # blocks until someone opens the FIFO for writing
        return f.read()


async def test_a_user_blocked_in_open_stalls_only_its_own_lane(fifo: Path) -> None:
    lanes = UserLanes("test", threads=4)
    parked = [lanes.submit(ALICE, _read, fifo) for _ in range(8)]
    # Bob's calls run at once, whatever Alice's do.
    assert await asyncio.wait_for(lanes.run(BOB, lambda: "bob's"), 5) == "bob's"
    assert await asyncio.wait_for(lanes.run(BOB, os.getpid), 5) == os.getpid()
    # Alice's own calls wait in order behind her parked one, without taking threads.
    assert lanes.busy() == {ALICE: 8}
    assert not any(f.done() for f in parked)
    lanes.stop()  # cancels what waits; waits for nothing
    for f in parked[1:]:
        with pytest.raises(CancelledError):
            f.result(0)
    with open(fifo, "wb") as w:  # the parked call, once released, still completes
        w.write(b"x")
    assert parked[0].result(5) == b"x"


def test_idle_threads_do_not_hide_that_another_is_needed(fifo: Path) -> None:
    """With a thread left idle by earlier work, two users' calls submitted back to back
    each get a thread: the second never waits behind the first, which blocks."""
    lanes = UserLanes("test", threads=4)
    try:
        lanes.submit(BOB, os.getpid).result(5)  # one thread, now idle
        time.sleep(0.1)
        parked = lanes.submit(ALICE, _read, fifo)
        assert lanes.submit(BOB, lambda: "bob's").result(5) == "bob's"
        assert not parked.done()
    finally:
        lanes.stop()


def test_lanes_take_turns_for_the_threads() -> None:
    """With one thread, a uid with many calls queued does not delay another uid's call."""
    lanes = UserLanes("test", threads=1)
    order: list[str] = []
    gate = threading.Event()
    try:
        first = lanes.submit(ALICE, gate.wait, 10)
        alice = [lanes.submit(ALICE, order.append, f"alice {i}") for i in range(3)]
        bob = lanes.submit(BOB, order.append, "bob")
        gate.set()
        for f in (first, *alice, bob):
            f.result(10)
    finally:
        lanes.stop()
    assert order == ["bob", "alice 0", "alice 1", "alice 2"]


def test_one_users_calls_run_one_at_a_time_in_order() -> None:
    lanes = UserLanes("test", threads=8)
    running: list[int] = []
    overlap: list[int] = []
    seen: list[int] = []

    def call(i: int) -> None:
        running.append(i)
        if len(running) > 1:
            overlap.append(i)
        time.sleep(0.01)
        seen.append(i)
        running.remove(i)

    try:
        for f in [lanes.submit(ALICE, call, i) for i in range(20)]:
            f.result(10)
    finally:
        lanes.stop()
    assert seen == list(range(20)) and overlap == []


def test_no_new_calls_after_stop() -> None:
    lanes = UserLanes("test")
    lanes.stop()
    with pytest.raises(StoppedError):
        lanes.submit(ALICE, os.getpid)


EXITS = textwrap.dedent(
    """
    import sys, time
    from bpfdyno.core.workers import DaemonExecutor, UserLanes
    from concurrent.futures import ThreadPoolExecutor
    def read(path):
        with open(path, "rb") as f:
            return f.read()
    kind, fifo = sys.argv[1], sys.argv[2]
    if kind == "lanes":
        lanes = UserLanes("parked")
        lanes.submit(1001, read, fifo)
        lanes.submit(1001, read, fifo)  # queued behind: cancelled by stop()
        time.sleep(0.2)
        lanes.stop()
    elif kind == "executor":
        ex = DaemonExecutor("parked")
        ex.submit(read, fifo)
        time.sleep(0.2)
        ex.shutdown(wait=False, cancel_futures=True)
    else:
        ex = ThreadPoolExecutor(1)
        ex.submit(read, fifo)
        time.sleep(0.2)
        ex.shutdown(wait=False, cancel_futures=True)
    print("main done", flush=True)
    """
)


@pytest.mark.parametrize("kind", ["lanes", "executor"])
def test_the_process_exits_with_a_call_parked(fifo: Path, kind: str) -> None:
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", EXITS, kind, str(fifo)], capture_output=True, text=True, timeout=30
    )
    assert (r.returncode, r.stdout) == (0, "main done\n"), r.stderr
    assert time.monotonic() - t0 < 5


def test_a_thread_pool_would_not_exit(fifo: Path) -> None:
    """Why: concurrent.futures joins its threads at exit, so this one hangs until killed."""
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(
            [sys.executable, "-c", EXITS, "pool", str(fifo)], capture_output=True, timeout=3
        )


def test_daemon_executor_is_an_executor() -> None:
    ex = DaemonExecutor("test", workers=2)
    try:
        assert list(ex.map(lambda x: x * 2, range(5))) == [0, 2, 4, 6, 8]
        assert ex.submit(lambda *, k: k, k=3).result(5) == 3
    finally:
        ex.shutdown()


def test_a_users_subordinate_uids_share_her_lane(tmp_path: Path, fifo: Path) -> None:
    """Found by reading the code: lanes were keyed by raw uid, so a user with a subordinate
    uid range (a rootless container runs as any of them) could park a call on every thread.
    Her 16 calls as 16 of her container's uids now wait in one lane: one thread."""
    from bpfdyno.core.identity import Principals

    subuid = tmp_path / "subuid"
    subuid.write_text(f"{ALICE}:100000:65536\n")
    lanes = UserLanes("test", threads=4, principals=Principals(subuid))
    try:
        parked = [lanes.submit(100_000 + i, _read, fifo) for i in range(16)]
        time.sleep(0.2)
        assert lanes.busy() == {ALICE: 16}
        # Bob's call gets a thread at once: hers hold one, not all four.
        assert lanes.submit(BOB, lambda: "bob").result(5) == "bob"
        assert not any(f.done() for f in parked)
    finally:
        lanes.stop()
