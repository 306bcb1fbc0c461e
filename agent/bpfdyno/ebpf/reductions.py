"""The two budget steps any BPF program offers: sample functions in time, detach them.

A collector builds them for its own functions (it alone knows what its data loses) and
reads their state to scale what it counted (`SampledFunctions.held_off_ns`) or leave out
what it no longer sees (`DetachedFunctions.active`). The savings come from the process-wide
run statistics (`bpfdyno.core.budget.Costs`), so any function of any program is accounted
the same way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping

from bpfdyno.core.budget import Costs, Reduction
from bpfdyno.ebpf.duty import DUTY, AttachedFunctions, FlagSwitch
from bpfdyno.ebpf.program import BpfProgram

#: What a function told to stay off by its flag still costs, as a share of its full work:
#: the flag's lookup and its exact host-wide counts (measured: a few ns of ~100).
FLAG_OFF_COST = 0.15


class _FunctionsStep(Reduction):
    """A step on some functions of one program."""

    def __init__(
        self,
        program: BpfProgram,
        fns: Collection[str],
        *,
        name: str,
        part: str,
        what: str,
        lost: str,
    ) -> None:
        self.program = program
        self.fns = frozenset(fns)
        self.name, self.part, self.what, self.lost = name, part, what, lost
        self.active = False

    def cost_ns_s(self, costs: Costs) -> float:
        return sum(costs.bpf_ns_s.get(fn, 0.0) for fn in self.fns)


class SampledFunctions(_FunctionsStep):
    """Let functions do their work only ``share`` of the time (`bpfdyno.ebpf.duty`).

    Args:
        program: the program whose functions these are.
        fns: the functions.
        share: the share of every period they do their work.
        flag: (array map, slot) the functions read to know they are off; None: they are
            detached while off.
        after: a step told off by a flag on the same functions and share: this one is then
            the stronger step after it, detaching them in the same off phase (every sampled
            function shares one phase), and is offered only while that one is in force.
        name, part, what, lost: as in `Reduction`.
    """

    def __init__(
        self,
        program: BpfProgram,
        fns: Collection[str],
        share: float,
        *,
        flag: tuple[str, int] | None = None,
        after: SampledFunctions | None = None,
        name: str,
        part: str,
        what: str,
        lost: str,
    ) -> None:
        super().__init__(program, fns, name=name, part=part, what=what, lost=lost)
        self.share_when_applied = share
        self.flag: tuple[str, int] | None = flag
        self.after: SampledFunctions | None = after
        #: The stronger step built on this one (whose `after` this is), if any: this one is
        #: not undone while that one is in force.
        self.stronger: SampledFunctions | None = None
        if after is not None:
            if (
                flag is not None
                or after.flag is None
                or after.fns != self.fns
                or after.share_when_applied != share
            ):
                raise ValueError(
                    "a step after a flagged one must detach the same functions at its share"
                )
            after.stronger = self
        self.target: AttachedFunctions | FlagSwitch = (
            FlagSwitch(program, *flag) if flag is not None else AttachedFunctions(program, fns)
        )
        self._ns_per_run: dict[str, float] = {}  # each function's full cost per run, when taken

    @property
    def share(self) -> float:
        """The share of the time the functions do their work now (1: not sampled)."""
        return self.share_when_applied if self.active else 1.0

    def held_off_ns(self) -> int:
        """How long the functions have been off so far (the reader scales by it)."""
        return DUTY.held_off_ns(self.target)

    def apply(self) -> None:
        DUTY.sample(self.target, self.share_when_applied)
        self.active = True

    def undo(self) -> None:
        DUTY.sample(self.target, 1.0)
        self.active = False

    def saving_ns_s(self, costs: Costs) -> float:
        if self.active:
            return 0.0
        if self.after is not None:
            if not self.after.active:
                return 0.0  # the gentler step first: it keeps the host-wide counts exact
            # Flagged off, every call still enters them: detached in the same off phase,
            # the kernel's entry then is saved (and the few ns of the flag's check).
            entry = sum(costs.bpf_entry_ns_s.get(fn, 0.0) for fn in self.fns)
            return entry * (1 - self.share_when_applied)
        for fn in self.fns:  # remembered for `restore_ns_s`
            runs = costs.bpf_runs_s.get(fn, 0.0)
            if runs > 0:
                self._ns_per_run[fn] = costs.bpf_ns_s.get(fn, 0.0) / runs
        if self.flag is None:
            return self.cost_ns_s(costs) * (1 - self.share_when_applied)
        # Told off by a flag, the functions still run (and are entered) at every event.
        body = self.cost_ns_s(costs) - sum(costs.bpf_entry_ns_s.get(fn, 0.0) for fn in self.fns)
        return body * (1 - self.share_when_applied) * (1 - FLAG_OFF_COST)

    def restore_ns_s(self, costs: Costs) -> float | None:
        if self.stronger is not None and self.stronger.active:
            return math.inf  # undone after the stronger step only: it builds on this one
        if self.flag is not None:  # they still run at every event: the rate is known
            full = sum(
                costs.bpf_runs_s.get(fn, 0.0) * self._ns_per_run.get(fn, 0.0) for fn in self.fns
            )
            return max(full - self.cost_ns_s(costs), 0.0)
        whole = [costs.bpf_full_ns_s.get(fn) for fn in self.fns]
        if any(w is None for w in whole):
            return None
        if self.after is not None and self.after.active:
            # Undone, the off phase goes back to the flagged step, not to the full work.
            flagged = self._flagged_off_ns_s(costs)
            if flagged is not None:
                return flagged
        return sum(w for w in whole if w is not None) - self.cost_ns_s(costs)

    def _flagged_off_ns_s(self, costs: Costs) -> float | None:
        """What the functions would cost in their off phase told off by the flag (the
        kernel's entry and the flag's check at every call), from the calls they see on."""
        assert self.after is not None
        out = 0.0
        for fn in self.fns:
            whole = costs.bpf_full_ns_s.get(fn)
            per_run = self.after._ns_per_run.get(fn)  # its full work per call, before steps
            runs = costs.bpf_runs_s.get(fn, 0.0)
            if whole is None or not per_run or runs <= 0:
                return None
            entry = costs.bpf_entry_ns_s.get(fn, 0.0) / runs
            calls = whole / per_run  # a second's calls, attached all the time
            body = max(per_run - entry, 0.0)
            out += calls * (1 - self.share_when_applied) * (entry + FLAG_OFF_COST * body)
        return out

    def smoothed(
        self, measured: Mapping[str, float], full: Mapping[str, float]
    ) -> dict[str, float]:
        """What the functions cost on average while detached part of each period.

        A run-statistics window holds some of a period, so what it measured swings between
        their full cost and nothing; the budget counts the full cost times the share instead.
        Only for functions detached while off, and only while in force.
        """
        if not self.active or self.flag is not None:
            return {}
        return {fn: full[fn] * self.share_when_applied for fn in self.fns if fn in full} | {
            fn: measured[fn] for fn in self.fns if fn not in full and fn in measured
        }


class DetachedFunctions(_FunctionsStep):
    """Keep functions detached (their owner still wants them: they come back on `undo`).

    Args:
        program: the program whose functions these are.
        fns: the functions.
        name, part, what, lost: as in `Reduction`.
    """

    #: When (monotonic seconds) the functions were last attached again; 0.0: never detached.
    attached_again_at = 0.0

    def apply(self) -> None:
        self.active = True
        self.program.suspend(self.fns, True)

    def undo(self) -> None:
        self.program.suspend(self.fns, False)
        self.active = False
        self.attached_again_at = time.monotonic()

    def complete_since(self) -> float:
        """Since when (monotonic seconds) the functions have seen every event: counts taken
        over an interval that began earlier miss the events of a detached time (inf while
        detached)."""
        return math.inf if self.active else self.attached_again_at

    def saving_ns_s(self, costs: Costs) -> float:
        return 0.0 if self.active else self.cost_ns_s(costs)
