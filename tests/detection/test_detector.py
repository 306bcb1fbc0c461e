"""The straggler detector: intervals of known signals in, exact events out."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bpfdyno.detection.detector import StragglerDetector
from bpfdyno.detection.outliers import State
from bpfdyno.detection.signals import RankSignals
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind


def sig(rank: int, runq: float, job: str = "7", late: float = float("nan")) -> RankSignals:
    return RankSignals(
        job_id=job,
        rank=rank,
        pid=1000 + rank,
        end_mono=0.0,
        interval_s=5.0,
        oncpu_s=1.0,
        runq_wait_s=runq,
        main_waiting_s=4.0,
        throttled_s=0.0,
        io_bytes=1 << 20,
        late_s=late,
    )


def interval(slow: dict[int, float], job: str = "7", n: int = 4) -> list[RankSignals]:
    """One interval of ``n`` ranks with run-queue waits of 0.05 s except those in ``slow``."""
    return [sig(r, slow.get(r, 0.05 + 0.01 * r), job) for r in range(n)]


def test_a_held_back_rank_is_suspected_then_confirmed_then_cleared() -> None:
    d = StragglerDetector("node-a")
    kinds = []
    for t, slow in enumerate([{}, {2: 2.0}, {2: 2.0}, {2: 2.0}, {}, {}, {}, {}, {}]):
        for e in d.update(interval(slow), now_unix=100.0 + t):
            kinds.append((t, e.kind, e.rank))
    assert kinds == [
        (2, DetectionKind.SUSPECTED, 2),
        (3, DetectionKind.CONFIRMED, 2),
        (8, DetectionKind.CLEARED, 2),
    ]


def test_the_event_carries_the_evidence_and_says_it() -> None:
    d = StragglerDetector("node-a")
    d.update(interval({1: 1.5}), now_unix=10.0)
    (event,) = d.update(interval({1: 1.5}), now_unix=15.0)
    # Scores: 0.01, 0.3, 0.014, 0.016 per second; the median of the four is 0.015.
    (ev,) = event.evidence
    assert (ev.name, ev.value, ev.job_median) == ("cpu_wait_share", 0.3, pytest.approx(0.015))
    assert replace(event, evidence=()) == DetectionEvent(
        kind=DetectionKind.SUSPECTED,
        job_id="7",
        rank=1,
        pid=1001,
        host="node-a",
        unix_seconds=15.0,
        summary="job 7 rank 1 suspected straggler: waited for a CPU: 0.30 against the job's "
        "median 0.02 (cpu_wait_share)",
    )


def test_all_ranks_slowing_alike_and_single_noisy_intervals_emit_nothing() -> None:
    d = StragglerDetector("node-a")
    events = []
    for t in range(12):
        alike = {r: 2.0 + 0.01 * r for r in range(4)} if t >= 3 else {}
        noisy = {t % 4: 3.0} if t % 5 == 0 else {}  # one rank, one interval, now and then
        events += d.update(interval({**alike, **noisy}), now_unix=float(t))
    assert events == []


def test_jobs_are_compared_apart() -> None:
    d = StragglerDetector("node-a")
    # Job 8's ranks all wait 2 s: against job 7's they would stand out, against theirs not.
    for t in range(4):
        events = d.update(
            interval({}, job="7") + interval({r: 2.0 for r in range(3)}, job="8", n=3),
            now_unix=float(t),
        )
        assert events == []


def test_a_rank_that_leaves_is_forgotten() -> None:
    d = StragglerDetector("node-a")
    d.update(interval({3: 2.0}), now_unix=0.0)
    assert d.state_of("7", 3).history == (True,)
    d.update(interval({}, n=3), now_unix=1.0)
    assert d.state_of("7", 3).state is State.OK
    assert d.state_of("7", 3).history == ()


def test_late_arrival_from_collectives_counts_when_known() -> None:
    d = StragglerDetector("node-a")
    events = []
    for t in range(2):
        events += d.update(
            [sig(r, 0.05, late=3.0 if r == 0 else 0.01 * r) for r in range(4)], float(t)
        )
    assert [(e.kind, e.rank, e.evidence[0].name) for e in events] == [
        (DetectionKind.SUSPECTED, 0, "late_share")
    ]


def test_a_rank_that_computes_while_its_peers_wait_is_a_straggler() -> None:
    # More work per step on rank 1: its main thread busy 2 s of 5, the others asleep in the
    # all-reduce all but 0.25 s; nobody waits for a CPU more than the others.
    d = StragglerDetector("node-a")
    events = []
    for t in range(3):
        signals = [
            replace(sig(r, 0.05), main_waiting_s=3.0 if r == 1 else 4.75 - 0.01 * r)
            for r in range(4)
        ]
        events += d.update(signals, float(t))
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 1),
        (DetectionKind.CONFIRMED, 1),
    ]
    (ev,) = events[1].evidence
    # Busy shares 0.05, 0.4, 0.054, 0.056: the median of the four is 0.055.
    assert (ev.name, ev.value, ev.job_median) == (
        "main_busy_share",
        pytest.approx(0.4),
        pytest.approx(0.055),
    )
    assert "its main thread was busy (on a CPU or waiting for one): 0.40" in events[1].summary


def test_main_threads_busy_alike_or_a_little_apart_are_no_stragglers() -> None:
    d = StragglerDetector("node-a")
    events = []
    for t in range(6):
        # A loaded machine: every rank's main thread busy a fifth of the time; then one rank
        # busy 0.14 against the others' 0.05 (below the 0.1 floor over the median).
        alike = {r: 4.0 - 0.01 * r for r in range(4)}
        apart = {r: 4.3 if r == 2 else 4.75 for r in range(4)}
        waits = alike if t < 3 else apart
        events += d.update(
            [replace(sig(r, 0.05), main_waiting_s=waits[r]) for r in range(4)], float(t)
        )
    assert events == []


def waits(shares: dict[int, float]) -> list[RankSignals]:
    """One interval of 5 s of four ranks whose threads waited for their gloo peers
    ``shares`` thread-seconds per second; every other signal alike."""
    return [replace(sig(r, 0.05), peer_wait_s=shares[r] * 5.0) for r in sorted(shares)]


#: Three intervals of the real 4-rank job under a load average of 12 (thread-seconds per
#: second in gloo's waitRecv + waitSend), rank 3's batches 120 ms late: its peers wait for it.
LATE_RANK_3 = [
    {0: 0.657, 1: 0.656, 2: 0.691, 3: 0.074},
    {0: 0.689, 1: 0.691, 2: 0.721, 3: 0.076},
    {0: 0.669, 1: 0.662, 2: 0.698, 3: 0.072},
]
#: Healthy intervals of the same run: rank 2 (alone on its CPU) waits most, the ranks sharing
#: CPU 0 less, the least of them down to 0.68 of the median (the last one).
HEALTHY = [
    {0: 0.303, 1: 0.264, 2: 0.370, 3: 0.292},
    {0: 0.220, 1: 0.185, 2: 0.336, 3: 0.190},
    {0: 0.217, 1: 0.182, 2: 0.326, 3: 0.207},
    {0: 0.182, 1: 0.126, 2: 0.289, 3: 0.161},
    {0: 0.385, 1: 0.356, 2: 0.419, 3: 0.382},
    {0: 0.307, 1: 0.258, 2: 0.388, 3: 0.287},
    {0: 0.201, 1: 0.135, 2: 0.298, 3: 0.197},
]


def test_a_rank_its_peers_wait_for_in_gloo_is_a_straggler() -> None:
    d = StragglerDetector("node-a")
    events = [e for t, w in enumerate(LATE_RANK_3) for e in d.update(waits(w), float(t))]
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 3),
        (DetectionKind.CONFIRMED, 3),
    ]
    (ev,) = events[1].evidence
    # The median of the four: between 0.662 and 0.669.
    assert (ev.name, ev.value, ev.job_median) == (
        "peer_wait_share",
        pytest.approx(0.072),
        pytest.approx(0.6655),
    )
    assert events[1].summary == (
        "job 7 rank 3 confirmed straggler: its peers waited for it in gloo's collectives; "
        "it waited for them: 0.07 against the job's median 0.67 (peer_wait_share)"
    )


def test_healthy_peer_waits_of_the_real_job_flag_nobody() -> None:
    d = StragglerDetector("node-a")
    events = [e for t, w in enumerate(HEALTHY * 2) for e in d.update(waits(w), float(t))]
    assert events == []


def test_a_rank_a_little_short_of_peers_alike_is_kept_out_by_the_floors() -> None:
    # The least-waiting healthy rank seen was at 0.68 of the median. Beside peers so alike
    # that the MAD is near zero, only the floors keep such a rank from being a straggler:
    # where the job waits much, the relative one (under half the median: 0.40 against 0.6
    # is 0.2 short, above the absolute floor); where it waits little, the absolute one (0.1
    # short: 0.07 against 0.15 is under half of it). Lower either (to 0.3 of the median, to
    # 0.05) and these fail.
    for jitter in ({0: 0.60, 1: 0.40, 2: 0.60, 3: 0.59}, {0: 0.15, 1: 0.07, 2: 0.15, 3: 0.148}):
        d = StragglerDetector("node-a")
        assert [e for t in range(4) for e in d.update(waits(jitter), float(t))] == []
    # Under both floors: a straggler.
    d = StragglerDetector("node-a")
    late = {0: 0.30, 1: 0.13, 2: 0.30, 3: 0.295}
    events = [e for t in range(3) for e in d.update(waits(late), float(t))]
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 1),
        (DetectionKind.CONFIRMED, 1),
    ]


def test_ranks_without_gloo_s_probes_are_left_out_of_the_peer_wait() -> None:
    d = StragglerDetector("node-a")
    # Rank 3 has no value (NaN): ranks 0-2 are compared, and rank 0 waited least of them.
    # Two ranks with a value give no median: nothing, whatever they are.
    three = {0: 0.05, 1: 0.66, 2: 0.69, 3: float("nan")}
    two = {0: 0.05, 1: 0.66, 2: float("nan"), 3: float("nan")}
    events = [e for t in range(2) for e in d.update(waits(three), float(t))]
    assert [(e.kind, e.rank) for e in events] == [(DetectionKind.SUSPECTED, 0)]
    d = StragglerDetector("node-a")
    assert [e for t in range(4) for e in d.update(waits(two), float(t))] == []


def cpu_and_peer(scores: dict[int, tuple[float, float]]) -> list[RankSignals]:
    """One 5 s interval of four ranks: per rank (CPU wait, gloo peer wait), each in
    thread-seconds per second; every other signal alike."""
    return [
        replace(sig(r, cpu * 5.0), peer_wait_s=peer * 5.0)
        for r, (cpu, peer) in sorted(scores.items())
    ]


#: Intervals of the real 4-rank job (load average 10) with a CPU hog at nice -10 on rank 2's
#: CPU, which slowed the job to 0.74 of its healthy steps per second: rank 2's CPU wait 2.0-2.2
#: times the median (each score alone asks 2.5) and its peer wait 0.52-0.56 of it (alone:
#: under 0.5).
HOG_NICE_10 = [
    {0: (0.237, 0.345), 1: (0.271, 0.311), 2: (0.622, 0.181), 3: (0.288, 0.312)},
    {0: (0.24, 0.376), 1: (0.27, 0.337), 2: (0.623, 0.188), 3: (0.289, 0.333)},
    {0: (0.226, 0.418), 1: (0.275, 0.392), 2: (0.689, 0.193), 3: (0.315, 0.378)},
]


def test_a_rank_held_back_a_little_in_its_cpu_wait_and_its_peers_wait_at_once_is_found() -> None:
    d = StragglerDetector("node-a")
    events = [e for t, w in enumerate(HOG_NICE_10) for e in d.update(cpu_and_peer(w), float(t))]
    assert [(e.kind, e.rank) for e in events] == [
        (DetectionKind.SUSPECTED, 2),
        (DetectionKind.CONFIRMED, 2),
    ]
    cause, effect = events[1].evidence
    assert (cause.name, cause.value, cause.job_median) == (
        "cpu_wait_share",
        pytest.approx(0.689),
        pytest.approx(0.295),
    )
    assert (effect.name, effect.value, effect.job_median) == (
        "peer_wait_share",
        pytest.approx(0.193),
        pytest.approx(0.385),
    )


def test_either_half_of_the_pair_alone_is_no_outlier() -> None:
    # The hog's intervals with the peer wait alike (the cause alone), and with the CPU wait
    # alike (the effect alone); and a healthy interval of the same runs: rank 1, on the
    # shared CPU, at 1.58 times the median's CPU wait and 0.35 of its peer wait.
    cause_alone = [{r: (cpu, 0.33) for r, (cpu, _) in w.items()} for w in HOG_NICE_10]
    effect_alone = [{r: (0.27, peer) for r, (_, peer) in w.items()} for w in HOG_NICE_10]
    healthy = {0: (0.315, 0.209), 1: (0.497, 0.073), 2: (0.097, 0.278), 3: (0.316, 0.211)}
    for intervals in (cause_alone, effect_alone, [healthy] * 4):
        d = StragglerDetector("node-a")
        assert [e for t, w in enumerate(intervals) for e in d.update(cpu_and_peer(w), t)] == []
