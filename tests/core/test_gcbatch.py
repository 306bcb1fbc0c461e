"""`batch_allocations`: the collector held off inside the block and restored after it."""

from __future__ import annotations

import gc

import pytest

from bpfdyno.core.gcbatch import batch_allocations


def test_no_collection_runs_inside_and_the_collector_is_back_after() -> None:
    assert gc.isenabled()
    runs: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        runs.append(phase)

    gc.callbacks.append(seen)
    try:
        with batch_allocations():
            assert not gc.isenabled()
            kept = [(i, [i]) for i in range(50_000)]  # far past the 700 that start one
            assert runs == []
        assert gc.isenabled()
        more = [[i] for i in range(2_000)]  # the count is past due: a collection now
        assert "start" in runs
    finally:
        gc.callbacks.remove(seen)
    assert len(kept) == 50_000 and len(more) == 2_000


def test_an_error_inside_gives_the_collector_back() -> None:
    with pytest.raises(ValueError, match="bad record"), batch_allocations():
        raise ValueError("bad record")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled() -> None:
    gc.disable()
    try:
        with batch_allocations():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
