"""The outlier test and the hysteresis: exact outcomes for known inputs."""

from __future__ import annotations

import pytest

from bpfdyno.detection.outliers import (
    Hysteresis,
    RankState,
    State,
    Transition,
    outliers,
    robust_spread,
    step,
)


def test_robust_spread_is_the_median_and_the_scaled_mad() -> None:
    med, sigma = robust_spread([1.0, 2.0, 3.0, 4.0, 100.0])
    assert med == 3.0
    assert sigma == pytest.approx(1.4826)  # deviations 2, 1, 0, 1, 97: MAD 1


def test_a_rank_far_above_the_others_is_the_outlier() -> None:
    assert outliers({0: 0.01, 1: 0.02, 2: 0.40, 3: 0.015}, k=3.0, floor=0.05) == {2}


def test_all_ranks_slowing_alike_flags_none() -> None:
    assert outliers({0: 0.41, 1: 0.42, 2: 0.40, 3: 0.43}, k=3.0, floor=0.05) == set()


def test_a_rank_merely_last_by_jitter_is_below_the_floor() -> None:
    # The MAD is tiny, so 0.03 is many deviations out, but less than the floor above median.
    assert outliers({0: 0.010, 1: 0.011, 2: 0.040, 3: 0.010}, k=3.0, floor=0.05) == set()
    assert outliers({0: 0.010, 1: 0.011, 2: 0.070, 3: 0.010}, k=3.0, floor=0.05) == {2}


def test_where_every_rank_waits_much_the_excess_must_be_a_multiple_of_the_median() -> None:
    # Seen on a loaded machine: healthy ranks around 1.1, one 0.1 above (many MADs out).
    scores = {0: 1.10, 1: 1.12, 2: 1.24, 3: 1.14}
    assert outliers(scores, k=3.0, floor=0.05) == {2}
    assert outliers(scores, k=3.0, floor=0.05, relative=1.5) == set()
    # A hogged rank: 1.03 against a median of 0.125.
    assert outliers({0: 0.11, 1: 0.14, 2: 1.03, 3: 0.14}, 3.0, 0.05, relative=1.5) == {2}


def test_a_rank_low_is_not_an_outlier_and_two_ranks_give_no_median() -> None:
    assert outliers({0: 0.5, 1: 0.5, 2: 0.0, 3: 0.5}, k=3.0, floor=0.05) == set()
    assert outliers({0: 0.0, 1: 0.9}, k=3.0, floor=0.05) == set()


def test_below_finds_the_rank_far_under_the_others() -> None:
    # Peers' waits for a late rank: it waits least. Median 0.6 (between 0.58 and 0.62).
    scores = {0: 0.58, 1: 0.02, 2: 0.70, 3: 0.62}
    assert outliers(scores, k=3.0, floor=0.1, below=True) == {1}
    assert outliers(scores, k=3.0, floor=0.1) == set()  # above the median: nobody stands out


def test_below_keeps_the_floors_and_the_relative_one_is_a_share_of_the_median() -> None:
    # 0.45 against a median of 0.6: 0.15 under it, many MADs out (MAD 0.02).
    scores = {0: 0.58, 1: 0.45, 2: 0.62, 3: 0.62}
    assert outliers(scores, k=3.0, floor=0.1, below=True) == {1}
    assert outliers(scores, k=3.0, floor=0.2, below=True) == set()
    # ... and under a relative floor of half the median (0.3 short of it) it is not.
    assert outliers(scores, k=3.0, floor=0.1, relative=0.5, below=True) == set()
    assert outliers({0: 0.58, 1: 0.25, 2: 0.62, 3: 0.62}, 3.0, 0.1, 0.5, below=True) == {1}


def test_spread_among_ranks_raises_the_bar() -> None:
    # Scores spread 0.1..0.4: MAD 0.1 (sigma 0.148), so 0.6 is 3 sigma out only barely not.
    scores = {0: 0.1, 1: 0.2, 2: 0.3, 3: 0.4, 4: 0.6}
    med, sigma = robust_spread(list(scores.values()))
    assert (med, round(sigma, 4)) == (0.3, 0.1483)
    assert outliers(scores, k=3.0, floor=0.05) == set()
    assert outliers(scores, k=2.0, floor=0.05) == {4}


RULES = Hysteresis(window=6, suspect_at=2, confirm_at=3, clear_at=1)


def run(outcomes: str, rules: Hysteresis = RULES) -> list[str]:
    """Step through 'x' (outlier) and '.' intervals; each step's state, '+transition'."""
    st = RankState()
    seen = []
    for c in outcomes:
        st, t = step(st, c == "x", rules)
        seen.append(st.state.value + (f"+{t.value}" if t else ""))
    return seen


def test_one_noisy_interval_changes_nothing() -> None:
    assert run(".x....") == ["ok"] * 6


def test_two_then_three_outliers_suspect_then_confirm() -> None:
    assert run("xxx") == ["ok", "suspected+suspected", "confirmed+confirmed"]


def test_k_of_n_not_consecutive_confirms() -> None:
    assert run("x.x.x") == [
        "ok",
        "ok",
        "suspected+suspected",
        "suspected",
        "confirmed+confirmed",
    ]


def test_a_confirmed_rank_clears_when_at_most_one_of_the_window_is_an_outlier() -> None:
    # Window of 6 after 'xxx': counts 3,3,3,2,1 -> cleared when the count reaches 1.
    assert run("xxx.....")[3:] == [
        "confirmed",
        "confirmed",
        "confirmed",
        "confirmed",
        "ok+cleared",
    ]


def test_one_clean_interval_does_not_clear_a_confirmed_rank() -> None:
    assert run("xxx.xx.x") == [
        "ok",
        "suspected+suspected",
        "confirmed+confirmed",
        "confirmed",
        "confirmed",
        "confirmed",
        "confirmed",
        "confirmed",
    ]


def test_a_suspected_rank_that_calms_down_is_cleared() -> None:
    assert run("xx....") == [
        "ok",
        "suspected+suspected",
        "suspected",
        "suspected",
        "suspected",
        "suspected",
    ]
    assert run("xx.....")[-1] == "ok+cleared"  # the first 'x' left the window


def test_thresholds_equal_confirm_at_once() -> None:
    rules = Hysteresis(window=3, suspect_at=2, confirm_at=2, clear_at=0)
    assert run("xx", rules) == ["ok", "confirmed+confirmed"]


def test_the_history_keeps_only_the_window() -> None:
    st = RankState()
    for c in "xxxxxxxx":
        st, _ = step(st, c == "x", RULES)
    assert st == RankState(State.CONFIRMED, (True,) * 6)


@pytest.mark.parametrize(
    ("window", "suspect", "confirm", "clear"), [(6, 2, 3, 2), (2, 2, 3, 1), (6, 3, 2, 1)]
)
def test_inconsistent_thresholds_are_refused(
    window: int, suspect: int, confirm: int, clear: int
) -> None:
    with pytest.raises(ValueError, match="hysteresis needs"):
        Hysteresis(window=window, suspect_at=suspect, confirm_at=confirm, clear_at=clear)


def test_transition_names_are_the_event_kinds() -> None:
    assert [t.value for t in Transition] == ["suspected", "confirmed", "cleared"]
