"""Whether anything happens that could cost the agent: what lets the budget's windows rest.

A run-statistics window (the statistics turned on and off, every BPF function read) costs
~1 ms of the agent's CPU; while the agent costs far less than its budget and the machine
does what it did, a window every ``[budget] stats_rest_period_s`` tells the budget all it
needs. What its BPF programs cost follows the events they run on, and the kernel counts
those events anyway: context switches (the scheduler's programs), interrupts and softirqs
(the interrupt programs, and every packet over loopback), process starts (exec and exit) —
the ``ctxt``, ``intr``, ``softirq`` and ``processes`` lines of ``/proc/stat``, one read. A
storm raises one of them at once, and the agent's own CPU time (one clock read) shows the
rest; either brings a window at the next tick (``stats_period_s``), so the budget still
acts within a window or two of a storm's start, as without the rest.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: The kernel's cumulative counts of the events the agent's programs run on (/proc/stat).
COUNTERS = (b"ctxt", b"intr", b"softirq", b"processes")
#: A rate counts as risen past twice what it was at the latest window plus what would cost
#: this share of the budget...
RISE_SHARE = 0.05
#: ...at this much BPF run time an event (the agent's programs cost 0.1-2 µs a run).
EVENT_NS = 1000.0
#: Windows rest only while the agent, at its latest window's BPF cost and its threads' CPU
#: over the last `AGENT_SPAN_S`, costs at most this share of its budget.
REST_BELOW = 0.5
#: The agent's threads are counted over this long (BPF over the last window), by the budget
#: and by the check alike: a status call, a garbage collection or a burst of stream clients
#: lasts a moment and must not trip the budget, while a storm shows in the BPF programs at
#: once.
AGENT_SPAN_S = 10.0


def read_counts(path: str = "/proc/stat") -> tuple[int, ...]:
    """The `COUNTERS` from ``path``, in that order (0 for one the kernel does not show)."""
    with open(path, "rb") as f:
        text = f.read()
    out: list[int] = []
    for name in COUNTERS:
        at = text.find(b"\n" + name + b" ")
        if at < 0:
            out.append(0)
            continue
        start = at + len(name) + 2
        end = text.find(b" ", start)
        line_end = text.find(b"\n", start)
        if end < 0 or (0 <= line_end < end):
            end = line_end if line_end >= 0 else len(text)
        out.append(int(text[start:end]))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class _Reading:
    monotonic: float
    counts: tuple[int, ...]
    agent_cpu_ns: int


class CalmWatch:
    """Says whether the machine and the agent are as calm as at the budget's latest window.

    `at_window` (each window, on the meter's thread) takes the reference: the events' rates
    over the period that window ends. `calm` (each tick between windows, same thread) is
    True while no rate rose past twice its reference plus ``floor_per_s`` and the agent's
    cost (its threads over the last `AGENT_SPAN_S`) stays at most `REST_BELOW` of its budget.

    Args:
        budget_ns_s: the budget, ns of CPU a second.
        bpf_ns_s: what the agent's BPF programs cost at the latest window (ns a second);
            None while not measured yet (no rest then).
        resting_allowed: whether the budget can rest now (nothing held, not over).
        agent_cpu_ns: the agent's CPU time so far, its requested and excluded work left out.
        counts: the kernel's event counts now (`read_counts`).
        clock: monotonic seconds.
    """

    def __init__(
        self,
        budget_ns_s: float,
        bpf_ns_s: Callable[[], float | None],
        resting_allowed: Callable[[], bool],
        agent_cpu_ns: Callable[[], int],
        counts: Callable[[], tuple[int, ...]] = read_counts,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._budget = budget_ns_s
        self._bpf = bpf_ns_s
        self._allowed = resting_allowed
        self._cpu = agent_cpu_ns
        self._counts = counts
        self._clock = clock
        #: Events a second that count as a rise over the reference (`RISE_SHARE`).
        self.floor_per_s = RISE_SHARE * budget_ns_s / EVENT_NS
        self._window: _Reading | None = None  # at the latest window
        self._reference: tuple[float, ...] | None = None  # the rates that window ended
        self._last: _Reading | None = None  # at the latest check or window
        # (monotonic, the agent's CPU ns) of the checks and windows over the last span.
        self._cpu_seen: deque[tuple[float, int]] = deque()
        #: Why the latest check was not calm ("" when it was).
        self.why = "not measured yet"

    def _read(self) -> _Reading:
        now = _Reading(self._clock(), self._counts(), self._cpu())
        seen = self._cpu_seen
        seen.append((now.monotonic, now.agent_cpu_ns))
        # Keep the latest reading at least a span old: the rate is over a span or a little more.
        while len(seen) > 2 and now.monotonic - seen[1][0] >= AGENT_SPAN_S:
            seen.popleft()
        return now

    def at_window(self) -> None:
        """A window completed: the rates since the one before are the reference."""
        now = self._read()
        prev = self._window
        if prev is not None and now.monotonic > prev.monotonic:
            self._reference = _rates(prev, now)
        self._window = self._last = now

    def calm(self) -> bool:
        """Whether a window can wait for the rest period (see the class)."""
        now = self._read()
        prev, self._last = self._last, now
        self.why = self._unrest(prev, now)
        return not self.why

    def _unrest(self, prev: _Reading | None, now: _Reading) -> str:
        bpf = self._bpf()
        if bpf is None or self._reference is None or prev is None:
            return "not measured yet"
        if not self._allowed():
            return "the budget holds a step or is over"
        dt = now.monotonic - prev.monotonic
        if dt <= 0:
            return ""
        for name, rate, ref in zip(COUNTERS, _rates(prev, now), self._reference, strict=True):
            if rate > 2 * ref + self.floor_per_s:
                return f"{name.decode()} {rate:.0f}/s against {ref:.0f}/s"
        since, cpu_then = self._cpu_seen[0]
        agent = max(now.agent_cpu_ns - cpu_then, 0) / max(now.monotonic - since, dt)
        if agent + bpf > REST_BELOW * self._budget:
            return f"the agent at {(agent + bpf) / 1e7:.2f} % of a core"
        return ""


def _rates(a: _Reading, b: _Reading) -> tuple[float, ...]:
    dt = b.monotonic - a.monotonic
    return tuple(max(y - x, 0) / dt for x, y in zip(a.counts, b.counts, strict=True))
