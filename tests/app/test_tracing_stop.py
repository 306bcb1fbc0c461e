"""The tracing component's bounded stop: a part that overruns its wait is left behind, and
the log says whether that lost anything (an error) or not (an information line)."""

from __future__ import annotations

import threading

import pytest

from bpfdyno.app import tracing


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "STOP_TIMEOUT_S", 0.2)


@pytest.mark.parametrize(
    ("reason", "logged"),
    [
        (
            "was still compiling",
            ("INFO", "the capture was still compiling; stopping without waiting for it"),
        ),
        (None, ("ERROR", "the capture did not stop within 0.2 s; stopping without it")),
    ],
    ids=["loses-nothing-information", "any-other-error"],
)
async def test_a_part_that_overruns_is_left_behind_and_said(
    short_wait: None,
    caplog: pytest.LogCaptureFixture,
    reason: str | None,
    logged: tuple[str, str],
) -> None:
    gate = threading.Event()
    caplog.set_level("INFO", logger=tracing.__name__)
    try:
        await tracing._bounded(gate.wait, "the capture", lambda: reason)
    finally:
        gate.set()
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [logged]


async def test_a_part_that_stops_in_time_logs_nothing(
    short_wait: None, caplog: pytest.LogCaptureFixture
) -> None:
    ran = threading.Event()
    caplog.set_level("INFO", logger=tracing.__name__)
    await tracing._bounded(ran.set, "the capture", lambda: "was still compiling")
    assert ran.is_set()
    assert caplog.records == []
