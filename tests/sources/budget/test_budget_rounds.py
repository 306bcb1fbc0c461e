"""The budget's rounds follow its run-statistics windows: a real daemon and a real meter (the
kernel's BPF statistics turned on and off), with short windows so the test takes seconds."""

from __future__ import annotations

import asyncio

import pytest

from bpfdyno.app.daemon import Daemon
from bpfdyno.core.config import load
from bpfdyno.ebpf.runstats import ProcessRunStats
from bpfdyno.sources.budget.controller import BudgetCollector

pytestmark = pytest.mark.root


async def test_the_budget_has_a_round_as_each_window_completes_and_none_between() -> None:
    """Its interval (10 s by default) only bounds the wait when no window comes: each window
    brings one round at once (so it decides without waiting for its next tick), and there
    are no rounds between windows (it would have nothing to do)."""
    cfg = load(None, [("budget.stats_window_s", "0.1"), ("budget.stats_period_s", "0.4")])
    assert cfg.collector_interval("budget") == 10.0
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
