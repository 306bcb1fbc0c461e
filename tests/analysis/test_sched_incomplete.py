"""A sched track that misses off-CPU intervals says so in the verdict.

When the agent's own cost goes over its budget the overhead budget may sample the capture's
scheduler programs in time (attached a quarter of every second): the track then holds the
off-CPU intervals that fit in those quarters only — on the matrix's job every rank's steps
looked "93 % on a CPU", and a rank late for its disk was named "not seen by the kernel
(slower compute or Python work)". The capture writes why in the info slice; the evidence
carries it and the verdict's unexplained time says the track was incomplete, instead of
suggesting slower work.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_wake_after_disk import PREEMPTED_US, READ_US, STEPS, WOKEN_US, evidence, trace

from bpfdyno.analysis.verdict import compare

LATE_US = READ_US + WOKEN_US + PREEMPTED_US
SAMPLED = (
    "sampled by the agent's overhead budget (the capture itself cost more than the whole "
    "budget): recorded 24% of the 12.0 s captured; off-CPU intervals that began or ended "
    "while the programs were off are not in the track"
)


def blind_rank(tmp_path: Path, info: dict[str, object]) -> str:
    """Rank 3, late as in `trace`, but its sched track without any of its off-CPU
    intervals, and ``info`` added to its info slice."""
    path = Path(trace(tmp_path, 3, LATE_US, world=4))
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "bpfdyno.sched"]
    for e in doc["traceEvents"]:
        if e.get("cat") == "bpfdyno.info":
            e["args"].update(info)
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("info", "said"),
    [
        ({"sched_note": SAMPLED}, SAMPLED.split("; ")[0]),
        (
            {"sched_lost_ring_buffer_full": 812, "records_over_cap_dropped": 40},
            "812 off-CPU intervals lost to a full ring buffer; 40 records dropped over the "
            "capture's cap",
        ),
        (
            {
                "sched_note": "2 thread(s) of traced processes could not be followed (more than "
                "[capture] max_threads at once): their off-CPU time is missing"
            },
            "2 thread(s) of traced processes could not be followed (more than [capture] "
            "max_threads at once): their off-CPU time is missing",
        ),
        ({"sched_note": "not loaded"}, ""),
        ({}, ""),
    ],
)
def test_unexplained_time_says_the_sched_track_was_incomplete(
    tmp_path: Path, info: dict[str, object], said: str
) -> None:
    ranks = [evidence(trace(tmp_path, r, world=4)) for r in range(3)]
    ranks.append(evidence(blind_rank(tmp_path, info)))
    assert ranks[3].sched_incomplete == said
    assert [r.sched_incomplete for r in ranks[:3]] == ["", "", ""]
    [f] = compare(ranks).stragglers
    assert f.rank == 3
    assert [(c.cause, c.seconds, c.detail) for c in f.causes] == [
        (
            "unexplained",
            pytest.approx(STEPS * LATE_US / 1e6),
            f"the sched track was incomplete: {said}" if said else "",
        )
    ]


@pytest.mark.parametrize("note", [SAMPLED, ""])
def test_time_without_off_cpu_slices_is_not_time_on_a_cpu_when_the_track_is_sampled(
    tmp_path: Path, note: str
) -> None:
    """Rank 3's sched track keeps only the first run-up's intervals (the others fell in the
    budget's off phases): with the budget's note, no run-up and no step is said to be on a
    CPU (that rank "ran 1.5 s longer" than the others on the real job); a complete track
    with the same slices measures it."""
    path = Path(trace(tmp_path, 3, LATE_US, world=4))
    doc = json.loads(path.read_text())
    doc["traceEvents"] = [
        e for e in doc["traceEvents"] if e.get("cat") != "bpfdyno.sched" or e["ts"] < 180_000
    ]
    for e in doc["traceEvents"]:
        if e.get("cat") == "bpfdyno.info" and note:
            e["args"]["sched_note"] = note
    path.write_text(json.dumps(doc))
    ev = evidence(str(path))
    on_cpu = [t.seconds for c in ev.collectives for t in c.before if t.cause == "on_cpu"]
    in_steps = [p.cause for p in ev.steps.parts]
    if note:
        assert on_cpu == []
        assert "on_cpu" not in in_steps
    else:
        # Run-ups from the window's start (185 ms, 75 ms of it off-CPU), then 200 ms each.
        assert on_cpu == [pytest.approx(0.11), *[pytest.approx(0.2)] * 4]
