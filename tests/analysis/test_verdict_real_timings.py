"""Pairing on the real timings of a GPU node: the 142 all-reduces of the H200 trace
(fixtures/h200, ~10 ms apart, irregular) as one rank, and as another rank on a host whose
clock is 3.7 s ahead, whose trace began 30 collectives later."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence

FILE = Path(__file__).parent.parent / "tracing/fixtures/h200/cuda_duration_merged.pt.trace.json.gz"
AHEAD = 3_700_000_000
SKIPPED = 30


@pytest.fixture(scope="module")
def real() -> RankEvidence:
    ev = summarize_file(str(FILE)).evidence
    assert ev is not None and len(ev.collectives) == 142
    return dataclasses.replace(ev, rank=0, host="a")


def with_rank_1_late(ev: RankEvidence, late_ns: int) -> RankEvidence:
    """Rank 0 when rank 1 reaches each collective it takes part in ``late_ns`` late: those
    complete that much later on rank 0 too."""
    return dataclasses.replace(
        ev,
        collectives=tuple(
            dataclasses.replace(c, end_unix_ns=c.end_unix_ns + (late_ns if i >= SKIPPED else 0))
            for i, c in enumerate(ev.collectives)
        ),
    )


def later_on_host_b(ev: RankEvidence, late_ns: int = 0) -> RankEvidence:
    """The same job seen by rank 1: its clock 3.7 s ahead, its window from collective 30,
    each arrival ``late_ns`` later (and each completion, with rank 0's)."""
    kept = ev.collectives[SKIPPED:]
    return dataclasses.replace(
        ev,
        rank=1,
        host="b",
        pid=ev.pid + 1,
        window_start_unix_ns=kept[0].arrival_unix_ns - 1_000_000 + AHEAD,
        window_end_unix_ns=ev.window_end_unix_ns + late_ns + AHEAD,
        collectives=tuple(
            dataclasses.replace(
                c,
                index=i,
                arrival_unix_ns=c.arrival_unix_ns + late_ns + AHEAD,
                end_unix_ns=c.end_unix_ns + late_ns + AHEAD,
            )
            for i, c in enumerate(kept)
        ),
    )


def test_real_timings_pair_across_a_shifted_window_and_a_far_clock(real: RankEvidence) -> None:
    v = compare([real, later_on_host_b(real)], {"a": 0, "b": -AHEAD})
    assert v.matched == 142 - SKIPPED  # the collectives both ranks traced
    assert {t.rank: t.collectives for t in v.ranks} == {0: 112, 1: 112}
    assert v.within_noise and v.stragglers == ()
    assert all(t.held_seconds == 0 for t in v.ranks)


def test_real_timings_with_a_late_rank(real: RankEvidence) -> None:
    """Rank 1 reaches each all-reduce 2 ms late (of ~10 ms steps): named, for 112 x 2 ms."""
    late = 2_000_000
    v = compare([with_rank_1_late(real, late), later_on_host_b(real, late)], {"a": 0, "b": -AHEAD})
    [f] = v.stragglers
    assert (f.rank, f.kind) == (1, "late")
    assert f.seconds == pytest.approx((142 - SKIPPED) * 0.002, rel=1e-6)
    assert f.share <= 1


def test_real_timings_with_the_offset_s_sign_wrong(real: RankEvidence) -> None:
    late = 2_000_000
    v = compare([with_rank_1_late(real, late), later_on_host_b(real, late)], {"a": 0, "b": AHEAD})
    assert v.stragglers == () and v.headline.startswith("not compared:")
