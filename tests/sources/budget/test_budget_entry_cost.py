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

import statistics
import threading
import time

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


def test_the_entry_is_measured_again_while_something_happens_and_their_median_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One measurement swings with what else runs on the CPU: while a requester's calm check
    says something happens, the meter measures it again (at most every `ENTRY_REMEASURE_S`,
    0.3 s here) and uses the median of the last `ENTRY_KEPT`; at rest, never again."""
    monkeypatch.setattr(runstats, "ENTRY_REMEASURE_S", 0.3)
    meter = runstats.ProcessRunStats()  # its own, not the process's
    happening = threading.Event()
    owner = object()
    meter.request(owner, 0.05, 0.2, runstats.Rest(2.0, lambda: not happening.is_set()))
    try:
        assert meter.wait_window(0, timeout=10) is not None
        time.sleep(2.5)  # calm: one window at the rest period, no new measurement
        assert len(meter.entry_measured) == 1
        happening.set()
        deadline = time.monotonic() + 15
        while len(meter.entry_measured) < runstats.ENTRY_KEPT:
            assert time.monotonic() < deadline, meter.entry_measured
            time.sleep(0.1)
        monkeypatch.setattr(runstats, "ENTRY_REMEASURE_S", 1e9)  # no more from here
        window = None
        for _ in range(2):  # the second begun after any measurement under way
            seq = meter.last_window().seq  # type: ignore[union-attr]
            window = meter.wait_window(seq, timeout=5)
    finally:
        meter.release(owner)
    measured = meter.entry_measured
    assert len(measured) == runstats.ENTRY_KEPT  # the oldest dropped
    assert all(0 <= m < 2000 for m in measured), measured
    assert meter.entry_ns == statistics.median(measured)
    assert window is not None and window.entry_ns == meter.entry_ns


def _byte_steps() -> tuple[SampledFunctions, SampledFunctions]:
    """The net collector's two steps on its per-call byte programs: told off by a flag, then
    also detached in the same off phase."""
    fns = ["bpfdyno_nsend"]
    flagged = SampledFunctions(
        object(), fns, 1 / 8, flag=("bpfdyno_nctl", 0), name="f", part="net", what="w", lost="l"
    )
    detached = SampledFunctions(
        object(), fns, 1 / 8, after=flagged, name="d", part="net", what="w", lost="l"
    )
    return flagged, detached


def _flood(fn: str = "bpfdyno_nsend") -> Costs:
    # 400,000 calls a second at 110 ns each (100 ns of it the kernel's entry).
    return Costs(
        bpf_ns_s={fn: 44 * MS},
        bpf_full_ns_s={fn: 44 * MS},
        bpf_runs_s={fn: 400_000},
        bpf_entry_ns_s={fn: 40 * MS},
        window_s=0.5,
    )


def test_the_detaching_step_comes_only_after_the_flagged_one_and_saves_the_off_phase_entry() -> (
    None
):
    flagged, detached = _byte_steps()
    assert detached.saving_ns_s(_flood()) == 0.0  # the gentler step first
    assert flagged.saving_ns_s(_flood()) == pytest.approx(4 * MS * 7 / 8 * (1 - FLAG_OFF_COST))
    flagged.active = True
    # Told off, every call still enters: 400k calls, 7/8 of them in the off phase.
    in_force = Costs(
        bpf_ns_s={"bpfdyno_nsend": 40 * MS + 4 * MS / 8},
        bpf_full_ns_s={"bpfdyno_nsend": 40 * MS + 4 * MS / 8},
        bpf_runs_s={"bpfdyno_nsend": 400_000},
        bpf_entry_ns_s={"bpfdyno_nsend": 40 * MS},
        window_s=0.5,
    )
    assert detached.saving_ns_s(in_force) == pytest.approx(40 * MS * 7 / 8)


def test_the_flagged_step_is_undone_only_after_the_detaching_one() -> None:
    flagged, detached = _byte_steps()
    flagged.saving_ns_s(_flood())  # taken: its full cost per call is remembered
    flagged.active = detached.active = True
    # Detached 7/8 of the time, the window saw an eighth of the calls.
    seen = Costs(
        bpf_ns_s={"bpfdyno_nsend": 44 * MS / 8},
        bpf_full_ns_s={"bpfdyno_nsend": 44 * MS},
        bpf_runs_s={"bpfdyno_nsend": 50_000},
        bpf_entry_ns_s={"bpfdyno_nsend": 5 * MS},
        window_s=0.5,
    )
    assert flagged.restore_ns_s(seen) == float("inf")
    # Undone, the off phase goes back to the flag: 350k calls a second entered (100 ns) and
    # told off (15 % of the 10 ns body), not the full work.
    assert detached.restore_ns_s(seen) == pytest.approx(350_000 * (100 + FLAG_OFF_COST * 10))
    detached.active = False
    assert flagged.restore_ns_s(seen) is not None and flagged.restore_ns_s(seen) < float("inf")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"fns": ["bpfdyno_nrecv"]},
        {"share": 1 / 4},
        {"flag": ("bpfdyno_nctl", 1)},
    ],
    ids=["other-functions", "other-share", "flagged-too"],
)
def test_a_detaching_step_must_match_the_flagged_one_it_follows(kwargs: dict[str, object]) -> None:
    flagged, _ = _byte_steps()
    args: dict[str, object] = {"fns": ["bpfdyno_nsend"], "share": 1 / 8} | kwargs
    with pytest.raises(ValueError, match="must detach the same functions at its share"):
        SampledFunctions(
            object(),
            args.pop("fns"),  # type: ignore[arg-type]
            args.pop("share"),  # type: ignore[arg-type]
            after=flagged,
            name="d",
            part="net",
            what="w",
            lost="l",
            **args,  # type: ignore[arg-type]
        )
