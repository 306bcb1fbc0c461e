"""Plain-text screenshots of every view, compared with files under snapshots/.

Fed with deterministic synthetic recordings (including empty, degraded and disconnected
agents) at 80x24 — the smallest terminal the UI promises to work in — and 200x50. After an
intended change of the UI, review the new rendering and rewrite the files with
``BPFDYNO_UPDATE_SNAPSHOTS=1 pytest tests/top/test_tui_snapshots.py``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from textual.pilot import Pilot
from tui_helpers import assert_snapshot, make_app, settle, settled_screen, wait_until
from tui_synthetic import make_recording

from bpfdyno.rpc.processes import ProcessList
from bpfdyno.tui.app import TopApp
from bpfdyno.tui.recorded import Frame, RecordedDataSource
from bpfdyno.tui.screens.help import HelpScreen
from bpfdyno.tui.screens.process import ProcessScreen
from bpfdyno.tui.screens.trace import TraceScreen

SMALL = (80, 24)
LARGE = (200, 50)
NO_KERNEL = "the agent at /run/bpfdyno/bpfdyno.sock does not serve the Kernel API (an older agent)"
NO_TRACING = (
    "the agent at /run/bpfdyno/bpfdyno.sock does not serve the Tracing API (an older agent)"
)
NO_GPU = (
    "NVML library not found (libnvidia-ml.so.1): install the NVIDIA driver, or disable the "
    "collector with collectors.gpu.enabled = false"
)


TABS = {"1": "overview", "2": "processes", "3": "trainers", "4": "events", "5": "agent"}


def _tab_ready(app: TopApp, tab: str) -> bool:
    """The tab is active and its list has the focus (so the footer shows its keys)."""
    if app.active_tab != tab:
        return False
    lists = list(app.query_one(f"#{tab}").query("FastTable, VerticalScroll"))
    return not lists or lists[0].has_focus


async def _show(pilot: Pilot[Any], app: TopApp, source: RecordedDataSource, key: str) -> None:
    """Switch to a tab and wait until it shows the last frame's data."""
    await pilot.press(key)
    # Under load the tab switch and the focus move take a few event-loop turns: wait for them
    # instead of a fixed pause, or the footer may still show the previous tab's keys.
    await wait_until(pilot, lambda: _tab_ready(app, TABS[key]), what=f"the {TABS[key]} tab")
    if key == "2" and not source.recording.unavailable:
        last = source.recording.frames[-1].ts
        await wait_until(
            pilot,
            lambda: app.state.processes is not None and app.state.processes.unix_seconds == last,
            what="the last process table",
        )
    if key == "3":
        await wait_until(pilot, lambda: app.state.trainers_state.reason != "not asked yet")
    await pilot.pause(0.2)
    app.render_views()
    await pilot.pause(0.05)


@pytest.mark.parametrize(
    ("key", "name"),
    [("1", "overview"), ("2", "processes"), ("3", "trainers"), ("4", "events"), ("5", "agent")],
)
@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "200x50"])
async def test_each_tab(key: str, name: str, size: tuple[int, int]) -> None:
    app, source = make_app(make_recording(processes=60, frames=6))
    async with app.run_test(size=size) as pilot:
        await settle(pilot, app, source)
        await _show(pilot, app, source, key)
        assert_snapshot(f"{name}_{size[0]}x{size[1]}", await settled_screen(pilot, app))


async def test_overview_many_cores_without_gpm_at_200x50() -> None:
    app, source = make_app(make_recording(processes=5, frames=4, cores=64, gpus=4, gpm=False))
    async with app.run_test(size=LARGE) as pilot:
        await settle(pilot, app, source)
        await _show(pilot, app, source, "1")
        assert_snapshot("overview_64cores_4gpus_200x50", await settled_screen(pilot, app))


async def test_dialogs_at_80x24() -> None:
    app, source = make_app(make_recording(processes=60, frames=3))
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app, source)
        await _show(pilot, app, source, "3")
        await pilot.press("t")
        await wait_until(pilot, lambda: isinstance(app.screen, TraceScreen))
        await pilot.pause(0.1)
        assert_snapshot("trace_form_80x24", await settled_screen(pilot, app))
        await pilot.press("ctrl+s")
        await wait_until(
            pilot, lambda: app.state.last_trace is not None and app.state.last_trace.finished
        )
        await pilot.pause(0.1)
        assert_snapshot("trace_done_80x24", await settled_screen(pilot, app))
        await pilot.press("escape")
        await pilot.pause(0.1)
        app.render_views()
        await pilot.pause(0.05)
        assert_snapshot("trainers_after_trace_80x24", await settled_screen(pilot, app))
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen))
        await pilot.pause(0.1)
        assert_snapshot("help_80x24", await settled_screen(pilot, app))
        await pilot.press("escape", "2", "home", "enter")
        await wait_until(pilot, lambda: isinstance(app.screen, ProcessScreen))
        await pilot.pause(0.2)
        app.render_views()
        await pilot.pause(0.05)
        assert_snapshot("process_detail_80x24", await settled_screen(pilot, app))


async def test_empty_agent() -> None:
    """An agent that just started: no rounds yet, no processes, trainers or events."""
    rec = make_recording(processes=0, frames=1, gpus=0, trainer_count=0, with_events=False)
    ts = rec.frames[0].ts
    empty = Frame(ts=ts, rounds=(), processes=ProcessList((), ts, 0), trainers=())
    rec = replace(rec, frames=(empty,), history=())
    app, source = make_app(rec)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app, source)
        for key, name in (("1", "overview"), ("2", "processes"), ("3", "trainers")):
            await _show(pilot, app, source, key)
            assert_snapshot(f"empty_{name}_80x24", await settled_screen(pilot, app))


async def test_degraded_agent() -> None:
    """No GPU driver, no Kernel or Tracing API: each part says why, the rest works."""
    rec = make_recording(
        processes=10,
        frames=3,
        gpus=0,
        gpu_state="unavailable",
        gpu_reason=NO_GPU,
        unavailable={"processes": NO_KERNEL, "events": NO_KERNEL, "trainers": NO_TRACING},
    )
    app, source = make_app(rec)
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app, source)
        for key, name in (
            ("1", "overview"),
            ("2", "processes"),
            ("3", "trainers"),
            ("4", "events"),
        ):
            await _show(pilot, app, source, key)
            assert_snapshot(f"degraded_{name}_80x24", await settled_screen(pilot, app))


async def test_disconnected_from_the_start() -> None:
    app, source = make_app(make_recording(processes=5, frames=2), retry_s=(30.0, 30.0))
    source.disconnect("connection refused")
    async with app.run_test(size=SMALL) as pilot:
        await wait_until(pilot, lambda: "attempt 1" in app.state.connection.message)
        await pilot.pause(0.1)
        assert_snapshot("disconnected_start_80x24", await settled_screen(pilot, app))


async def test_disconnected_after_data() -> None:
    """The last values stay on screen under a banner saying the agent is gone."""
    app, source = make_app(make_recording(processes=5, frames=3), retry_s=(30.0, 30.0))
    async with app.run_test(size=SMALL) as pilot:
        await settle(pilot, app, source)
        source.disconnect("the agent stopped")
        await wait_until(pilot, lambda: not app.state.connection.connected)
        await pilot.pause(0.1)
        assert_snapshot("disconnected_after_data_80x24", await settled_screen(pilot, app))
