"""Per-rank signals from real processes: their ranks, the bytes they moved, their run-queue
wait on a shared CPU, their sleep, their main thread's busy share, their CPU-quota
throttling."""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from host_time import host_taken

from bpfdyno.detection.signals import (
    MAX_ARRIVALS,
    Arrival,
    Arrivals,
    CollectiveTimes,
    RankProcess,
    RankSignals,
    SignalSampler,
    from_record,
    new_arrivals,
    to_record,
)
from bpfdyno.rpc.detection import RankSignal
from bpfdyno.rpc.wire import from_pb, to_pb

#: A process that waits for commands on stdin: 'w' writes 1 MiB to /dev/null, 's' spins on the
#: CPU for a second, 'q' exits; each command is answered with one byte once done (and one
#: 'r' once it is ready).
CHILD = """
import os, time
null = os.open("/dev/null", os.O_WRONLY)
block = bytes(1 << 20)
os.write(1, b"r")  # started: its interpreter's reads are done
while True:
    c = os.read(0, 1)
    if c == b"w":
        os.write(null, block)
    elif c == b"s":
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
    else:
        break
    os.write(1, b"d")
"""


class Child:
    def __init__(self, rank: int | None, cpu: int | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "RANK"}
        if rank is not None:
            env["RANK"] = str(rank)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        if cpu is not None:
            os.sched_setaffinity(self.proc.pid, {cpu})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, command: bytes) -> None:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(command)
        self.proc.stdin.flush()

    def done(self) -> None:
        assert self.proc.stdout
        assert self.proc.stdout.read(1) == b"d"

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


@contextlib.contextmanager
def children(*ranks: int | None, cpu: int | None = None) -> Iterator[list[Child]]:
    made = [Child(r, cpu) for r in ranks]
    try:
        for c in made:
            assert c.proc.stdout and c.proc.stdout.read(1) == b"r"
            wait_asleep(c.pid)
        yield made
    finally:
        for c in made:
            c.close()


def wait_asleep(pid: int) -> None:
    """Until the process sleeps (in its read of the next command): on a loaded machine it may
    wait for a CPU between its answer and the read."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat[stat.rfind(")") + 2] == "S":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never went to sleep")


def refs(cs: list[Child]) -> list[RankProcess]:
    return [RankProcess(c.pid, "7") for c in cs]


def test_only_processes_with_a_rank_have_signals_from_their_second_reading() -> None:
    sampler = SignalSampler()
    with children(3, None) as (ranked, plain):
        assert sampler.sample(refs([ranked, plain]), time.monotonic()) == []
        (s,) = sampler.sample(refs([ranked, plain]), time.monotonic())
        assert (s.job_id, s.rank, s.pid) == ("7", 3, ranked.pid)


def test_bytes_moved_are_the_reads_and_writes_of_the_interval() -> None:
    sampler = SignalSampler()
    with children(0) as (child,):
        sampler.sample(refs([child]), time.monotonic())
        child.send(b"w")
        child.done()
        wait_asleep(child.pid)
        (s,) = sampler.sample(refs([child]), time.monotonic())
    # The command byte read, 1 MiB written to /dev/null, the answer byte written.
    assert s.io_bytes == 1 + (1 << 20) + 1


def test_a_sleeping_rank_waits_the_whole_interval() -> None:
    sampler = SignalSampler()
    with children(1) as (child,):
        sampler.sample(refs([child]), time.monotonic())
        time.sleep(0.5)
        (s,) = sampler.sample(refs([child]), time.monotonic())
    assert s.interval_s >= 0.5
    assert s.main_waiting_s == pytest.approx(s.interval_s, abs=0.02)
    assert s.oncpu_s < 0.02
    assert s.cpu_wait_share < 0.02


def test_a_rank_computing_has_its_main_thread_busy_its_sleeping_peer_not() -> None:
    sampler = SignalSampler()
    with children(0, 1) as (computing, sleeping), host_taken() as taken:
        sampler.sample(refs([computing, sleeping]), time.monotonic())
        computing.send(b"s")
        computing.done()
        busy, idle = sampler.sample(refs([computing, sleeping]), time.monotonic())
    # It spun a second of wall time, on a CPU or waiting for one (a loaded machine's share):
    # busy all of it but what interrupts and the hypervisor took (one CI run: 32 ms); the
    # rest of the interval (the command's round trip) it slept.
    assert 0.98 - taken[0] <= busy.main_busy_share * busy.interval_s <= busy.interval_s
    assert idle.main_busy_share * idle.interval_s < 0.02


def test_two_ranks_sharing_one_cpu_wait_for_it_in_turn() -> None:
    sampler = SignalSampler()
    with children(0, 1, cpu=0) as pair, host_taken() as taken:
        sampler.sample(refs(pair), time.monotonic())
        for c in pair:
            c.send(b"s")
        for c in pair:
            c.done()
        signals = sampler.sample(refs(pair), time.monotonic())
    assert [s.rank for s in signals] == [0, 1]
    # Each spun for a second of wall time, never sleeping: on the CPU or waiting for it (but
    # what interrupts and the hypervisor took). One CPU holds at most the interval of both
    # together, so the rest of their two seconds was run-queue wait, however other work on
    # a loaded machine shared the CPU out.
    interval = signals[0].interval_s
    for s in signals:
        assert s.oncpu_s + s.runq_wait_s > 0.97 - taken[0]
    assert sum(s.oncpu_s for s in signals) <= interval + 0.01
    assert sum(s.runq_wait_s for s in signals) > 1.95 - interval - taken[0]


def test_cpu_quota_throttling_counts_as_waiting_for_a_cpu() -> None:
    root = Path("/sys/fs/cgroup/cpu")
    v2 = not (root / "cpu.cfs_quota_us").exists()
    if v2:
        root = Path("/sys/fs/cgroup")
    d = root / f"bpfdyno-detect-{os.getpid()}"
    d.mkdir()
    sampler = SignalSampler()
    try:
        with children(2) as (child,):
            if v2:
                (d / "cpu.max").write_text("10000 100000")
            else:
                (d / "cpu.cfs_period_us").write_text("100000")
                (d / "cpu.cfs_quota_us").write_text("10000")
            (d / "cgroup.procs").write_text(str(child.pid))
            sampler.sample(refs([child]), time.monotonic())
            child.send(b"s")
            child.done()
            (s,) = sampler.sample(refs([child]), time.monotonic())
            (root / "cgroup.procs").write_text(str(child.pid))
    finally:
        d.rmdir()
    # 10 % of a CPU for a second of spinning: held off the CPU most of the second, the cgroup
    # throttled in most periods (the kernel's throttled time counts only part of the wait).
    assert s.oncpu_s < 0.2
    assert s.throttled_s > 0.1
    assert s.runq_wait_s > 0.6  # a throttled thread stays runnable: it waits in the queue
    assert s.cpu_wait_share > 0.5


class Collectives:
    """Cumulative collective times per pid, as the NCCL profiler's module hands them."""

    def __init__(self) -> None:
        self.times: dict[int, CollectiveTimes] = {}

    def collective_times(self, pid: int) -> CollectiveTimes | None:
        return self.times.get(pid)


def test_collective_times_are_differences_and_arrivals_the_new_ones() -> None:
    coll = Collectives()
    sampler = SignalSampler(collectives=coll)
    old = Arrival(0xAB, 7, 1_000, 4)
    new = [Arrival(0xAB, 8, 2_000, 4), Arrival(0xAB, 9, 3_000, 4)]
    with children(0, 1) as (a, b):
        coll.times[a.pid] = CollectiveTimes(in_collective_ns=1_000_000_000, arrivals=(old,))
        sampler.sample(refs([a, b]), time.monotonic())
        coll.times[a.pid] = CollectiveTimes(3_500_000_000, (old, *new))
        sa, sb = sampler.sample(refs([a, b]), time.monotonic())
        last = Arrival(0xAB, 10, 4_000, 4)
        coll.times[a.pid] = CollectiveTimes(3_600_000_000, (old, *new, last))
        (sa2,) = [s for s in sampler.sample(refs([a, b]), time.monotonic()) if s.pid == a.pid]
    assert sa.in_collective_s == 2.5
    # The collectives completed in the interval; how late it was is counted job-wide.
    assert sa.arrivals == (Arrivals(0xAB, 4, (8, 9), (2_000, 3_000)),)
    assert math.isnan(sa.late_s)
    assert math.isnan(sb.in_collective_s)  # nothing known for it
    assert sb.arrivals is None
    assert isinstance(sb, RankSignals)
    # The next interval's signal sends the previous interval's arrivals again, before its own
    # (a peer's pull may have missed that round).
    assert sa2.arrivals == (Arrivals(0xAB, 4, (8, 9, 10), (2_000, 3_000, 4_000)),)


def test_a_signal_carries_the_latest_256_arrivals_of_its_interval() -> None:
    before = tuple(Arrival(1, seq, seq * 10, 8) for seq in range(100))
    after = before[50:] + tuple(Arrival(1, seq, seq * 10, 8) for seq in range(100, 400))
    got = new_arrivals(before, after)
    assert [c.seq for c in got] == list(range(400 - MAX_ARRIVALS, 400))


def test_a_process_gone_has_no_signal() -> None:
    sampler = SignalSampler()
    with children(0, 1) as (a, b):
        sampler.sample(refs([a, b]), time.monotonic())
        b.close()
        signals = sampler.sample(refs([a, b]), time.monotonic())
        assert [s.rank for s in signals] == [0]
        assert sampler.sample(refs([a]), time.monotonic())[0].rank == 0


def test_the_peer_wait_travels_to_the_job_s_other_agents_and_back() -> None:
    s = RankSignals("7", 2, 4242, 0.0, 5.0, 1.0, 0.1, 4.0, 0.0, 1 << 20, peer_wait_s=2.75)
    record = to_record(s, "node-a", 1000.0)
    assert record.peer_wait_seconds == 2.75
    back = from_record(from_pb(RankSignal, to_pb(record)))
    assert (back.peer_wait_s, back.peer_wait_share, back.host) == (2.75, 0.55, "node-a")
    # A rank without gloo's probes sends none, and is read back as unknown (NaN).
    none = to_record(replace(s, peer_wait_s=float("nan")), "node-a", 1000.0)
    assert none.peer_wait_seconds is None
    assert math.isnan(from_record(from_pb(RankSignal, to_pb(none))).peer_wait_share)
