"""gloo's peer-wait signal on a real job: two PyTorch ranks joined by gloo over real loopback
TCP connections run N all-reduces, rank 1 sleeping D before each; rank 0's threads wait for
rank 1's data on their connection N x D (plus the all-reduces' own few milliseconds), rank 1's
barely. Read as the detection reads it: `SignalSampler` with the uprobe pairs on gloo's
``UnboundBuffer::waitRecv`` and ``waitSend`` (`GlooWaits`). A rank without gloo has no such
signal (NaN). With three ranks, the two on time wait for the late one in different functions
of gloo (one of them almost wholly in ``waitSend``): both are its peer wait."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bpfdyno.detection.signals import RankProcess, RankSignals, SignalSampler
from bpfdyno.sources.gloo.waits import GlooWaits

pytestmark = pytest.mark.slow

STEPS = 10
DELAY_S = 0.2
#: The moments between a rank's clock reads around its loop and the probes' around its waits.
CLOCKS_S = 0.05

RANK = """
import os, sys, time
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]))
t = torch.ones(16)
dist.all_reduce(t)  # connections up, first-call work done
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
for _ in range({steps}):
    if rank == {late}:
        time.sleep({delay})
    dist.all_reduce(t)
print("done", t[0].item(), time.monotonic() - t0, flush=True)
sys.stdin.readline()
"""
SLEEPER = "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\nsys.stdin.readline()\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(codes: list[str], world: int) -> Iterator[list[subprocess.Popen[str]]]:
    """One process a code, rank by its place, of a gloo job of ``world`` ranks, each at
    "ready"; killed after."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env={**env, "RANK": str(rank)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank, code in enumerate(codes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture
def job() -> Iterator[list[subprocess.Popen[str]]]:
    """Ranks 0 and 1 of a gloo job, and a rank 2 of no gloo job, each at "ready"."""
    source = RANK.format(steps=STEPS, delay=DELAY_S, late=1)
    yield from _start([source, source, SLEEPER], 2)


def _run(
    job: list[subprocess.Popen[str]], world: int, probed: int, job_id: str
) -> tuple[dict[int, RankSignals], list[float]]:
    """Each rank's signal over the all-reduces of the gloo job's first ``world`` ranks (their
    sums checked), begun once the first ``probed`` have gloo's probes on; and how long each
    of those ranks took for its loop (its sleeps and its all-reduces: no wait of its can be
    longer, however loaded the machine)."""
    waits = GlooWaits()
    sampler = SignalSampler(peer_waits=waits)
    ranks = [RankProcess(p.pid, job_id) for p in job]
    try:
        # The program compiles on a thread of its own: a rank has a value once it is loaded
        # and the rank's library probed.
        deadline = time.monotonic() + 120
        while any(waits.wait_ns(p.pid) is None for p in job[:probed]):
            assert waits.error == ""
            assert time.monotonic() < deadline, "gloo's probes not on in 120 s"
            time.sleep(0.1)
        assert sampler.sample(ranks, time.monotonic()) == []  # the base
        for p in job:
            assert p.stdin is not None
            p.stdin.write("\n")
            p.stdin.flush()
        loops = []
        for p in job[:world]:
            assert p.stdout is not None
            done, total, loop_s = p.stdout.readline().split()
            assert (done, total) == ("done", str(float(world) ** (STEPS + 1)))
            loops.append(float(loop_s))
        return {s.rank: s for s in sampler.sample(ranks, time.monotonic())}, loops
    finally:
        waits.close()


def test_a_gloo_rank_s_wait_for_its_late_peer_is_its_peer_wait(
    job: list[subprocess.Popen[str]],
) -> None:
    by_rank, loops = _run(job, 2, 1, "41")
    injected = STEPS * DELAY_S
    # Rank 0 starts first and waits at least for every sleep of rank 1's; never longer than
    # its loop (a wait counted twice would be).
    assert injected <= by_rank[0].peer_wait_s <= loops[0], (by_rank[0], loops)
    # Rank 1's sleeps are not waits: at most the time its all-reduces took.
    assert 0.0 <= by_rank[1].peer_wait_s <= loops[1] - injected + CLOCKS_S, (by_rank[1], loops)
    assert math.isnan(by_rank[2].peer_wait_s)  # no gloo in it


@pytest.fixture
def job3() -> Iterator[list[subprocess.Popen[str]]]:
    """Ranks 0, 1 and 2 of a gloo job, rank 2 late, each at "ready"."""
    yield from _start([RANK.format(steps=STEPS, delay=DELAY_S, late=2)] * 3, 3)


def test_every_rank_on_time_waits_for_the_late_one_whichever_way_it_waits(
    job3: list[subprocess.Popen[str]],
) -> None:
    by_rank, loops = _run(job3, 3, 3, "42")
    injected = STEPS * DELAY_S
    # Timing waitRecv alone, one of ranks 0 and 1 was seen at 0.05 s (it waited in waitSend).
    for rank in (0, 1):
        assert injected <= by_rank[rank].peer_wait_s <= loops[rank], (by_rank[rank], loops)
    assert 0.0 <= by_rank[2].peer_wait_s <= loops[2] - injected + CLOCKS_S, (by_rank[2], loops)


#: How long rank 1 is held before the all-reduce: longer than the intervals read below.
HELD_S = 10.0
#: The interval read while rank 0 waits for it.
READ_S = 2.0

HELD = """
import os, sys, time
import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
dist.init_process_group("gloo", rank=rank, world_size=2)
t = torch.ones(16)
dist.all_reduce(t)  # connections up, first-call work done
print("ready", flush=True)
sys.stdin.readline()
if rank == 1:
    time.sleep({held})
dist.all_reduce(t)
print("done", t[0].item(), flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def held_job() -> Iterator[list[subprocess.Popen[str]]]:
    """Ranks 0 and 1 of a gloo job at "ready"; on a line each, rank 1 sleeps `HELD_S` before
    their all-reduce."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "WORLD_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", HELD.format(held=HELD_S)],
            env={**env, "RANK": str(rank)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_wait_longer_than_an_interval_counts_in_each_interval_while_it_lasts(
    held_job: list[subprocess.Popen[str]],
) -> None:
    waits = GlooWaits()
    sampler = SignalSampler(peer_waits=waits)
    ranks = [RankProcess(p.pid, "43") for p in held_job]
    rank0 = held_job[0].pid
    try:
        deadline = time.monotonic() + 120
        while any(waits.wait_ns(p.pid) is None for p in held_job):
            assert waits.error == ""
            assert time.monotonic() < deadline, "gloo's probes not on in 120 s"
            time.sleep(0.1)
        assert waits.wait_ns(rank0) == 0
        for p in held_job:
            assert p.stdin is not None
            p.stdin.write("\n")
            p.stdin.flush()
        # Rank 0 enters the all-reduce and waits there for rank 1, asleep for HELD_S: its
        # wait shows before it ends (counted only at its end, it would be 0 for HELD_S).
        seen = time.monotonic()
        while (waits.wait_ns(rank0) or 0) == 0:
            assert time.monotonic() < seen + HELD_S / 2, "rank 0's wait in progress not seen"
            time.sleep(0.05)
        # Each reading's clock is read between the times taken around it, so the wait it
        # sees lies between these bounds whatever the machine's load.
        t_a0 = time.monotonic()
        assert sampler.sample(ranks, t_a0) == []  # the base
        t_a1 = time.monotonic()
        time.sleep(READ_S)
        t_b0 = time.monotonic()
        held = {s.rank: s for s in sampler.sample(ranks, t_b0)}
        t_b1 = time.monotonic()
        assert held_job[0].stdout is not None
        assert held_job[0].stdout.readline().split() == ["done", "4.0"]
        t_c0 = time.monotonic()
        after = {s.rank: s for s in sampler.sample(ranks, t_c0)}
        t_c1 = time.monotonic()
    finally:
        waits.close()
    # Rank 0 waited the whole interval (one thread: gloo's worker running the all-reduce).
    assert t_b0 - t_a1 <= held[0].peer_wait_s <= t_b1 - t_a0, (held[0], t_b0 - t_a1, t_b1 - t_a0)
    assert held[1].peer_wait_s == 0.0, held[1]  # asleep, not in gloo: the one held back
    # When the wait ends, only its rest is added: never counted twice.
    assert 0.0 < after[0].peer_wait_s <= t_c1 - t_b0, after[0]
    assert held[0].peer_wait_s + after[0].peer_wait_s <= t_c1 - t_a0
