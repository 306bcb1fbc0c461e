"""Per-CPU series on a node with more CPUs than ``per_cpu_series_max``: reported every few
rounds while nobody reads them, every round while someone does, and never older than one
round when read (real host collector, real daemon rounds)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.core.config import load
from bpfdyno.core.store import SeriesView
from bpfdyno.services import agent as agent_service
from bpfdyno.services.agent import AgentService
from bpfdyno.sources import percpu
from bpfdyno.sources.host.collector import HostCollector
from bpfdyno.sources.percpu import PerCpuCadence, PerCpuReads

INTERVAL_S = 0.2
EVERY = 10  # per-CPU series every 2 s while nobody reads


def test_the_cadence_follows_readers() -> None:
    now = [0.0]
    reads = PerCpuReads(clock=lambda: now[0])
    cadence = PerCpuCadence(4, reads)
    assert [cadence.due() for _ in range(8)] == [True, False, False, False] * 2
    reads.note()
    assert [cadence.due() for _ in range(6)] == [True] * 6
    now[0] += percpu.READ_DEMAND_S
    assert [cadence.due() for _ in range(4)] == [False, False, True, False]  # rounds 14-17


@pytest.fixture()
def reads(monkeypatch: pytest.MonkeyPatch) -> PerCpuReads:
    """A record of reads of this test's own (others may have read per-CPU series lately)."""
    fresh = PerCpuReads()
    monkeypatch.setattr(percpu, "PER_CPU_READS", fresh)
    monkeypatch.setattr(agent_service, "PER_CPU_READS", fresh)
    return fresh


def _last_ts(series: list[SeriesView]) -> tuple[float, float]:
    """(the last point of the cores' series, of cpu="total": reported every round)."""
    cores = [v.points[-1].ts for v in series if ("cpu", "total") not in v.labels]
    total = [v.points[-1].ts for v in series if ("cpu", "total") in v.labels]
    assert cores and total
    return min(cores), max(total)


async def _until(check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(INTERVAL_S / 4)


async def test_a_read_gets_per_cpu_series_of_the_latest_round(reads: PerCpuReads) -> None:
    cfg = load(None, [("daemon.interval_s", str(INTERVAL_S)), ("daemon.history_s", "60")])
    d = Daemon(cfg, [HostCollector(per_cpu_every=EVERY)])
    svc = AgentService(d)
    name = ["cpu_utilization_ratio"]
    await d.start()
    try:

        def totals_since(t: float) -> int:
            """Rounds since ``t`` (the cpu="total" series gets a point every round)."""
            views = d.store.window(t + 1e-6, time.time() + 60, name)
            return sum(len(v.points) for v in views if ("cpu", "total") in v.labels)

        # Per-core ratios need two readings (rounds 0 and EVERY); then two rounds without.
        await _until(lambda: len(d.store.latest(name)) > 1)
        first, _ = _last_ts(d.store.latest(name))
        await _until(lambda: totals_since(first) >= 2)
        cores, total = _last_ts(d.store.latest(name))  # the store as nobody read it yet
        assert cores < total, "the cores' series are rounds old"
        assert not reads.wanted()

        cores, total = _last_ts((await svc.fresh_snapshot(name)).series)
        assert cores == total, "the read waited for the next round, which reported them"
        assert reads.wanted()
        # While read, every round reports them: as many points per core as rounds.
        read_at = total
        await _until(lambda: totals_since(read_at) >= 5)
        views = d.store.window(read_at + 1e-6, time.time() + 60, name)
        counts = {dict(v.labels)["cpu"]: len(v.points) for v in views}
        assert len(counts) > 1 and len(set(counts.values())) == 1, counts
    finally:
        await d.stop()
