"""Traces that hold the interrupt collector's programs while its budget step is in force:
the programs stay attached for them and count real softirqs from loopback traffic, the
collector's own series stay not known (NaN) for every interval the step touched, and a trace
that still cannot have interrupt times is told exactly why."""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import pytest
from test_irq_bpf import bpf_values, loopback_traffic

from bpfdyno.sources.irq import collector as irq_mod
from bpfdyno.sources.irq.collector import SOFTIRQS, IrqCollector
from bpfdyno.tracing.capture.fabric import FabricSampler

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root"),
]

NET_RX = SOFTIRQS.index("NET_RX")


@pytest.fixture
def irq(fresh_irq: IrqCollector) -> IrqCollector:
    return fresh_irq


def net_rx_runs(c: IrqCollector) -> int:
    times = c.cpu_interrupt_times()
    assert times is not None
    return sum(t.softirq_runs[NET_RX] for t in times.values())


def test_a_held_program_counts_softirqs_while_the_series_stay_not_known(
    irq: IrqCollector,
) -> None:
    (step,) = irq.reductions()
    irq.collect()
    step.apply()
    irq.hold_for_trace("trace", "uid 1000")
    before = net_rx_runs(irq)
    loopback_traffic(0.3)
    assert net_rx_runs(irq) > before  # counting again, for the trace
    assert all(math.isnan(v) for v in bpf_values(list(irq.collect())).values())
    loopback_traffic(0.3)
    # Attached this whole interval, but only for the trace: still not known.
    held = bpf_values(list(irq.collect()))
    assert held and all(math.isnan(v) for v in held.values())
    health = irq.health()
    assert health is not None and health[1].endswith(
        "; attached meanwhile for 1 trace(s) recording interrupt times (their requesters' cost)"
    ), health

    # The step undone while the trace holds them: known again from the first interval that
    # began after the undo.
    step.undo()
    loopback_traffic(0.3)
    assert all(math.isnan(v) for v in bpf_values(list(irq.collect())).values())
    loopback_traffic(0.3)
    time.sleep(0.05)
    again = bpf_values(list(irq.collect()))
    assert again and all(math.isfinite(v) for v in again.values())
    irq.release_for_trace("trace")
    assert all(irq._program is not None and irq._program.attached(fn) for _, fn in irq_mod.PROGRAMS)


def test_a_trace_is_told_why_when_the_programs_could_not_be_held(irq: IrqCollector) -> None:
    """The step in force and the programs off however the trace asked (attaching them again
    failed: here they are held off behind the collector's back, as a failed attach leaves
    them): the trace's note says since when and why, never "not loaded"."""
    (step,) = irq.reductions()
    step.apply()
    sampler = FabricSampler(irq, 20.0, 100, proc_root=Path("/proc"))
    assert irq._program is not None
    sampler.add("trace", os.getpid(), "uid 1000")
    irq._program.suspend(step.fns, True)  # type: ignore[attr-defined]
    sampler.read_now()
    _, stats = sampler.remove("trace")
    assert re.search(
        r"interrupt time missing from some readings: the irq collector's programs are "
        r"detached by the overhead budget since \d\d:\d\d:\d\d \(irq.softirq_detached\) and "
        r"could not be attached again for the trace \(see the agent's log and `bpfdyno "
        r"status`\)",
        stats.note,
    ), stats.note
    step.undo()


def test_a_trace_without_the_bpf_part_is_told_it_is_not_loaded_and_why() -> None:
    c = IrqCollector(load_bpf=False)
    c.start()
    try:
        sampler = FabricSampler(c, 20.0, 100)
        sampler.add("trace", os.getpid(), "uid 1000")
        _, stats = sampler.remove("trace")
        assert stats.note.endswith(
            "no interrupt time: the irq collector's BPF program is not loaded (the BPF part "
            "is turned off)"
        ), stats.note
    finally:
        c.close()
