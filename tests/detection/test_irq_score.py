"""The interrupt share as a score: it makes a straggler only with an effect the job feels (its
peers waited for it, it arrived late), and it is named in the evidence of a rank that stands
out otherwise."""

from __future__ import annotations

import pytest

from bpfdyno.detection.detector import StragglerDetector
from bpfdyno.detection.signals import RankSignals
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind

NAN = float("nan")


def sig(rank: int, interrupt: float, peer_wait: float = NAN, late: float = NAN) -> RankSignals:
    """One 5 s interval of a rank: the shares given (per second), every other signal alike."""
    return RankSignals(
        job_id="7",
        rank=rank,
        pid=1000 + rank,
        end_mono=0.0,
        interval_s=5.0,
        oncpu_s=1.0,
        runq_wait_s=0.25,
        main_waiting_s=4.0,
        throttled_s=0.0,
        io_bytes=1 << 20,
        peer_wait_s=peer_wait * 5.0,
        late_s=late * 5.0,
        interrupt_s=interrupt * 5.0,
        interrupt_cpu=1 if rank == 2 else 0,
    )


def run(
    intervals: list[dict[int, tuple[float, float]]], late: bool = False
) -> list[DetectionEvent]:
    """The events of these intervals: per rank (interrupt share, peer wait share), or with
    ``late`` (interrupt share, late share)."""
    d = StragglerDetector("node-a")
    out = []
    for t, w in enumerate(intervals):
        ranks = [
            sig(r, irq, late=other) if late else sig(r, irq, peer_wait=other)
            for r, (irq, other) in sorted(w.items())
        ]
        out += d.update(ranks, float(t))
    return out


#: A storm on rank 2's CPU that holds the rank back a little: its CPUs 0.52 in interrupts
#: against a median of 0.035, and its peers' wait... it waited 0.54 of the median rank's for
#: its peers (0.21 against 0.39; the real job under the matrix's storm: 0.49-0.67): under the
#: peer wait's own bar (under half the median), over the pair's (under 0.6 of it).
STORM = [
    {0: (0.03, 0.40), 1: (0.03, 0.38), 2: (0.52, 0.21), 3: (0.04, 0.41)},
] * 3


def test_a_storm_on_a_rank_s_cpus_that_its_peers_wait_for_is_a_straggler() -> None:
    events = run(STORM)
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 2),
        (DetectionKind.CONFIRMED, 2),
    ]
    cause, effect = events[1].evidence
    assert (cause.name, cause.value, cause.job_median) == (
        "interrupt_share",
        pytest.approx(0.52),
        pytest.approx(0.035),
    )
    assert (effect.name, effect.value, effect.job_median) == (
        "peer_wait_share",
        pytest.approx(0.21),
        pytest.approx(0.39),
    )
    assert events[1].summary == (
        "job 7 rank 2 confirmed straggler: the CPUs it ran on were taken by interrupts (share "
        "of their time): 0.52 against the job's median 0.04 (interrupt_share); its peers "
        "waited for it in gloo's collectives; it waited for them: 0.21 against the job's "
        "median 0.39 (peer_wait_share)"
    )


def test_a_storm_nobody_waits_for_is_no_straggler() -> None:
    # The same storm, the rank's peer wait like the others' (it absorbed the storm); and a
    # storm that slowed every rank alike (each waits as little as the others).
    absorbed = [{r: (irq, 0.40) for r, (irq, _) in w.items()} for w in STORM]
    alike = [{r: (irq, 0.21) for r, (irq, _) in w.items()} for w in STORM]
    assert run(absorbed) == []
    assert run(alike) == []
    # Its interrupts under the bar (0.1 over the median), the same wait: no pair either.
    mild = [{**w, 2: (0.13, 0.21)} for w in STORM]
    assert run(mild) == []


def test_the_peer_wait_of_the_storm_alone_is_no_straggler() -> None:
    # The effect without the cause (every CPU's interrupts alike): under the peer wait's bar.
    effect_alone = [{r: (0.03, wait) for r, (_, wait) in w.items()} for w in STORM]
    assert run(effect_alone) == []


def test_a_rank_found_otherwise_names_its_interrupt_share_too() -> None:
    # Its peers wait for it far more than any bar asks (0.05 against 0.39): found by the peer
    # wait alone, and its CPUs' interrupts are named beside it.
    events = run([{**w, 2: (0.52, 0.05)} for w in STORM])
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 2),
        (DetectionKind.CONFIRMED, 2),
    ]
    assert [(e.name, e.value) for e in events[1].evidence] == [
        ("peer_wait_share", pytest.approx(0.05)),
        ("interrupt_share", pytest.approx(0.52)),
    ]
    # Without a storm there, the peer wait alone.
    events = run([{**w, 2: (0.03, 0.05)} for w in STORM])
    assert [e.name for e in events[1].evidence] == ["peer_wait_share"]


def test_a_storm_on_an_nccl_rank_that_arrives_late_is_a_straggler() -> None:
    # Late by 0.04 of the interval against 0.0015: under the late share's own floor (0.05),
    # over the pair's (0.03).
    late = [{0: (0.03, 0.0), 1: (0.03, 0.002), 2: (0.52, 0.04), 3: (0.04, 0.001)}] * 3
    events = run(late, late=True)
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 2),
        (DetectionKind.CONFIRMED, 2),
    ]
    assert [(e.name, e.value, e.job_median) for e in events[1].evidence] == [
        ("interrupt_share", pytest.approx(0.52), pytest.approx(0.035)),
        ("late_share", pytest.approx(0.04), pytest.approx(0.0015)),
    ]
    # Late as much without the storm: nothing.
    assert run([{**w, 2: (0.03, 0.04)} for w in late], late=True) == []


def test_ranks_whose_interrupt_share_is_not_known_are_left_out() -> None:
    # Only two ranks with a share: no median to stand out from; the wait is the pair's.
    unknown = [{0: (NAN, 0.40), 1: (NAN, 0.38), 2: (0.52, 0.21), 3: (0.04, 0.41)}] * 3
    assert run(unknown) == []
