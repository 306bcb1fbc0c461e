"""The budget's windows rest while nothing happens: the meter's rest cadence (a real meter,
the kernel's BPF statistics turned on and off) and the check that ends it (the kernel's
event counts and the agent's CPU, here as the test sets them, so every decision is checked
against known numbers). The same in a real agent under a real storm: test_budget_storm_rest.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from bpfdyno.core.config import ConfigError, load
from bpfdyno.ebpf.runstats import ProcessRunStats, Rest
from bpfdyno.sources.budget.activity import EVENT_NS, RISE_SHARE, CalmWatch, read_counts

MS = 1_000_000  # ns in a millisecond: 1 ms of CPU a second is 0.1 % of a core
BUDGET = 0.02 * 1e9  # the default budget, ns a second


def test_the_kernels_event_counts_are_read_from_proc_stat(tmp_path: pytest.TempPathFactory) -> None:
    stat = tmp_path / "stat"  # type: ignore[operator]
    stat.write_text(
        "cpu  10 0 20 300 0 0 0 0 0 0\n"
        "cpu0 10 0 20 300 0 0 0 0 0 0\n"
        "intr 987654 12 0 0 7\n"
        "ctxt 4242\n"
        "btime 1700000000\n"
        "processes 31337\n"
        "procs_running 1\n"
        "procs_blocked 0\n"
        "softirq 55555 1 2 3 4 5 6 7 8 9 10\n"
    )
    assert read_counts(str(stat)) == (4242, 987654, 55555, 31337)
    # And this machine's own file: every counter there, none going backwards.
    a = read_counts()
    b = read_counts()
    assert all(x > 0 for x in a) and all(y >= x for x, y in zip(a, b, strict=True))


class Machine:
    """What the watch reads, as the test sets it: a clock, event counts, the agent's CPU."""

    def __init__(self) -> None:
        self.now = 100.0
        self.counts = [1000, 2000, 3000, 40]
        self.cpu = 0
        self.bpf: float | None = 0.2 * MS  # the agent's BPF programs at rest: 0.02 %
        self.allowed = True
        self.watch = CalmWatch(
            BUDGET,
            lambda: self.bpf,
            lambda: self.allowed,
            lambda: self.cpu,
            lambda: tuple(self.counts),
            lambda: self.now,
        )

    def run(self, seconds: float, per_s: tuple[int, ...], agent_ns_s: float) -> None:
        self.now += seconds
        self.counts = [c + int(r * seconds) for c, r in zip(self.counts, per_s, strict=True)]
        self.cpu += int(agent_ns_s * seconds)


IDLE = (300, 200, 150, 2)  # context switches, interrupts, softirqs, process starts a second


def rested(m: Machine) -> Machine:
    """Two windows 10 s apart at the idle rates: the reference is set."""
    m.watch.at_window()
    m.run(10, IDLE, 2 * MS)
    m.watch.at_window()
    return m


def test_calm_at_the_rates_of_the_latest_window_and_the_agent_far_under_its_budget() -> None:
    m = rested(Machine())
    for _ in range(4):  # the checks between two windows
        m.run(2, IDLE, 3 * MS)
        assert m.watch.calm(), m.watch.why
    # A little more of everything, under twice the reference plus the floor: still calm.
    assert m.watch.floor_per_s == RISE_SHARE * BUDGET / EVENT_NS == 1000
    m.run(2, (1590, 1390, 1290, 1000), 3 * MS)
    assert m.watch.calm(), m.watch.why


@pytest.mark.parametrize(
    ("which", "rate", "why"),
    [
        (0, 1601, "ctxt 1601/s against 300/s"),  # a pipe storm, a ping-pong
        (1, 1401, "intr 1401/s against 200/s"),
        (2, 1301, "softirq 1301/s against 150/s"),  # packets over loopback
        (3, 1005, "processes 1005/s against 2/s"),  # thread or process churn
    ],
)
def test_any_event_rate_past_twice_its_reference_and_the_floor_ends_the_rest(
    which: int, rate: int, why: str
) -> None:
    m = rested(Machine())
    m.run(2, IDLE, 2 * MS)
    assert m.watch.calm()
    per_s = list(IDLE)
    per_s[which] = rate
    m.run(2, tuple(per_s), 2 * MS)
    assert not m.watch.calm()
    assert m.watch.why == why
    # The window it brings takes the new rates as the reference: calm again at them.
    m.run(0.5, tuple(per_s), 2 * MS)
    m.watch.at_window()
    m.run(2, tuple(per_s), 2 * MS)
    assert m.watch.calm(), m.watch.why


def test_the_agents_own_cost_past_half_its_budget_ends_the_rest() -> None:
    """Its threads over the last 10 s, as the budget counts them (a moment of work, a
    status call or a garbage collection, does not end the rest)."""
    m = rested(Machine())  # 10 s at 2 ms a second
    m.run(2, IDLE, 30 * MS)  # a 60 ms moment: 7.6 ms a second over the last 10 s
    assert m.watch.calm(), m.watch.why
    for _ in range(6):  # the moment leaves the span
        m.run(2, IDLE, 2 * MS)
        assert m.watch.calm(), m.watch.why
    for _ in range(6):
        m.run(2, IDLE, 9.8 * MS - m.bpf)  # type: ignore[operator]
        assert m.watch.calm(), m.watch.why  # at most 0.98 % of a core: half the 2 % budget
    for _ in range(5):
        m.run(2, IDLE, 10.2 * MS - m.bpf)  # type: ignore[operator]
        m.watch.calm()
    m.run(2, IDLE, 10.2 * MS - m.bpf)  # type: ignore[operator]
    assert not m.watch.calm()
    assert m.watch.why == "the agent at 1.02 % of a core"


def test_no_rest_before_a_window_was_measured_or_while_the_budget_acts() -> None:
    m = Machine()
    m.bpf = None
    m.watch.at_window()
    m.run(2, IDLE, 2 * MS)
    assert not m.watch.calm() and m.watch.why == "not measured yet"
    m = rested(Machine())
    m.allowed = False  # a step held, or over the budget
    m.run(2, IDLE, 2 * MS)
    assert not m.watch.calm() and m.watch.why == "the budget holds a step or is over"


class Owner:
    """A requester of windows (the meter keys requests by their owner)."""


@pytest.mark.root
def test_the_meter_rests_while_calm_and_measures_at_once_when_not() -> None:
    """A real meter: windows of 0.05 s every 0.2 s, or every 2 s while the check says calm
    (asked at each 0.2 s tick between); not calm, a window at the next tick."""
    meter = ProcessRunStats()  # its own, not the process's
    calm = threading.Event()
    calm.set()
    checks: list[float] = []

    def check() -> bool:
        checks.append(time.monotonic())
        return calm.is_set()

    owner = Owner()
    meter.request(owner, 0.05, 0.2, Rest(2.0, check))
    try:
        first = meter.wait_window(0, timeout=10)
        assert first is not None
        time.sleep(3.0)
        calm_windows = meter.last_window()
        assert calm_windows is not None
        # 3 s at rest: the window at 2 s, and the one at 4 s not yet; 9 checks, one a tick.
        assert calm_windows.seq - first.seq == 1, calm_windows
        assert 12 <= len(checks) <= 16, checks
        calm.clear()
        asked = time.monotonic()
        window = meter.wait_window(calm_windows.seq, timeout=5)
        assert window is not None
        assert window.end_monotonic - asked < 0.2 + 0.05 + 0.2  # a tick, a window, slack
        # Not calm: a window every period again.
        time.sleep(1.0)
        later = meter.last_window()
        assert later is not None and later.seq - window.seq >= 3, (window, later)
    finally:
        meter.release(owner)


def test_a_rest_period_shorter_than_the_period_is_refused_with_what_to_set() -> None:
    with pytest.raises(ConfigError) as e:
        load(None, [("budget.stats_rest_period_s", "1")])
    assert str(e.value) == (
        "command line: 'budget.stats_rest_period_s' must be 0 (a window every period) or "
        "from budget.stats_period_s to 60 s"
    )
    assert load(None, [("budget.stats_rest_period_s", "0")]).budget.stats_rest_period_s == 0
    assert load(None, []).budget.stats_rest_period_s == 10.0


@pytest.mark.root
def test_a_check_that_fails_brings_a_window_every_period_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    meter = ProcessRunStats()

    def broken() -> bool:
        raise OSError("no /proc/stat")

    owner = Owner()
    meter.request(owner, 0.05, 0.2, Rest(2.0, broken))
    try:
        first = meter.wait_window(0, timeout=10)
        assert first is not None
        time.sleep(1.0)
        later = meter.last_window()
        assert later is not None and later.seq - first.seq >= 3, (first, later)
    finally:
        meter.release(owner)
    failed = [r for r in caplog.records if "calm check failed" in r.getMessage()]
    assert len(failed) == 1
