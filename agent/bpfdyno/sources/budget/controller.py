"""`BudgetCollector`: measures what the agent costs and keeps it under ``[budget]``.

Its round comes as each run-statistics window completes (``[budget] stats_window_s`` every
``stats_period_s``, the process-wide meter of `bpfdyno.ebpf.runstats`, which wakes it; every
``stats_rest_period_s`` while nothing happens, `bpfdyno.sources.budget.activity`):
it reads the agent's CPU time and RSS, has what every BPF function of the agent cost in
the window, and decides:

* **Over budget** — the total (BPF run time in the latest window + the agent's threads over
  the last `AGENT_SPAN_S`) above ``cpu_ratio`` of one
  CPU in two windows in a row, or above twice the budget in one: it takes, at once, as many
  of the parts' steps (`bpfdyno.core.budget.Reduction`) as it predicts will bring the total
  to 80 % of the budget, the one saving the most first.
* **Storm over** — the total at or below 80 % of the budget for ``restore_after_s`` (since
  the last change): it undoes together every step whose part says what undoing it adds
  back (a sampled program still sees every event) while all of them keep the total under
  80 % of the budget, newest first; when none is, the newest step whose part cannot say (a
  detached program sees nothing: the undo is tried alone, and taken back at the next
  windows if the storm goes on). A step taken again soon after being undone waits twice as
  long the next time (at most `MAX_RESTORE_AFTER_S`). Then the next ones.
* **Memory** — RSS above ``rss_bytes``: the heap is trimmed; still above at the next round,
  the memory steps are taken (less history, fewer events kept), undone once RSS stays under
  70 % of the limit for ``restore_after_s``.

Everything is visible: ``status`` (this part) says what is reduced, since when and why, the
metrics count the steps, and the parts label what became estimates. One-off work done at
someone's request (compiling, merging a trace) is left out (`bpfdyno.core.budget`), and so is
work done because someone reads (`bpfdyno.core.budget.RequestedWork`: refreshing the process
table for `ps` or `top`, answering queries): it is the reader's, bounded per reader, and
named per reader in ``status``; ordinary reading never makes the agent degrade itself. So is
what a trace's recording costs (`bpfdyno.core.budget.RequestedPrograms`: the capture's BPF
programs run only while someone's trace does): charged to whoever asked for the trace,
bounded per user like their other requests, and never stepped down. A step whose data
someone relies on now (`add_needs`: the straggler detection, while it watches a job, needs
the RTT and retransmit programs) is not taken, and one held is undone at the next window:
``status`` says which and for whom. The
first `WARMUP_S` after start (first rounds, compiles) are measured but never acted on.

Steps and undos are logged at INFO; a storm (from the first step taken while none is held
until the last is undone) logs one WARNING, with the reason: the parts that add up to the
total.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bpfdyno.core.budget import (
    REQUESTED,
    Costs,
    Reduction,
    RequestedPrograms,
    RequestedWork,
    excluded_cpu_ns,
    ratio_text,
)
from bpfdyno.core.config import BudgetSection
from bpfdyno.core.metrics import Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.ebpf.compiler import trim_heap
from bpfdyno.ebpf.reductions import SampledFunctions
from bpfdyno.ebpf.runstats import METER, MeterWindow, ProcessRunStats, Rest
from bpfdyno.sources.base import Collector
from bpfdyno.sources.budget.activity import AGENT_SPAN_S, CalmWatch, read_counts
from bpfdyno.sources.budget.metrics import (
    BUDGET,
    COST,
    FUNCTION_COST,
    OVER,
    RSS_BUDGET,
    STEP_ACTIVE,
    STEPS_TAKEN,
)

log = logging.getLogger(__name__)

#: Decisions wait this long after start (the first rounds cost more; the kernel-track
#: capture compiles its programs ~5 s after start, which is left out but shares the CPU).
WARMUP_S = 20.0
#: Steps are taken until the predicted total is at most this share of the budget, and
#: undone only while the total stays under it with the step undone.
TARGET = 0.8
#: A step saving less than this share of the budget is not worth what it costs the data.
MIN_SAVING = 0.05
#: The longest wait before undoing a step that had to be taken again and again.
MAX_RESTORE_AFTER_S = 600.0
#: A function's full cost measured attached longer ago than this is not used for it while it
#: is sampled in time: its windows missed its on phase (they should not), and an old figure
#: (a storm's) would hold the step forever; what the windows measured is used instead.
FULL_COST_FRESH_S = 30.0
#: Memory steps are undone once RSS stayed under this share of the limit.
RSS_RESTORE_BELOW = 0.7

ReductionSource = Callable[[], Iterable[Reduction]]


@dataclass(slots=True)
class Held:
    """A step the budget holds: since when and why."""

    step: Reduction
    since_wall: float
    since_monotonic: float
    why: str


@dataclass(slots=True)
class _History:
    """What the budget remembers of one step across takes."""

    taken: int = 0
    undone_at: float | None = None
    restore_after_s: float = 0.0


@dataclass(slots=True)
class _Reading:
    """The agent's CPU time (excluded work left out) at one instant."""

    monotonic: float
    cpu_ns: int


@dataclass(slots=True)
class BudgetState:
    """What `status` and the trace capture read of the budget (a snapshot)."""

    costs: Costs = field(default_factory=Costs)
    rss_bytes: int = 0
    held: tuple[Held, ...] = ()
    over_since: float | None = None


class BudgetCollector(Collector):
    """Keeps the agent's cost under its budget; reports costs and steps.

    Args:
        section: the ``[budget]`` config section.
        sources: where the steps come from, asked at every decision (collectors start in
            the background and offer theirs once started).
        memory_steps: the steps that shed memory, in the order to take them.
        meter: the process-wide BPF run statistics.
        cpu_ns: CPU time of the whole agent so far (default: this process's).
        rss: the agent's RSS now in bytes (default: this process's).
        clock: monotonic seconds.
    """

    name = "budget"
    may_block = False  # /proc/self and in-memory state; steps attach and detach BPF

    def __init__(
        self,
        section: BudgetSection,
        sources: Sequence[ReductionSource] = (),
        memory_steps: Sequence[Reduction] = (),
        *,
        meter: ProcessRunStats = METER,
        cpu_ns: Callable[[], int] = time.process_time_ns,
        rss: Callable[[], int] | None = None,
        clock: Callable[[], float] = time.monotonic,
        requested: RequestedWork = REQUESTED,
        counts: Callable[[], tuple[int, ...]] = read_counts,
    ) -> None:
        self._cfg = section
        self._sources = list(sources)
        self._memory_steps = list(memory_steps)
        self._meter = meter
        self._cpu_ns = cpu_ns
        self._rss = rss or _own_rss
        self._clock = clock
        self._collector_cpu: Callable[[], Mapping[str, int]] | None = None
        self._started_at = 0.0
        self._window_seq = 0
        self._at_window: _Reading | None = None
        self._collectors_at_window: Mapping[str, int] = {}
        self._over_windows = 0
        self._calm_since: float | None = None  # since when the cost stayed under TARGET
        self._changed_at = 0.0  # when a step was last taken or undone
        self._held: list[Held] = []
        self._memory_held: list[Held] = []
        self._rss_trimmed = False
        self._rss_under_since: float | None = None
        self._history: dict[str, _History] = {}
        self._state = BudgetState()
        self._errors: list[str] = []
        # Each function's latest full cost (as if attached all the time), and when measured.
        self._last_full: dict[str, tuple[float, float]] = {}
        #: (seconds, the agent's CPU ns, each collector's CPU ns) of each recent period.
        self._agent_periods: deque[tuple[float, int, dict[str, int]]] = deque()
        self._requested = requested
        self._requested_at_window: dict[str, int] = {}
        self._requested_programs: list[Callable[[], RequestedPrograms]] = []
        self._due: Callable[[], None] | None = None
        self._needs: list[Callable[[], Mapping[str, str]]] = []
        #: The steps not taken at the latest decision because someone needs them: who.
        self._kept: dict[str, str] = {}
        #: Whether its windows may rest (`bpfdyno.sources.budget.activity`).
        self.watch = CalmWatch(
            section.cpu_ratio * 1e9,
            self._bpf_ns_s,
            lambda: not self._held and self._state.over_since is None,
            self._own_cpu_ns,
            counts,
            clock,
        )

    # -- wiring ---------------------------------------------------------------------------

    def add_source(self, source: ReductionSource) -> None:
        """Offer more steps (the daemon's own, once it exists)."""
        self._sources.append(source)

    def add_requested_programs(self, source: Callable[[], RequestedPrograms]) -> None:
        """BPF programs run only for someone's request (the trace capture's), asked at every
        window: their cost is charged to the requesters, not weighed by the budget."""
        self._requested_programs.append(source)

    def add_needs(self, source: Callable[[], Mapping[str, str]]) -> None:
        """Who needs which steps' data now (step name -> who, asked at every decision): such
        a step is not taken, and one held is undone (the detection needs the RTT of a job's
        connections while it watches the job; a budget that detached it blinded detection).
        """
        self._needs.append(source)

    def add_memory_steps(self, steps: Iterable[Reduction]) -> None:
        """Offer more memory steps (the daemon's store and recorder, once they exist)."""
        self._memory_steps.extend(steps)

    def set_collector_cpu(self, provider: Callable[[], Mapping[str, int]]) -> None:
        """Where each collector's CPU time so far comes from (the daemon's runners)."""
        self._collector_cpu = provider

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Ask the meter for the budget's run-statistics windows: every
        ``stats_period_s``, or every ``stats_rest_period_s`` while all is calm."""
        self._started_at = self._clock()
        rest_s = self._cfg.stats_rest_period_s
        rest = Rest(rest_s, self.watch.calm) if rest_s > self._cfg.stats_period_s else None
        self._meter.add_listener(self.watch.at_window)
        self._meter.request(self, self._cfg.stats_window_s, self._cfg.stats_period_s, rest)

    def set_due(self, due: Callable[[], None]) -> None:
        """A round as each window completes: the budget decides at once, and its rounds
        come no more often than its windows (between two it has nothing to do)."""
        self._due = due
        self._meter.add_listener(due)

    def close(self) -> None:
        """Undo every step held (the parts close right after) and release the meter."""
        for held in reversed(self._held + self._memory_held):
            self._undo(held.step)
        self._held, self._memory_held = [], []
        if self._due is not None:
            self._meter.remove_listener(self._due)
        self._meter.remove_listener(self.watch.at_window)
        self._meter.release(self)

    def _own_cpu_ns(self) -> int:
        """The agent's CPU time so far, the work that is not its own cost left out."""
        return self._cpu_ns() - excluded_cpu_ns() - self._requested.total_ns()

    def _bpf_ns_s(self) -> float | None:
        """What its BPF programs cost at the latest window; None before one was measured."""
        costs = self._state.costs
        return costs.bpf_total_ns_s if costs.window_s > 0 else None

    # -- a round --------------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """On a new run-statistics window: measure, decide, report costs and steps.

        Rounds between two windows report nothing (the costs are per window), which keeps
        the budget's own cost to one decision per window.
        """
        window = self._meter.last_window()
        if window is None or window.seq == self._window_seq:
            return [] if self._window_seq else self._samples()
        self._window_seq = window.seq
        now = self._clock()
        reading = _Reading(now, self._own_cpu_ns())
        rss = self._rss()
        costs = self._costs(window, reading)
        acting = self._cfg.enabled and now - self._started_at >= WARMUP_S
        if costs is not None:
            self._state.costs = costs
            if acting:
                self._decide(costs, now)
        if acting:
            self._memory(rss, now)
        self._state.rss_bytes = rss
        self._state.held = tuple(self._held + self._memory_held)
        return self._samples()

    def state(self) -> BudgetState:
        """What the budget measured and holds now (any thread)."""
        return BudgetState(
            self._state.costs, self._state.rss_bytes, self._state.held, self._state.over_since
        )

    def health(self) -> tuple[PartState, str]:
        """Ok with the costs; degraded with every step held: what, since when, why."""
        st = self._state
        costs = st.costs
        budget = self._cfg.cpu_ratio * 1e9
        head = (
            f"cost {ratio_text(costs.total_ns_s)} of a core (BPF {ratio_text(costs.bpf_total_ns_s)}"
            f", agent {ratio_text(costs.agent_ns_s)}) against a budget of {ratio_text(budget)}; "
            f"RSS {st.rss_bytes / 1e6:.0f} MB of {self._cfg.rss_bytes / 1e6:.0f} MB; "
            f"{self._windows_text()}{_requested_text(costs)}"
        )
        if not self._cfg.enabled:
            return PartState.OK, f"{head}; measuring only ([budget] enabled = false)"
        kept = self._kept_text() if st.over_since else ""
        if not st.held:
            extra = "; over budget with nothing left to reduce" if st.over_since else ""
            state = PartState.DEGRADED if st.over_since else PartState.OK
            errors = f"; {'; '.join(self._errors)}" if self._errors else ""
            return state, f"{head}; nothing reduced{extra}{kept}{errors}"
        steps = "; ".join(
            f"{h.step.name} since {_clock_text(h.since_wall)}: {h.step.what} ({h.step.lost}) "
            f"because {h.why}"
            for h in st.held
        )
        return PartState.DEGRADED, f"{head}; reduced: {steps}{kept}"

    def _kept_text(self) -> str:
        """The steps not taken because someone needs their data, and who."""
        by_who: dict[str, list[str]] = {}
        for name, who in sorted(self._kept.items()):
            by_who.setdefault(who, []).append(name)
        return "".join(
            f"; not taken while {who} needs them: {', '.join(names)}"
            for who, names in by_who.items()
        )

    def _windows_text(self) -> str:
        """How often the run statistics are measured now, and why not less often."""
        period, rest = self._cfg.stats_period_s, self._cfg.stats_rest_period_s
        if rest <= period:
            return f"run statistics every {period:g} s"
        why = self.watch.why
        if not why:
            return f"run statistics at rest (every {rest:g} s, checked every {period:g} s)"
        return f"run statistics every {period:g} s ({why})"

    # -- measuring ------------------------------------------------------------------------

    def _costs(self, window: MeterWindow, reading: _Reading) -> Costs | None:
        """The costs of the period ending with this window (None for the first one)."""
        collectors = dict(self._collector_cpu()) if self._collector_cpu is not None else {}
        prev, prev_collectors = self._at_window, self._collectors_at_window
        self._at_window, self._collectors_at_window = reading, collectors
        if prev is None or reading.monotonic <= prev.monotonic:
            return None
        period = reading.monotonic - prev.monotonic
        bpf: dict[str, float] = {}
        full: dict[str, float] = {}
        runs: dict[str, float] = {}
        entry: dict[str, float] = {}
        requested_ids: set[int] = set()
        # Every run costs its caller the kernel's entry into the function besides the body
        # the statistics time: on a context-switch storm most of what a program costs.
        entry_ns = window.entry_ns
        for source in self._requested_programs:
            asked = source()
            ids = asked.prog_ids
            requested_ids |= ids
            # The window holds part of the period: its rate over the whole period.
            spent = sum(
                f.ns_per_s + f.runs_per_s * entry_ns for f in window.functions if f.prog_id in ids
            )
            self._requested.charge(asked.readers, int(spent * period))
        for f in window.functions:
            if f.prog_id in requested_ids:
                continue  # the requesters' (charged above), never the agent's
            entered = f.runs_per_s * entry_ns
            bpf[f.name] = bpf.get(f.name, 0.0) + f.ns_per_s + entered
            entry[f.name] = entry.get(f.name, 0.0) + entered
            runs[f.name] = runs.get(f.name, 0.0) + f.runs_per_s
            whole = f.full_ns_per_s
            if whole is not None:
                full[f.name] = full.get(f.name, 0.0) + whole + f.runs / f.attached_s * entry_ns
        self._last_full.update((fn, (ns, reading.monotonic)) for fn, ns in full.items())
        fresh = {
            fn: ns
            for fn, (ns, at) in self._last_full.items()
            if reading.monotonic - at <= FULL_COST_FRESH_S
        }
        # A function detached part of each period costs its full cost times its share on
        # average; one window holds only part of a period, so it measured more or less.
        for step in self._steps():
            if isinstance(step, SampledFunctions):
                bpf.update(step.smoothed(bpf, fresh))
        grown = {
            name: max(ns - prev_collectors.get(name, ns), 0) for name, ns in collectors.items()
        }
        self._agent_periods.append((period, max(reading.cpu_ns - prev.cpu_ns, 0), grown))
        while sum(p for p, _, _ in self._agent_periods) - self._agent_periods[0][0] >= AGENT_SPAN_S:
            self._agent_periods.popleft()
        # The agent's threads and each collector's rounds over the same span: the collectors'
        # parts of the agent's cost add up to it (the rest is the loop and other threads).
        span = sum(p for p, _, _ in self._agent_periods)
        agent_ns_s = sum(ns for _, ns, _ in self._agent_periods) / span
        collector_ns_s: dict[str, float] = {}
        for _, _, each in self._agent_periods:
            for name, ns in each.items():
                collector_ns_s[name] = collector_ns_s.get(name, 0.0) + ns / span
        requested = self._requested.by_reader()
        before = self._requested_at_window
        self._requested_at_window = requested
        requested_ns_s = {
            who: (ns - before.get(who, 0)) / period
            for who, ns in requested.items()
            if ns > before.get(who, 0)
        }
        return Costs(
            bpf_ns_s=bpf,
            bpf_full_ns_s=full,
            bpf_runs_s=runs,
            bpf_entry_ns_s=entry,
            collector_ns_s=collector_ns_s,
            agent_ns_s=agent_ns_s,
            window_s=window.window_s,
            requested_ns_s=requested_ns_s,
        )

    # -- deciding -------------------------------------------------------------------------

    def _steps(self) -> list[Reduction]:
        out: list[Reduction] = []
        for source in self._sources:
            try:
                out.extend(source())
            except Exception:  # a part that cannot say what it offers offers nothing
                log.exception("budget: a part failed to list its steps")
        return out

    def _needed(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for source in self._needs:
            try:
                out.update(source())
            except Exception:  # who cannot say what it needs needs nothing
                log.exception("budget: a part failed to say which steps it needs")
        return out

    def _release_needed(self, needed: Mapping[str, str], now: float) -> None:
        """Undo the held steps someone needs now."""
        for held in [h for h in self._held if h.step.name in needed]:
            self._held.remove(held)
            self._undo(held.step)
            self._changed_at = now
            log.info(
                "budget: %s undone: %s needs it (taken because %s)",
                held.step.name,
                needed[held.step.name],
                held.why,
            )

    def _decide(self, costs: Costs, now: float) -> None:
        budget = self._cfg.cpu_ratio * 1e9
        total = costs.total_ns_s
        needed = self._needed()
        self._release_needed(needed, now)
        offered = {s.name for s in self._steps()} if needed else set()
        self._kept = {name: who for name, who in needed.items() if name in offered}
        if total > budget:
            self._over_windows += 1
            self._state.over_since = self._state.over_since or time.time()
        else:
            self._over_windows = 0
            self._state.over_since = None
        if self._over_windows >= 2 or total > 2 * budget:
            self._reduce(costs, total, budget, now)
            self._calm_since = None
        elif total <= TARGET * budget:
            self._calm_since = self._calm_since if self._calm_since is not None else now
            if self._held:
                self._maybe_restore(costs, total, budget, now)
        else:
            self._calm_since = None

    def _reduce(self, costs: Costs, total: float, budget: float, now: float) -> None:
        steps = [s for s in self._steps() if not s.active and s.name not in self._kept]
        candidates = [
            (saving, s)
            for s in steps
            for saving in (s.saving_ns_s(costs),)
            if saving >= MIN_SAVING * budget
        ]
        candidates.sort(key=lambda c: -c[0])  # the most saving first
        why_total = cost_reason(costs, budget)
        storm = not self._held
        taken: list[str] = []
        for saving, step in candidates:
            if total <= TARGET * budget:
                break
            why = (
                f"{why_total}; this step acts on {step.part} ({ratio_text(step.cost_ns_s(costs))})"
            )
            if self._take(step, why, now):
                total -= saving
                taken.append(step.name)
        if storm and taken:
            log.warning(
                "budget: over budget, reducing (%s): %s; steps and undos follow at INFO "
                "until the last is undone",
                ", ".join(taken),
                why_total,
            )
        self._over_windows = 0

    def _take(self, step: Reduction, why: str, now: float) -> bool:
        try:
            step.apply()
        except Exception as e:
            self._note_error(f"taking {step.name} failed: {e}")
            log.exception("budget: taking %s failed", step.name)
            return False
        hist = self._history.setdefault(
            step.name, _History(restore_after_s=self._cfg.restore_after_s)
        )
        hist.taken += 1
        if hist.undone_at is not None and now - hist.undone_at < 2 * hist.restore_after_s:
            # Needed again right after it was undone: the storm goes on; wait longer.
            hist.restore_after_s = min(hist.restore_after_s * 2, MAX_RESTORE_AFTER_S)
        self._changed_at = now
        held = Held(step, time.time(), now, why)
        (self._memory_held if step in self._memory_steps else self._held).append(held)
        log.info("budget: %s: %s (%s) because %s", step.name, step.what, step.lost, why)
        return True

    def _maybe_restore(self, costs: Costs, total: float, budget: float, now: float) -> None:
        """Undo the held steps whose storm is over: together, every one whose part says what
        undoing it adds back and all of which still fit under the target (newest first);
        else the newest whose part cannot say, alone (a detached program sees nothing: the
        undo is a trial, taken back if the storm goes on)."""
        assert self._calm_since is not None
        due = []
        for held in reversed(self._held):
            hist = self._history.get(held.step.name)
            wait = hist.restore_after_s if hist is not None else self._cfg.restore_after_s
            if now - max(self._calm_since, held.since_monotonic, self._changed_at) >= wait:
                due.append((held, hist, held.step.restore_ns_s(costs)))
        known, added = [], 0.0
        for held, hist, adds in due:
            if adds is not None and total + added + adds <= TARGET * budget:
                known.append((held, hist))
                added += adds
        # One at a time took a storm's five steps 2.5-3.5 minutes to undo, each data source
        # an estimate meanwhile; the ones known to fit go back together.
        chosen = known or [(held, hist) for held, hist, adds in due if adds is None][:1]
        for held, hist in chosen:
            self._held.remove(held)
            self._undo(held.step)
            if hist is not None:
                hist.undone_at = now
            self._changed_at = now
            log.info(
                "budget: %s undone (the agent cost %s of a core; taken because %s)",
                held.step.name,
                ratio_text(total),
                held.why,
            )
        if chosen and not self._held:
            log.info("budget: every step undone; the storm is over")

    def _undo(self, step: Reduction) -> None:
        try:
            step.undo()
        except Exception as e:
            self._note_error(f"undoing {step.name} failed: {e}")
            log.exception("budget: undoing %s failed", step.name)

    def _note_error(self, text: str) -> None:
        self._errors = [*self._errors[-2:], text]

    # -- memory ---------------------------------------------------------------------------

    def _memory(self, rss: int, now: float) -> None:
        limit = self._cfg.rss_bytes
        if rss > limit:
            self._rss_under_since = None
            if not self._rss_trimmed:
                self._rss_trimmed = True
                trim_heap()
                log.warning(
                    "budget: RSS %.0f MB over %.0f MB: heap trimmed", rss / 1e6, limit / 1e6
                )
                return
            for step in self._memory_steps:
                if not step.active:
                    why = f"RSS {rss / 1e6:.0f} MB over the {limit / 1e6:.0f} MB budget"
                    self._take(step, why, now)
                    return
            return
        self._rss_trimmed = False
        if rss < RSS_RESTORE_BELOW * limit and self._memory_held:
            if self._rss_under_since is None:
                self._rss_under_since = now
            elif now - self._rss_under_since >= self._cfg.restore_after_s:
                held = self._memory_held.pop()
                self._undo(held.step)
                self._rss_under_since = now

    # -- reporting ------------------------------------------------------------------------

    def _samples(self) -> list[Sample]:
        costs = self._state.costs
        out = [
            sample(BUDGET, self._cfg.cpu_ratio),
            sample(RSS_BUDGET, self._cfg.rss_bytes),
        ]
        if costs.window_s > 0:
            out += [
                sample(COST, costs.bpf_total_ns_s / 1e9, {"part": "bpf"}),
                sample(COST, costs.agent_ns_s / 1e9, {"part": "agent"}),
                sample(COST, costs.total_ns_s / 1e9, {"part": "total"}),
                sample(OVER, float(costs.total_ns_s > self._cfg.cpu_ratio * 1e9)),
            ]
            out += [
                sample(FUNCTION_COST, ns / 1e9, {"program": name})
                for name, ns in sorted(costs.bpf_ns_s.items())
            ]
        held = {h.step.name for h in self._held + self._memory_held}
        names = sorted({s.name for s in self._steps()} | set(self._history) | held)
        for name in names:
            out.append(sample(STEP_ACTIVE, float(name in held), {"step": name}))
            hist = self._history.get(name)
            out.append(sample(STEPS_TAKEN, hist.taken if hist else 0, {"step": name}))
        return out


def cost_reason(costs: Costs, budget: float) -> str:
    """Why the agent is over budget, as the parts that add up to the total: its BPF
    programs (the costliest named) plus its threads (each collector's rounds, then the
    rest: the event loop, the servers, the exporters); readers' work said apart."""
    bpf = sorted(costs.bpf_ns_s.items(), key=lambda kv: -kv[1])
    threads = sorted(costs.collector_ns_s.items(), key=lambda kv: -kv[1])
    rest = costs.agent_ns_s - sum(ns for _, ns in threads)
    entered = sum(costs.bpf_entry_ns_s.values())
    runs = sum(costs.bpf_runs_s.get(name, 0.0) for name in costs.bpf_entry_ns_s)
    entry_text = (
        f"; the kernel's entry into them {ratio_text(entered)}, {entered / runs:.0f} ns a run"
        if entered > 0 and runs > 0
        else ""
    )
    return (
        f"the agent cost {ratio_text(costs.total_ns_s)} of a core against "
        f"{ratio_text(budget)}: BPF {ratio_text(costs.bpf_total_ns_s)} "
        f"({_parts_text(bpf)}{entry_text}) + its threads {ratio_text(costs.agent_ns_s)} "
        f"({_parts_text([*threads, ('loop and others', rest)])})"
        f"{_requested_text(costs)}"
    )


def _parts_text(parts: Sequence[tuple[str, float]], most: int = 4) -> str:
    """The ``most`` costliest parts by name, the others together."""
    shown = [f"{name} {ratio_text(ns)}" for name, ns in parts[:most]]
    others = sum(ns for _, ns in parts[most:])
    if len(parts) > most:
        shown.append(f"{len(parts) - most} others {ratio_text(others)}")
    return ", ".join(shown) or "none"


def _requested_text(costs: Costs) -> str:
    """Readers' requested work, theirs and left out of the budget (empty: none)."""
    if not costs.requested_ns_s:
        return ""
    each = sorted(costs.requested_ns_s.items(), key=lambda kv: -kv[1])
    return f"; requested by readers, theirs, not counted: {_parts_text(each)}"


def _own_rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _clock_text(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s).strftime("%H:%M:%S")
