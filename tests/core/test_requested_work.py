"""Work done because someone reads: counted per reader, once when nested, bounded per reader."""

from __future__ import annotations

import time

import pytest

from bpfdyno.core.budget import REQUESTED_RULE, RequestedWork
from bpfdyno.core.errors import Unavailable


def _burn(seconds: float) -> None:
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


def test_work_is_counted_per_reader_once_and_bounded_per_reader() -> None:
    now = [100.0]
    work = RequestedWork(ratio=0.002, clock=lambda: now[0])  # 20 ms of CPU per 10 s each
    with work.work(["uid 1000", "uid 1001"]), work.work(["uid 1000"]):  # nested: once
        _burn(0.06)
    with work.work([]):  # nobody asked: not requested work
        _burn(0.01)
    spent = work.by_reader()
    assert set(spent) == {"uid 1000", "uid 1001"}
    assert spent["uid 1000"] == spent["uid 1001"]  # shared equally
    assert 0.06e9 <= work.total_ns() < 0.07e9
    assert work.total_ns() == pytest.approx(2 * spent["uid 1000"], abs=2)
    assert work.on_this_thread() == work.total_ns()
    # Each spent ~30 ms of a 20 ms allowance: refused, with when to come back.
    with pytest.raises(Unavailable) as e:
        work.check("uid 1000")
    assert e.value.rule == REQUESTED_RULE
    assert "uid 1000 has had the agent spend more than 0.2 % of a core on their" in str(e.value)
    assert "over the last 10 s" in str(e.value) and "retry in " in str(e.value)
    work.check("uid 1002")  # another reader is not held back
    now[0] += 6.0  # 6 s refill 12 ms: ~30 - 20 - 12 < 0 no longer short
    work.check("uid 1000")


def test_keeping_a_part_fresh_for_readers_is_theirs_but_not_their_allowance() -> None:
    work = RequestedWork(ratio=0.002, clock=lambda: 100.0)
    with work.work(["uid 1000"], bounded=False):  # a table refreshed every round for her
        _burn(0.05)
    assert work.by_reader()["uid 1000"] >= 0.05e9
    work.check("uid 1000")  # not refused for it
