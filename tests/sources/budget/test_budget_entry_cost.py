"""The kernel's entry into a BPF program at its tracepoint is part of what the program costs.

The run statistics time a program's body only. Every run also costs whoever hit the
tracepoint the call into BPF: on a 2-CPU VM ~50-120 ns, several times the ~20 ns body of the
context-switch program, and on a context-switch storm most of what the agent costs the
workload (docs/performance.md, "The pipe storm's own CPU per round trip"). The budget counts
it (runs x the entry cost measured at start), so a storm of cheap runs is stepped on
(test_budget_controller.py, the entry tests); a step that only tells a function to stay off
(a flag it reads) still pays the entry at every event and is not credited with saving it,
while one that detaches the function is.
"""

from __future__ import annotations

import pytest

from bpfdyno.core.budget import Costs
from bpfdyno.ebpf import runstats
from bpfdyno.ebpf.reductions import FLAG_OFF_COST, SampledFunctions
from bpfdyno.ebpf.runstats import calibrate_entry_cost

MS = 1_000_000  # ns in a millisecond


def _costs() -> Costs:
    # 400,000 runs a second: 4 ms/s of body, 40 ms/s of entry.
    return Costs(
        bpf_ns_s={"bpfdyno_switch": 44 * MS},
        bpf_full_ns_s={"bpfdyno_switch": 44 * MS},
        bpf_runs_s={"bpfdyno_switch": 400_000},
        bpf_entry_ns_s={"bpfdyno_switch": 40 * MS},
        window_s=0.5,
    )


def test_a_detached_functions_sampling_saves_its_entry_too() -> None:
    step = SampledFunctions(
        object(), ["bpfdyno_switch"], 1 / 8, name="s", part="sched", what="w", lost="l"
    )
    assert step.saving_ns_s(_costs()) == pytest.approx(44 * MS * 7 / 8)


def test_a_flagged_functions_sampling_saves_its_body_only() -> None:
    step = SampledFunctions(
        object(),
        ["bpfdyno_switch"],
        1 / 8,
        flag=("bpfdyno_flags", 0),
        name="s",
        part="sched",
        what="w",
        lost="l",
    )
    assert step.saving_ns_s(_costs()) == pytest.approx(4 * MS * 7 / 8 * (1 - FLAG_OFF_COST))


def test_the_entry_cost_is_measured_at_start_and_carried_by_every_window() -> None:
    # On this kernel: an empty raw tracepoint program really attached and entered thousands
    # of times; tens of ns on a VM, never microseconds.
    measured = calibrate_entry_cost()
    assert 0 <= measured < 2000
    owner = object()
    runstats.METER.request(owner, 0.1, 0.3)
    try:
        window = runstats.METER.wait_window(0, timeout=10)
    finally:
        runstats.METER.release(owner)
    assert window is not None
    assert runstats.METER.entry_ns is not None and 0 <= runstats.METER.entry_ns < 2000
    assert window.entry_ns == runstats.METER.entry_ns
