"""Driving the app with keys and clicks: tabs, sorting, filtering, details, the trace form,
and the connection banner when the agent goes away and comes back."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events
from textual.widgets import Input, Static
from tui_helpers import FIXED_NOW, make_app, settle, wait_until, widget_text
from tui_synthetic import make_recording

from bpfdyno.rpc.processes import ProcessFilter, ProcessRow
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.app import run_top
from bpfdyno.tui.screens.help import HelpScreen
from bpfdyno.tui.screens.process import ProcessScreen
from bpfdyno.tui.screens.trace import FormError, TraceScreen, parse_trace_form
from bpfdyno.tui.widgets.processes import ProcessesView
from bpfdyno.tui.widgets.table import FastTable

SIZE = (100, 30)


def _pids(app: object) -> list[int]:
    table = app.query_one("#process-table", FastTable)  # type: ignore[attr-defined]
    return [r.pid for r in table.items]


async def test_number_keys_switch_tabs_and_focus_their_list() -> None:
    app, source = make_app(make_recording(processes=20, frames=3))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        assert app.active_tab == "overview"
        for key, tab in (("2", "processes"), ("3", "trainers"), ("4", "events"), ("5", "agent")):
            await pilot.press(key)
            await wait_until(pilot, lambda tab=tab: app.active_tab == tab, 5, tab)
        await pilot.press("2")
        table = app.query_one("#process-table", FastTable)
        await wait_until(pilot, lambda: app.focused is table, 5, "the table focused")
        await pilot.press("question_mark")
        await wait_until(pilot, lambda: isinstance(app.screen, HelpScreen), 5, "help")
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, HelpScreen), 5, "no help")
        await pilot.press("1")
        await wait_until(pilot, lambda: app.active_tab == "overview", 5, "overview")


@pytest.mark.parametrize(
    ("keys", "tab", "focused"),
    [
        ("23", "trainers", "#trainer-table"),
        ("2342", "processes", "#process-table"),
        ("5421", "overview", "#overview-view"),
    ],
)
async def test_tab_keys_typed_back_to_back_end_on_the_last_tab(
    keys: str, tab: str, focused: str
) -> None:
    """Keys typed faster than the app settles (all queued before it handles the first) end
    on the last key's tab with its list focused: the list focused for an earlier key must
    not take the tabs back to its own pane."""
    app, source = make_app(make_recording(processes=20, frames=3))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        for key in keys:  # queued, not awaited one by one as pilot.press does
            app.post_message(events.Key(key, key))
        target = app.query_one(focused)

        def settled() -> bool:
            return app.active_tab == tab and app.focused is target

        await wait_until(pilot, settled, 5, f"{tab} shown with {focused} focused")
        await pilot.pause(0.3)  # a late focus would switch back by now
        assert (app.active_tab, app.focused) == (tab, target)
        assert app.query_one(ProcessesView).filter == ProcessFilter()


async def test_sorting_by_keys_and_header_clicks() -> None:
    app, source = make_app(make_recording(processes=12, frames=1))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        await pilot.press("2")
        await wait_until(pilot, lambda: len(_pids(app)) == 12, what="12 rows")
        # Default: CPU% descending. cpu_ratio of row k is ((k*37) % 101)/100.
        by_cpu = sorted(range(12), key=lambda k: (-((k * 37) % 101), k))
        assert _pids(app) == [1000 + 7 * k for k in by_cpu]
        await pilot.press("r")  # ascending
        assert _pids(app) == [1000 + 7 * k for k in reversed(by_cpu)]
        await pilot.press("s")  # next column after cpu (wide layout at 100 cols? no: narrow)
        view = app.query_one(ProcessesView)
        assert view.sort_key == "rss_bytes" and view.descending
        by_rss = sorted(range(12), key=lambda k: (-((k * 7919 % 997) + 1), k))
        assert _pids(app) == [1000 + 7 * k for k in by_rss]
        await pilot.press("S", "S")  # back two: rss -> cpu -> pid
        assert view.sort_key == "pid" and not view.descending
        assert _pids(app) == [1000 + 7 * k for k in range(12)]
        # A click on the PID title (sorted already) reverses; on the RSS title sorts by it.
        table = app.query_one("#process-table", FastTable)
        await pilot.click(table, offset=(3, 0))
        assert _pids(app) == [1000 + 7 * k for k in reversed(range(12))]
        await pilot.click(table, offset=(16, 0))
        assert view.sort_key == "rss_bytes"
        assert _pids(app) == [1000 + 7 * k for k in by_rss]


async def test_filtering_as_you_type_and_errors() -> None:
    app, source = make_app(make_recording(processes=40, frames=1))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        await pilot.press("2")
        app.query_one(ProcessesView).set_sort("pid")
        await pilot.press("slash")
        await pilot.press(*"job=5678")
        assert _pids(app) == [1007, 1021, 1042, 1077, 1091, 1112, 1147, 1182, 1217, 1252]
        await pilot.press(*" python")
        assert _pids(app) == [1021, 1091]  # the two trainers
        await pilot.press("escape")
        assert len(_pids(app)) == 40
        await pilot.press("slash", *"pid=1")
        assert _pids(app) == []
        await pilot.press("x")
        await pilot.pause(0.2)  # a refresh tick must not hide the error
        summary = widget_text(app.query_one("#process-summary", Static))
        assert summary == "pid must be a number in 'pid=1x'; write pid=1234"
        assert _pids(app) == []  # the last good filter (pid=1) stays in force
        await pilot.press("backspace", "backspace", *"1014")
        assert _pids(app) == [1014]


async def test_enter_opens_process_details_and_escape_returns() -> None:
    app, source = make_app(make_recording(processes=20, frames=2))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        await pilot.press("2")
        app.query_one(ProcessesView).set_sort("pid")
        await pilot.press("home", "down", "down", "enter")  # the third pid: 1014
        await wait_until(pilot, lambda: isinstance(app.screen, ProcessScreen), what="details")
        screen = app.screen
        assert isinstance(screen, ProcessScreen) and screen.pid == 1014
        await pilot.pause(0.2)
        body = widget_text(screen.query_one("#process-body", Static))
        assert "/usr/bin/worker2 --id 2" in body
        assert "job - · container 000000000000" in body
        await pilot.press("escape")
        assert not isinstance(app.screen, ProcessScreen)


async def test_trace_form_sends_the_exact_request_and_follows_it_to_the_files() -> None:
    app, source = make_app(make_recording(processes=40, frames=2))
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot, app, source)
        await pilot.press("3")
        await wait_until(pilot, lambda: bool(app.state.trainers), what="trainers")
        await pilot.press("down", "t")  # second trainer: pid 1091, job 5678
        await wait_until(pilot, lambda: isinstance(app.screen, TraceScreen), what="form")
        form = app.screen
        assert form.query_one("#trace-pids").value == "1091"  # type: ignore[attr-defined]
        assert form.query_one("#trace-job").value == "5678"  # type: ignore[attr-defined]
        await pilot.click("#mode-iterations")
        assert form.query_one("#trace-amount").value == "5"  # type: ignore[attr-defined]
        await pilot.click("#opt-shapes")
        await pilot.click("#opt-stacks")
        await pilot.press("ctrl+s")
        await wait_until(pilot, lambda: app.state.last_trace is not None, what="trace state")
        await wait_until(
            pilot,
            lambda: app.state.last_trace is not None and app.state.last_trace.finished,
            what="trace done",
        )
        assert source.trace_requests == [
            TraceSpec(
                log_file="",
                pids=(1091,),
                job_id=5678,
                iterations=5,
                process_limit=3,
                record_shapes=True,
                with_stacks=True,
                kernel_tracks="all",
            )
        ]
        await pilot.pause(0.1)
        progress = widget_text(form.query_one("#trace-progress", Static))
        assert "/tmp/trace_1091.json" in progress and "written" in progress
        await pilot.press("escape")  # the Trainers tab keeps the trace
        panel = widget_text(app.query_one("#trace-panel", Static))
        assert "trace t-0002: done" in panel


async def test_trace_form_rejects_bad_input_without_sending() -> None:
    app, source = make_app(make_recording(processes=40, frames=1))
    async with app.run_test(size=(100, 40)) as pilot:
        await settle(pilot, app, source)
        await pilot.press("3", "t")
        await wait_until(pilot, lambda: isinstance(app.screen, TraceScreen), what="form")
        form = app.screen
        amount = form.query_one("#trace-amount")
        amount.value = "0"  # type: ignore[attr-defined]
        await pilot.press("ctrl+s")
        error = widget_text(form.query_one("#trace-error", Static))
        assert error == "Duration (ms): enter a whole number above 0, e.g. 500"
        assert source.trace_requests == []


async def test_banner_while_the_agent_is_away_and_restart_notice() -> None:
    app, source = make_app(make_recording(processes=5, frames=2))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        assert app.state.connection.connected
        source.disconnect("the agent stopped")
        await wait_until(pilot, lambda: not app.state.connection.connected, what="lost")
        await pilot.pause(0.1)
        bar = widget_text(app.query_one("#status-bar", Static))
        assert bar.startswith(
            "✖ cannot reach the agent (recording): the agent stopped · retrying in"
        )
        source.reconnect(restarted=True)
        await wait_until(pilot, lambda: app.state.connection.connected, what="reconnected")
        await pilot.pause(0.1)
        bar = widget_text(app.query_one("#status-bar", Static))
        # started_ts = 1_700_000_000 (22:13:20 UTC) - 3725 s + 1000 s -> 21:27:55 UTC.
        assert "reconnected: the agent restarted at 21:27:55" in bar


def test_parse_trace_form_builds_requests() -> None:
    assert parse_trace_form("12, 34", "", "duration", "750", "/tmp/x.json", "2") == TraceSpec(
        log_file="/tmp/x.json", pids=(12, 34), duration_ms=750, process_limit=2, kernel_tracks="all"
    )
    assert parse_trace_form(
        "", "99", "iterations", "3", "/tmp/y.json", "1", ["profile_memory", "with_modules"]
    ) == TraceSpec(
        log_file="/tmp/y.json",
        job_id=99,
        iterations=3,
        process_limit=1,
        profile_memory=True,
        with_modules=True,
        kernel_tracks="all",
    )
    # The kernel-track checkboxes and the pre-window.
    assert parse_trace_form(
        "7", "", "duration", "500", "/tmp/z.json", "3", (), ["sched", "net"], "2.5"
    ) == TraceSpec(
        log_file="/tmp/z.json",
        pids=(7,),
        kernel_tracks="net,sched",
        pre_window_seconds=2.5,
    )
    assert (
        parse_trace_form("7", "", "duration", "500", "/tmp/z.json", "3", (), []).kernel_tracks
        == "none"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "", "duration", "5", "/tmp/a.json", "3"), "enter at least one PID or a job id"),
        (("12 x", "", "duration", "5", "/tmp/a.json", "3"), "PIDs: 'x' is not a process id"),
        (("12", "j1", "duration", "5", "/tmp/a.json", "3"), "Job id: 'j1' is not a SLURM job id"),
        (("12", "", "iterations", "-1", "/tmp/a.json", "3"), "Iterations: enter a whole number"),
        (("12", "", "duration", "5", "tmp/a.json", "3"), "Log file: enter an absolute path"),
        (("12", "", "duration", "5", "/tmp/a.trace", "3"), "Log file: end the name in .json"),
        (("12", "", "duration", "5", "/tmp/a.json", "0"), "Process limit: enter a whole number"),
        (
            ("12", "", "duration", "5", "/tmp/a.json", "3", (), ("net",), "soon"),
            "Pre-window: enter seconds from 0 to 3600",
        ),
    ],
)
def test_parse_trace_form_errors(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(FormError) as e:
        parse_trace_form(*args)
    assert str(e.value).startswith(message)


def test_fixed_clock_is_the_recording_time() -> None:
    # The default file name in the trace test comes from this clock (UTC).
    assert FIXED_NOW == 1_700_000_005.0
    assert ProcessRow(pid=1, comm="x").command == "[x]"


async def test_job_id_narrows_processes_and_trainers() -> None:
    rec = make_recording(processes=40, frames=2)
    app, source = make_app(rec, job_id="5678")
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        await pilot.press("2")
        app.query_one(ProcessesView).set_sort("pid")
        await wait_until(pilot, lambda: bool(_pids(app)), what="rows")
        assert _pids(app) == [1007, 1021, 1042, 1077, 1091, 1112, 1147, 1182, 1217, 1252]
        summary = widget_text(app.query_one("#process-summary", Static))
        assert summary.startswith("10 shown of 10 reported, 612 on host · sort PID▲ · job 5678")
        bar = widget_text(app.query_one("#status-bar", Static))
        assert " · job 5678 · " in bar
        await pilot.press("3", "T")  # trace the whole job of the selected trainer
        await wait_until(pilot, lambda: isinstance(app.screen, TraceScreen), what="form")
        assert app.screen.query_one("#trace-pids", Input).value == ""
        assert app.screen.query_one("#trace-job", Input).value == "5678"


def test_run_top_refuses_a_bad_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert run_top(None, replay=bad) == 2
    err = capsys.readouterr().err
    assert err == (
        f'bpfdyno top: {bad}: not a bpfdyno top recording: expected "format": '
        '"bpfdyno-top-recording"\n'
    )


async def test_the_fabric_panel_on_a_big_node_and_on_one_without_rdma() -> None:
    # Eight adapters: one line for all of them (none in trouble), then the NICs and softirqs.
    app, source = make_app(make_recording(processes=5, frames=2, rdma_ports=8))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        text = widget_text(app.query_one("#fabric-panel", Static))
        lines = text.splitlines()
        assert lines[0].startswith("RDMA  8 ports, 8 ACTIVE tx ")
        assert " err 0/s" in lines[0] and not any("mlx5_" in line for line in lines)
        assert lines[1:5] == [
            f"{label}{nic} 200Gb discards 0/s pause 0/s pfc 120/s no buffer 0/s"
            for label, nic in (
                ("NIC   ", "eth1"),
                ("      ", "eth3"),
                ("      ", "eth5"),
                ("      ", "eth7"),
            )
        ]
        # NET_RX 0.2 s/s on CPU 1 and 0.01 on the 7 others, TIMER 0.004 and RCU 0.002 on each.
        assert lines[5] == (
            "IRQ   softirq 4.0% of CPU (NET_RX 3.4%, TIMER 0.4%, RCU 0.2%) · hardirq 0.1% · "
            "busiest CPU 1 20.6%"
        )
    # No adapter: said so, not left blank or shown as zeros.
    app, source = make_app(make_recording(processes=5, frames=2, rdma_ports=0))
    async with app.run_test(size=SIZE) as pilot:
        await settle(pilot, app, source)
        text = widget_text(app.query_one("#fabric-panel", Static))
        assert text.splitlines()[0] == "RDMA  none on this node"
