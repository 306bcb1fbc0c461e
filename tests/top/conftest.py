"""Fixtures of the UI tests: a fixed time zone, so clock text in screenshots is stable."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def utc_time_zone() -> Iterator[None]:
    """Render local times in UTC during the test, then restore the time zone."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()
