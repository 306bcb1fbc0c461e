"""The job-wide outlier test and its hysteresis: pure functions over numbers.

A rank is an outlier in an interval when its score stands above the job's median by more
than ``k`` robust standard deviations (1.4826 times the median absolute deviation) *and* by more
than an absolute floor *and* than a multiple of the median. The median makes the test blind to
all ranks slowing alike; the floors keep a rank that is merely last by jitter (a MAD near zero
makes any difference "many deviations") from counting, the relative one where every rank's
level is high (a loaded machine: healthy ranks of a real job were seen 0.1 apart at a median
of 1.1). Fewer than three ranks give no median to stand out from. A score where the
straggler is the rank with the *least* (the time a rank waited for its peers) is tested from
below: ``below``.

One outlier interval is noise: `step` moves a rank between ``ok``, ``suspected`` and
``confirmed`` by how many of its last ``window`` intervals were outliers, and back to ``ok``
(a *cleared* event) only when at most ``clear_at`` of them still are.
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

#: MAD times this estimates the standard deviation of normally distributed values.
MAD_TO_SIGMA = 1.4826


def robust_spread(values: list[float]) -> tuple[float, float]:
    """(median, MAD times 1.4826) of ``values`` (at least one)."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med, mad * MAD_TO_SIGMA


def outliers(
    scores: Mapping[int, float],
    k: float,
    floor: float,
    relative: float = 0.0,
    below: bool = False,
) -> set[int]:
    """The keys (ranks) whose score exceeds the median by more than ``k`` robust deviations,
    by more than ``floor`` and by more than ``relative`` times the median; none when fewer
    than three ranks have a score.

    With ``below``, the ranks whose score falls *short* of the median by those margins (a
    score where the straggler is the rank with the least: ``relative`` 0.5 then asks for less
    than half the median)."""
    if len(scores) < 3:
        return set()
    med, sigma = robust_spread(list(scores.values()))
    bound = max(k * sigma, floor, relative * med)
    if below:
        return {rank for rank, v in scores.items() if med - v > bound}
    return {rank for rank, v in scores.items() if v - med > bound}


class State(enum.Enum):
    OK = "ok"
    SUSPECTED = "suspected"
    CONFIRMED = "confirmed"


class Transition(enum.Enum):
    SUSPECTED = "suspected"
    CONFIRMED = "confirmed"
    CLEARED = "cleared"


@dataclass(frozen=True, slots=True)
class Hysteresis:
    """How many of the last ``window`` intervals make a rank suspected, confirmed, cleared."""

    window: int = 6
    suspect_at: int = 2
    confirm_at: int = 3
    clear_at: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.clear_at < self.suspect_at <= self.confirm_at <= self.window:
            raise ValueError(
                "hysteresis needs 0 <= clear_at < suspect_at <= confirm_at <= window, got "
                f"clear_at={self.clear_at} suspect_at={self.suspect_at} "
                f"confirm_at={self.confirm_at} window={self.window}"
            )


@dataclass(frozen=True, slots=True)
class RankState:
    """One rank's state and its last intervals' outcomes (True: outlier), oldest first."""

    state: State = State.OK
    history: tuple[bool, ...] = ()


def step(
    current: RankState, outlier: bool, rules: Hysteresis
) -> tuple[RankState, Transition | None]:
    """The rank's state after one more interval, and the transition it made (if any).

    A rank goes from ok straight to confirmed (two transitions' worth) only when the
    window's count jumps past both thresholds at once, which one interval cannot do unless
    ``suspect_at == confirm_at``: then it is reported as confirmed.
    """
    history = (*current.history, outlier)[-rules.window :]
    count = sum(history)
    state = current.state
    if state is State.OK:
        if count >= rules.confirm_at:
            return RankState(State.CONFIRMED, history), Transition.CONFIRMED
        if count >= rules.suspect_at:
            return RankState(State.SUSPECTED, history), Transition.SUSPECTED
    elif count <= rules.clear_at:
        return RankState(State.OK, history), Transition.CLEARED
    elif state is State.SUSPECTED and count >= rules.confirm_at:
        return RankState(State.CONFIRMED, history), Transition.CONFIRMED
    return RankState(state, history), None
