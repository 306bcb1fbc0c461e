"""The tracing component's bounded stop: a part that overruns its wait is left behind, and
the log says whether that lost anything (an error) or not (an information line)."""

from __future__ import annotations

import threading

import pytest

from bpfdyno.app import tracing


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "STOP_TIMEOUT_S", 0.2)


async def test_an_overrun_that_loses_nothing_is_an_information_line(
    short_wait: None, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    caplog.set_level("INFO", logger=tracing.__name__)
    try:
        await tracing._bounded(gate.wait, "the capture", lambda: "was still compiling")
    finally:
        gate.set()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "the capture was still compiling; stopping without waiting for it")
    ]


async def test_any_other_overrun_is_an_error(
    short_wait: None, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    caplog.set_level("INFO", logger=tracing.__name__)
    try:
        await tracing._bounded(gate.wait, "the capture", lambda: None)
    finally:
        gate.set()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "the capture did not stop within 0.2 s; stopping without it")
    ]


async def test_a_part_that_stops_in_time_logs_nothing(
    short_wait: None, caplog: pytest.LogCaptureFixture
) -> None:
    ran = threading.Event()
    caplog.set_level("INFO", logger=tracing.__name__)
    await tracing._bounded(ran.set, "the capture", lambda: "was still compiling")
    assert ran.is_set()
    assert caplog.records == []
