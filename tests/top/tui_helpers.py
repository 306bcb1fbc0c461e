"""Helpers of the UI tests: plain-text screenshots, snapshot files, waiting on the app."""

from __future__ import annotations

import difflib
import io
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Footer, Static

from bpfdyno.tui.app import TopApp
from bpfdyno.tui.recorded import RecordedDataSource, Recording

SNAPSHOTS = Path(__file__).parent / "snapshots"
#: Set to 1 to (re)write the snapshot files from the current rendering.
UPDATE_ENV = "BPFDYNO_UPDATE_SNAPSHOTS"
#: The clock the apps under test read: the synthetic recording's time, plus five seconds.
FIXED_NOW = 1_700_000_005.0


def screen_text(app: App[Any]) -> str:
    """The screen as plain text, one line per terminal row, trailing spaces removed."""
    width, height = app.size
    console = Console(
        width=width,
        height=height,
        file=io.StringIO(),
        force_terminal=True,
        color_system=None,
        record=True,
        legacy_windows=False,
        safe_box=False,
    )
    # The same composition export_screenshot() renders, without the SVG wrapping.
    update = app.screen._compositor.render_update(
        full=True, screen_stack=app._background_screens, simplify=True
    )
    console.print(update)
    lines = console.export_text().splitlines()
    return "\n".join(line.rstrip() for line in lines) + "\n"


async def settled_screen(pilot: Pilot[Any], app: App[Any], timeout: float = 10.0) -> str:
    """The screen once it has settled: the footer shows its keys and three captures 50 ms
    apart are identical. Under load a fixed pause can catch a half-drawn screen."""
    deadline = time.monotonic() + timeout
    same, last = 0, ""
    while time.monotonic() < deadline:
        footers = app.screen.query(Footer)
        keys_drawn = not footers or bool(footers.first().children)
        text = screen_text(app)
        same = same + 1 if keys_drawn and text == last else 0
        if same >= 2:
            return text
        last = text
        await pilot.pause(0.05)
    raise AssertionError(f"the screen did not settle within {timeout} s:\n{last}")


def widget_text(widget: Static, width: int = 200) -> str:
    """What a Static shows, as plain text (Rich tables and Text alike)."""
    console = Console(width=width, file=io.StringIO(), record=True, color_system=None)
    content = widget.content
    console.print(content if not isinstance(content, str) else Text(content))
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip()


def assert_snapshot(name: str, text: str) -> None:
    """Compare ``text`` with ``snapshots/<name>.txt`` (write it when updating)."""
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get(UPDATE_ENV) == "1":
        path.write_text(text, encoding="utf-8")
        return
    if not path.exists():
        raise AssertionError(f"no snapshot {path.name}; run with {UPDATE_ENV}=1 to create it")
    expected = path.read_text(encoding="utf-8")
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"{name} (expected)",
                f"{name} (rendered)",
            )
        )
        raise AssertionError(f"screen differs from snapshot {path.name}:\n{diff}")


async def wait_until(
    pilot: Pilot[Any], condition: Callable[[], bool], timeout: float = 10.0, what: str = ""
) -> None:
    """Let the app run until ``condition`` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or condition}")
        await pilot.pause(0.02)


def make_app(recording: Recording, **kwargs: object) -> tuple[TopApp, RecordedDataSource]:
    """An app replaying ``recording`` fast, once, with a fixed clock."""
    source = RecordedDataSource(recording, speed=50.0, loop=False, name="recording")
    options: dict[str, object] = {
        "refresh_s": 0.1,
        "retry_s": (0.05, 0.2),
        "clock": lambda: FIXED_NOW,
    }
    options.update(kwargs)
    return TopApp(source, **options), source  # type: ignore[arg-type]


async def settle(pilot: Pilot[Any], app: TopApp, source: RecordedDataSource) -> None:
    """Wait until every frame is played and the views show the last one."""
    last = len(source.recording.frames) - 1
    await wait_until(pilot, lambda: source._index == last, what="all frames played")
    await pilot.pause(0.3)
    app.render_views()
    await pilot.pause(0.05)
