"""The budget's books while a trace holds the interrupt programs its step had detached.

The interrupt collector's real programs in the kernel and its real step
(``irq.softirq_detached``), wired to the budget as the daemon wires them; the budget's
measurements come from the test (the agent's CPU time, and windows built from exact costs
under the programs' real kernel ids), so what is charged to whom is checked to the
nanosecond: while the step is in force the programs run only for the traces that hold them,
and what they cost is those traces' requesters', never the agent's, counted once.
"""

from __future__ import annotations

import os

import pytest
from test_budget_controller import MS, Agent, Step

from bpfdyno.core.budget import RequestedWork
from bpfdyno.ebpf.runstats import FunctionCost, MeterWindow
from bpfdyno.sources.irq import collector as irq_mod
from bpfdyno.sources.irq.collector import IrqCollector

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root"),
]

IRQ_FNS = [fn for _, fn in irq_mod.PROGRAMS]
#: What each interrupt program costs in the test's windows: together 4 % of a core, four
#: times the budget (1 %), so the budget takes their step.
EACH_NS_S = 10 * MS
#: The agent's other function (a collector's program the budget keeps weighing).
OTHER = "bpfdyno_nsend"


@pytest.fixture
def irq(fresh_irq: IrqCollector) -> IrqCollector:
    return fresh_irq


def attached(c: IrqCollector) -> bool:
    assert c._program is not None
    states = {c._program.attached(fn) for fn in IRQ_FNS}
    assert len(states) == 1, "the four programs come and go together"
    return states.pop()


class Books:
    """The budget over the real interrupt collector; windows with the programs' real ids."""

    def __init__(self, irq: IrqCollector) -> None:
        assert irq._program is not None
        self.ids = irq._program.program_ids()
        clock: list[Agent] = []
        self.requested = RequestedWork(ratio=1.0, clock=lambda: clock[0].now)
        self.other = Step("net.sampled", [OTHER], 0.5)
        self.agent = Agent(
            [*irq.reductions(), self.other], requested=self.requested, restore_after_s=60.0
        )
        clock.append(self.agent)
        self.agent.budget.add_requested_programs(irq.requested_programs)
        self.seq = 0

    def period(self, irq_ns_s: float, other_ns_s: float = 1 * MS) -> None:
        """2 s pass (the agent's threads idle), then a 0.5 s window in which each interrupt
        program cost ``irq_ns_s`` per second and the other function ``other_ns_s``."""
        a = self.agent
        a.now += 2.0
        self.seq += 1
        functions = (
            *(FunctionCost(fn, self.ids[fn], 500, int(irq_ns_s * 0.5), 0.5, 0.5) for fn in IRQ_FNS),
            FunctionCost(OTHER, 1, 500, int(other_ns_s * 0.5), 0.5, 0.5),
        )
        a.meter._last = MeterWindow(self.seq, 0.0, 0.5, functions)
        a.samples = a.budget.collect()


def test_a_trace_holding_the_detached_programs_pays_for_them_and_the_agent_does_not(
    irq: IrqCollector,
) -> None:
    books = Books(irq)
    (step,) = irq.reductions()
    books.agent.warm()
    # Always-on collection over the budget because of the interrupt programs: their step
    # is the biggest saving, and enough on its own.
    for _ in range(2):
        books.period(EACH_NS_S)
    assert step.active and not attached(irq)
    assert books.other.log == []
    assert books.requested.by_reader() == {}

    # A trace that records interrupt times: the programs come back for it.
    irq.hold_for_trace("trace 1", "uid 1000")
    assert step.active and attached(irq)
    assert irq.cpu_interrupt_times() is not None
    for n in range(1, 4):
        books.period(EACH_NS_S)
        costs = books.agent.budget.state().costs
        # None of the four in the agent's cost, all of them in the requester's.
        assert costs.bpf_ns_s == {OTHER: 1 * MS}
        assert costs.requested_ns_s == {"uid 1000": 4 * EACH_NS_S}
        # Each window's rate over its whole 2 s period, once.
        assert books.requested.by_reader() == {"uid 1000": n * 4 * EACH_NS_S * 2}
    assert books.requested.total_ns() == 0  # kernel time: none of the agent's threads
    assert books.agent.value("agent_budget_exceeded") == 0.0
    assert step.active and books.other.log == []  # nothing else taken for the trace's cost

    # A second trace by another user: the cost is shared equally.
    irq.hold_for_trace("trace 2", "uid 1001")
    books.period(EACH_NS_S)
    assert books.agent.budget.state().costs.requested_ns_s == {
        "uid 1000": 2 * EACH_NS_S,
        "uid 1001": 2 * EACH_NS_S,
    }
    irq.release_for_trace("trace 2")
    assert attached(irq)  # trace 1 still records
    # Both traces end within the next window: what was measured before they ended is still
    # their requesters'; the programs are detached again, and then nobody pays.
    irq.release_for_trace("trace 1")
    assert step.active and not attached(irq)
    assert irq.cpu_interrupt_times() is None
    books.period(EACH_NS_S)
    assert books.agent.budget.state().costs.requested_ns_s == {
        "uid 1000": 2 * EACH_NS_S,
        "uid 1001": 2 * EACH_NS_S,
    }
    before = books.requested.by_reader()
    books.period(0.0)
    assert books.requested.by_reader() == before
    assert books.agent.budget.state().costs.bpf_ns_s == {OTHER: 1 * MS}


def test_without_the_step_a_trace_costs_its_requester_nothing_extra(irq: IrqCollector) -> None:
    """The programs run for the collector's own metrics anyway: a trace reading them is not
    charged for them, and their cost stays the agent's (weighed by the budget)."""
    books = Books(irq)
    books.agent.warm()
    irq.hold_for_trace("trace 1", "uid 1000")
    books.period(1 * MS)
    costs = books.agent.budget.state().costs
    assert costs.bpf_ns_s == {fn: 1 * MS for fn in IRQ_FNS} | {OTHER: 1 * MS}
    assert costs.requested_ns_s == {}
    assert books.requested.by_reader() == {}
    irq.release_for_trace("trace 1")
    assert attached(irq)  # the step is not in force: released, they stay for the collector


def test_the_step_taken_while_a_trace_holds_them_leaves_them_attached_until_it_ends(
    irq: IrqCollector,
) -> None:
    (step,) = irq.reductions()
    irq.hold_for_trace("trace 1", "uid 1000")
    step.apply()
    assert step.active and attached(irq)
    irq.release_for_trace("trace 1")
    assert not attached(irq)
    # A trace that begins and the step undone while it runs: attached for the collector
    # after it ends, and no longer anyone's cost.
    irq.hold_for_trace("trace 2", "uid 1000")
    step.undo()
    irq.release_for_trace("trace 2")
    assert attached(irq)
    assert irq.requested_programs().prog_ids == frozenset()


def test_release_of_an_unknown_trace_changes_nothing(irq: IrqCollector) -> None:
    (step,) = irq.reductions()
    irq.hold_for_trace("trace 1", "uid 1000")
    step.apply()
    irq.release_for_trace("never held")
    assert attached(irq)
    irq.release_for_trace("trace 1")
    assert not attached(irq)
    step.undo()
    assert attached(irq)


def test_requested_programs_name_the_programs_and_requesters_while_the_step_holds(
    irq: IrqCollector,
) -> None:
    assert irq._program is not None
    ids = frozenset(irq._program.program_ids()[fn] for fn in IRQ_FNS)
    (step,) = irq.reductions()
    irq.hold_for_trace("trace 1", "uid 1000")
    assert irq.requested_programs().prog_ids == frozenset()  # the agent's own: no step
    step.apply()
    asked = irq.requested_programs()
    assert (asked.prog_ids, asked.readers) == (ids, ("uid 1000",))
    # Trace 1 ends and trace 2 begins before the budget asks again: both held the programs
    # in the window, and trace 2's requester is nobody named (a local caller): not charged.
    irq.release_for_trace("trace 1")
    irq.hold_for_trace("trace 2", "")
    asked = irq.requested_programs()
    assert (asked.prog_ids, asked.readers) == (ids, ("uid 1000",))
    irq.release_for_trace("trace 2")
    asked = irq.requested_programs()
    assert (asked.prog_ids, asked.readers) == (ids, ())
    step.undo()
    assert irq.requested_programs().prog_ids == frozenset()
