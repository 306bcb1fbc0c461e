"""The verdict on the evidence of real runs of the matrix's interrupt storm
(tests/bench/bench_verdict_matrix.py, class ``irq``): the 4-rank gloo job with two ranks on
each CPU, a storm of UDP datagrams steered to CPU 1 (ranks 2 and 3) at 25 % of that CPU,
and the same job without the storm (``irq-control``). Each file is the four ranks'
`RankEvidence` as the agent's summary read them from the run's trace files (their paths
renamed), so the rules are tested on what a real storm leaves, not on numbers of our own."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from pathlib import Path

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence, StepSplit
from bpfdyno.rpc.wire import record_from_dict

FIXTURES = Path(__file__).parent / "fixtures"


def evidence(name: str) -> list[RankEvidence]:
    with gzip.open(FIXTURES / f"{name}.evidence.json.gz", "rt") as f:
        return [record_from_dict(RankEvidence, d) for d in json.load(f)]


def test_the_storm_names_both_ranks_on_its_cpu_for_the_interrupts() -> None:
    """The storm took 29 ms of each ~56 ms step on CPU 1 (51 %; CPU 0's ranks 1.3 ms):
    ranks 2 and 3 kept the job waiting 7.6 and 7.7 % of the time, under the 10 % bar, and
    are both named for the interrupts, the detail saying how much of a step they took."""
    v = compare(evidence("irq_storm_shared_cpu"))
    found = sorted((f.rank, f.causes[0].cause, round(f.share, 3)) for f in v.stragglers)
    assert found == [(2, "interrupts", 0.076), (3, "interrupts", 0.077)]
    seconds = {f.rank: round(f.seconds, 4) for f in v.stragglers}
    assert seconds == {2: 0.2557, 3: 0.261}
    took = {2: "28.8 ms a step (51%)", 3: "29.2 ms a step (51%)"}
    for f in v.stragglers:
        detail = f.causes[0].detail
        assert detail.startswith(f"its CPUs spent {took[f.rank]} in interrupts; "), detail
        assert detail.endswith(f"for the CPU held by its own threads and rank {5 - f.rank}")
    assert v.headline.startswith(
        "rank 3 on vm held the job back: the other ranks waited 261.0 ms for it (8% of the "
        "3.38 s compared); why: CPU time taken by interrupts and softirqs 261.0 ms (its CPUs "
        "spent 29.2 ms a step (51%) in interrupts"
    ), v.headline


def test_without_the_interrupt_time_the_same_waits_name_no_one() -> None:
    """The same files without the fabric track's interrupt time per step (a trace without
    that track): the storm is not known, the waits for each other are what ranks sharing a
    CPU have, and under the 10 % bar no straggler is named."""
    stripped = [
        replace(
            e,
            steps=StepSplit(
                e.steps.steps,
                e.steps.step_seconds,
                tuple(p for p in e.steps.parts if p.cause != "interrupts"),
            ),
        )
        for e in evidence("irq_storm_shared_cpu")
    ]
    v = compare(stripped)
    assert v.stragglers == ()
    assert v.headline.startswith(
        "no straggler: the ranks are within noise (the latest rank kept the others waiting "
        "261.0 ms, 7.7% of the 3.38 s compared)"
    ), v.headline


def test_the_control_run_names_no_one() -> None:
    """The job with the same extra work and no storm: its CPUs spent 0.6 ms of a 48 ms
    step in interrupts (1.3 %), and no straggler is named."""
    v = compare(evidence("irq_control_shared_cpu"))
    assert v.stragglers == ()
    assert v.headline.startswith(
        "no straggler: the ranks are within noise (the latest rank kept the others waiting "
        "43.8 ms, 1.5% of the 2.86 s compared)"
    ), v.headline
