"""While nobody reads, rounds come at the slow cadence; a read wakes a fresh round at once
(one, however many read together) and keeps the normal cadence for a while; an open stream
keeps it while open; the rounds run for readers are theirs. A real daemon with the real host
collector (procfs), its intervals shortened so the test takes seconds."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence

import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.core.budget import REQUESTED
from bpfdyno.core.config import load
from bpfdyno.core.demand import ReadDemand
from bpfdyno.core.metrics import Sample
from bpfdyno.services.agent import AgentService
from bpfdyno.sources.base import FillRate
from bpfdyno.sources.host.collector import HostCollector

INTERVAL_S = 0.2
IDLE_S = 2.0
HOLD_S = 2.0
NAME = ["cpu_utilization_ratio"]


def _daemon(demand: ReadDemand) -> Daemon:
    cfg = load(
        None,
        [
            ("daemon.interval_s", str(INTERVAL_S)),
            ("daemon.idle_interval_s", str(IDLE_S)),
            ("daemon.history_s", "120"),
        ],
    )
    return Daemon(cfg, [HostCollector()], demand=demand)


def _rounds(d: Daemon, since: float, until: float = float("inf")) -> list[float]:
    """Timestamps of the host collector's rounds in [since, until) (cpu="total": every
    round has one)."""
    views = d.store.window(since, min(until, time.time() + 60), NAME)
    return sorted(p.ts for v in views if ("cpu", "total") in v.labels for p in v.points)


async def _until(check: Callable[[], bool], within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(INTERVAL_S / 4)


def _gaps(ts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(ts)]


async def test_rounds_slow_while_nobody_reads_and_a_read_gets_a_round_after_it() -> None:
    demand = ReadDemand(hold_s=HOLD_S)
    d = _daemon(demand)
    svc = AgentService(d)
    t_start = time.time()
    await d.start()
    try:
        # Nobody reads: a round every IDLE_S (the first two give the first ratios).
        await _until(lambda: len(_rounds(d, t_start)) >= 4)
        idle = _rounds(d, t_start)
        # (Rounds keep deadlines: after a late round the next may come a little sooner; the
        # normal cadence would be 0.2 s.)
        assert all(g > IDLE_S / 2 for g in _gaps(idle)), _gaps(idle)

        # A read when the last round is older than a normal round: answered from a round
        # made after it, at once (not at the next slow one).
        await _until(lambda: time.time() - _rounds(d, t_start)[-1] > IDLE_S * 0.3)
        last = _rounds(d, t_start)[-1]
        t_read = time.time()
        snap = await svc.fresh_snapshot(NAME, "uid 1234")
        newest = max(v.points[-1].ts for v in snap.series if ("cpu", "total") in v.labels)
        assert newest >= t_read, "answered from a round older than the read"
        # Made when the read came, not at the next slow round (last + IDLE_S): a loaded
        # machine may start it late, by less than IDLE_S / 4.
        assert newest < last + IDLE_S * 0.75, (newest - t_read, newest - last)

        # Then the normal cadence for the hold, and the slow one again after it.
        await asyncio.sleep(HOLD_S)
        held = _rounds(d, t_read, t_read + HOLD_S)
        assert len(held) >= HOLD_S / INTERVAL_S / 2, held  # ~10; a loaded machine is late
        assert max(_gaps(held)) < IDLE_S / 2, _gaps(held)
        t_after = time.time() + INTERVAL_S * 2
        await _until(lambda: len(_rounds(d, t_after)) >= 3)
        after = _rounds(d, t_after)
        assert all(g > IDLE_S / 2 for g in _gaps(after)), _gaps(after)
        # The rounds run at the normal cadence only because someone read are the reader's.
        assert REQUESTED.by_reader().get("uid 1234", 0) > 0
    finally:
        await d.stop()


async def test_many_readers_at_once_get_one_fresh_round() -> None:
    demand = ReadDemand(hold_s=HOLD_S)
    d = _daemon(demand)
    svc = AgentService(d)
    t_start = time.time()
    await d.start()
    try:
        await _until(lambda: len(_rounds(d, t_start)) >= 2)
        await asyncio.sleep(IDLE_S / 2)  # the last round is now older than a normal round
        t_read = time.time()
        snaps = await asyncio.gather(
            *(svc.fresh_snapshot(NAME, f"uid {2000 + i}") for i in range(20))
        )
        done = time.time()
        for snap in snaps:
            assert max(v.points[-1].ts for v in snap.series) >= t_read
        # One round for all twenty (the next normal one may have come since, not more).
        assert len(_rounds(d, t_read, done)) <= 1 + (done - t_read) / INTERVAL_S
        assert len(_rounds(d, t_read, t_read + INTERVAL_S / 2)) == 1
    finally:
        await d.stop()


async def test_an_open_stream_keeps_the_normal_cadence() -> None:
    demand = ReadDemand(hold_s=HOLD_S)
    d = _daemon(demand)
    svc = AgentService(d)
    t_start = time.time()
    await d.start()
    try:
        await _until(lambda: len(_rounds(d, t_start)) >= 2)
        got: list[float] = []

        async def watch() -> None:
            async for snap in svc.stream(NAME):
                got.append(snap.ts)

        task = asyncio.create_task(watch())
        t_open = time.time()
        # Longer than the hold: the stream, not the read that opened it, keeps the cadence.
        await asyncio.sleep(HOLD_S * 2)
        assert demand.active()
        streamed = _rounds(d, t_open + HOLD_S, t_open + HOLD_S * 2)
        assert len(streamed) >= HOLD_S / INTERVAL_S / 2, streamed
        assert max(_gaps(streamed)) < IDLE_S / 2
        assert len(got) >= HOLD_S / INTERVAL_S
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.sleep(0)
        assert demand.readers(), "the hold counts from the stream's end"
        await _until(lambda: not demand.active(), HOLD_S * 3)
    finally:
        await d.stop()


def test_the_demand_follows_reads_and_streams() -> None:
    now = [100.0]
    demand = ReadDemand(hold_s=30.0, clock=lambda: now[0])
    assert not demand.active() and demand.readers() == [] and demand.active_for() == 0
    demand.note("uid 1")
    assert demand.active() and demand.readers() == ["uid 1"]
    now[0] += 20.0
    demand.note("uid 1")
    now[0] += 20.0
    assert demand.active_for() == 40.0  # reading without a pause longer than the hold
    now[0] += 10.0
    assert not demand.active() and demand.readers() == [] and demand.active_for() == 0
    demand.stream_opened("uid 2")
    now[0] += 1000.0
    assert demand.active() and demand.readers() == ["uid 2"]
    assert demand.active_for() == 1000.0
    demand.stream_closed("uid 2")
    assert demand.active()
    now[0] += 30.0
    assert not demand.active()


def test_an_exporter_writing_every_round_keeps_the_normal_cadence() -> None:
    from bpfdyno.app.daemon import idle_interval

    assert idle_interval(load(None, [])) == 5.0
    assert idle_interval(load(None, [("export.jsonl.enabled", "true")])) == 0.0
    assert idle_interval(load(None, [("daemon.idle_interval_s", "0")])) == 0.0


async def test_a_stream_and_a_scrape_are_reads_of_per_cpu_series(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bpfdyno.app import assembly
    from bpfdyno.services import agent as agent_service
    from bpfdyno.sources import percpu

    reads = percpu.PerCpuReads()
    monkeypatch.setattr(percpu, "PER_CPU_READS", reads)
    monkeypatch.setattr(agent_service, "PER_CPU_READS", reads)
    d = _daemon(ReadDemand(hold_s=HOLD_S))
    svc = AgentService(d)
    await d.start()
    try:
        # A stream of names without per-CPU series is not a read of them...
        async for _ in svc.stream(["memory_*"]):
            break
        assert not reads.wanted()
        # ... one that takes them in is, from the first round on.
        async for _ in svc.stream(["cpu_*"]):
            break
        assert reads.wanted()
        monkeypatch.setattr(percpu, "PER_CPU_READS", fresh := percpu.PerCpuReads())
        await asyncio.to_thread(assembly.scrape_read, d.demand, None, INTERVAL_S)
        assert fresh.wanted()
    finally:
        await d.stop()


class Filling(HostCollector):
    """The host collector, with something the kernel fills between rounds at a rate the test
    sets: ``per_s`` entries a second into ``capacity`` (a sched collector's exited threads'
    map and event ring buffer, on a machine whose processes come and go)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.fill = FillRate(capacity)
        self.per_s = 0.0
        self._last: float | None = None

    def collect(self) -> Sequence[Sample]:
        now = time.monotonic()
        if self._last is not None:
            self.fill.saw(round(self.per_s * (now - self._last)), now)
        self._last = now
        return super().collect()

    def longest_interval_s(self) -> float:
        return self.fill.longest_interval_s()


def test_the_fill_rate_gives_the_longest_interval_that_fills_half() -> None:
    fill = FillRate(1424)  # the sched ring buffer's events at 64 pages
    assert fill.longest_interval_s() == float("inf")  # nothing seen yet
    fill.saw(0, 10.0)
    fill.saw(1424, 15.0)  # 284.8 events a second over a 5 s round
    assert fill.longest_interval_s() == pytest.approx(2.5)
    fill.saw(0, 17.5)
    assert fill.longest_interval_s() == float("inf")


async def test_churn_shortens_the_slow_cadence_only_as_far_as_it_must() -> None:
    """While nobody reads, a collector whose kernel-side buffer fills at a rate that would
    overflow half of it in one slow round (IDLE_S) gets rounds as far apart as half of it
    holds at that rate — not the normal cadence; more churn than a normal round holds brings
    the normal cadence back, and none the slow one."""
    demand = ReadDemand(hold_s=HOLD_S)
    cfg = load(
        None,
        [
            ("daemon.interval_s", str(INTERVAL_S)),
            ("daemon.idle_interval_s", str(IDLE_S)),
            ("daemon.history_s", "120"),
        ],
    )
    host = Filling(capacity=1000)
    d = Daemon(cfg, [host], demand=demand)
    await d.start()
    try:
        host.per_s = 625.0  # half of 1000 in 0.8 s: rounds 0.8 s apart
        t0 = time.time() + IDLE_S + 0.5  # past the first (slow) round at the new rate
        await _until(lambda: len(_rounds(d, t0)) >= 5)
        gaps = _gaps(_rounds(d, t0))
        assert all(0.6 < g < 1.0 for g in gaps), gaps
        host.per_s = 5000.0  # half in 0.1 s, under one normal round: the normal cadence
        t1 = time.time() + 1.0
        await _until(lambda: len(_rounds(d, t1)) >= 5)
        gaps = _gaps(_rounds(d, t1))
        assert all(g < 0.4 for g in gaps), gaps
        host.per_s = 0.0  # nothing fills: the slow cadence
        t2 = time.time() + 0.5
        await _until(lambda: len(_rounds(d, t2)) >= 3)
        gaps = _gaps(_rounds(d, t2))
        assert all(g > IDLE_S / 2 for g in gaps), gaps
    finally:
        await d.stop()
