"""The budget's rounds follow its run-statistics windows: a real daemon and a real meter (the
kernel's BPF statistics turned on and off), with short windows so the test takes seconds."""

from __future__ import annotations

import asyncio
import time

import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.core.config import load
from bpfdyno.ebpf.runstats import ProcessRunStats
from bpfdyno.sources.budget.controller import BudgetCollector

pytestmark = pytest.mark.root


async def test_the_budget_has_a_round_as_each_window_completes_and_none_between() -> None:
    """Its interval (30 s by default) only bounds the wait when no window comes: each window
    brings one round at once (so it decides without waiting for its next tick), and there
    are no rounds between windows (it would have nothing to do)."""
    cfg = load(
        None,
        [
            ("budget.stats_window_s", "0.1"),
            ("budget.stats_period_s", "0.4"),
            ("budget.stats_rest_period_s", "0"),  # a window every period (no rest)
        ],
    )
    assert cfg.collector_interval("budget") == 30.0
    meter = ProcessRunStats()  # its own, not the process's
    budget = BudgetCollector(cfg.budget, meter=meter)
    d = Daemon(cfg, [budget], steady=["budget"])
    await d.start()
    try:
        (runner,) = d.runners
        await asyncio.sleep(4.0)
        window = meter.last_window()
        assert window is not None and window.seq >= 5, window
        # The first round at start, then one per window (the last may be on its way).
        assert window.seq <= runner.collections <= window.seq + 1, (runner.collections, window)
        assert runner.last_round_at is not None
        assert runner.last_round_at - window.end_monotonic < 0.3  # right after it
    finally:
        await d.stop()


class Machine:
    """The kernel's event counts as the test sets them (a shared machine's own come and go
    with other users' work): each grows at its rate a second."""

    def __init__(self) -> None:
        self.rates = (300.0, 200.0, 150.0, 2.0)  # switches, interrupts, softirqs, starts
        self._at = time.monotonic()
        self._counts = [0.0, 0.0, 0.0, 0.0]

    def counts(self) -> tuple[int, ...]:
        now = time.monotonic()
        self._counts = [
            c + r * (now - self._at) for c, r in zip(self._counts, self.rates, strict=True)
        ]
        self._at = now
        return tuple(int(c) for c in self._counts)


async def test_windows_rest_while_nothing_happens_and_come_at_once_when_a_rate_rises() -> None:
    """A real daemon, budget and meter: windows every 0.4 s, or every 2 s at rest (the
    check at each 0.4 s tick); softirqs jumping 100-fold (a packet storm) bring a window
    and a budget round at the next tick; at the storm's steady rate the windows rest again."""
    cfg = load(
        None,
        [
            ("budget.stats_window_s", "0.1"),
            ("budget.stats_period_s", "0.4"),
            ("budget.stats_rest_period_s", "2"),
        ],
    )
    machine = Machine()
    meter = ProcessRunStats()  # its own, not the process's
    budget = BudgetCollector(cfg.budget, meter=meter, counts=machine.counts)
    d = Daemon(cfg, [budget], steady=["budget"])
    await d.start()
    try:
        (runner,) = d.runners
        await asyncio.sleep(2.5)  # two windows measured: the reference and the costs
        first = meter.last_window()
        assert first is not None
        await asyncio.sleep(6.0)
        rested = meter.last_window()
        assert rested is not None
        # 6 s at rest: a window every 2 s (15 with one every period).
        assert rested.seq - first.seq <= 4, (first, rested, budget.watch.why)
        assert budget.watch.why == ""
        # Right after a window (the next one at rest: 2 s on), the storm begins.
        while (w := meter.last_window()) is not None and w.seq == rested.seq:
            await asyncio.sleep(0.02)
        assert w is not None
        rested = w
        machine.rates = (300.0, 200.0, 15_000.0, 2.0)
        asked = time.monotonic()
        while (w := meter.last_window()) is not None and w.seq == rested.seq:
            assert time.monotonic() - asked < 2.0, "no window at the next tick"
            await asyncio.sleep(0.02)
        assert w is not None
        assert w.end_monotonic - asked < 0.4 + 0.1 + 0.3  # a tick, a window, slack
        await asyncio.sleep(0.3)
        assert runner.last_round_at is not None and runner.last_round_at >= w.end_monotonic
        # At the storm's rate (the new reference) nothing rises: at rest again.
        await asyncio.sleep(1.0)
        steady = meter.last_window()
        assert steady is not None
        await asyncio.sleep(4.0)
        again = meter.last_window()
        assert again is not None and again.seq - steady.seq <= 3, (steady, again)
    finally:
        await d.stop()


def test_the_budgets_status_says_how_often_it_measures_and_why() -> None:
    cfg = load(None, [])
    budget = BudgetCollector(cfg.budget, meter=ProcessRunStats())
    assert budget.health()[1].endswith(
        "; run statistics every 2 s (not measured yet); nothing reduced"
    )
    budget.watch.why = ""
    assert budget.health()[1].endswith(
        "; run statistics at rest (every 10 s, checked every 2 s); nothing reduced"
    )
    budget.watch.why = "softirq 15000/s against 150/s"
    assert budget.health()[1].endswith(
        "; run statistics every 2 s (softirq 15000/s against 150/s); nothing reduced"
    )
    off = BudgetCollector(load(None, [("budget.stats_rest_period_s", "0")]).budget)
    assert off.health()[1].endswith("; run statistics every 2 s; nothing reduced")
