"""The UI against a real agent process: live data, its restart, and record-then-replay.

The agent runs as ``python -m bpfdyno serve`` on a socket in a temporary directory, with the
BPF collectors off (this file tests the UI, not BPF) and its Kineto endpoint in a private
socket directory. What the UI shows is compared with what the agent and /proc say.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from textual.widgets import Input, Static
from tui_helpers import wait_until, widget_text

from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc, kernel_pb2, kernel_pb2_grpc
from bpfdyno.tui.app import TopApp
from bpfdyno.tui.datasource import AgentDataSource
from bpfdyno.tui.fmt import fmt_bytes, fmt_clock
from bpfdyno.tui.recorded import RecordedDataSource, load_recording
from bpfdyno.tui.recorder import record, save_recording
from bpfdyno.tui.screens.trace import TraceScreen
from bpfdyno.tui.widgets.overview import LABEL
from bpfdyno.tui.widgets.table import FastTable
from bpfdyno.version import __version__

pytestmark = pytest.mark.slow

#: Off: they need BPF or hardware, and this file tests the UI.
OFF = ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "irq")


def _flags(tmp: Path, socket_dir: str) -> list[str]:
    from bpfdyno.core.config import KNOWN_COLLECTORS, Config

    flags = [f"--set=collectors.{n}.enabled=false" for n in OFF if n in KNOWN_COLLECTORS]
    cfg = Config()
    if hasattr(cfg, "legacy_rpc"):
        flags.append("--set=legacy_rpc.enabled=false")  # port 1778 is shared by the host
    if hasattr(cfg, "kineto"):
        # Not the global @dynolog name other agents on this host may hold.
        flags.append(f'--set=kineto.socket_dir="{socket_dir}"')
    return flags


class Agent:
    """A `bpfdyno serve` subprocess on a private socket."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sock = str(tmp / "a.sock")
        # Kineto socket names must stay short (a Unix socket path under ~100 bytes).
        self.socket_dir = tempfile.mkdtemp(prefix="bdtui", dir="/tmp")
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *("-m", "bpfdyno", "serve", "--socket", self.sock, "--interval", "0.5"),
                *_flags(self.tmp, self.socket_dir),
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            try:
                self.status()
                return
            except grpc.RpcError:
                time.sleep(0.1)
        raise AssertionError("agent not ready in 30 s")

    def status(self) -> agent_pb2.Status:
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            st: agent_pb2.Status = agent_pb2_grpc.AgentStub(ch).GetStatus(
                agent_pb2.GetStatusRequest(), timeout=2
            )
            return st

    def serves_kernel(self) -> bool:
        with grpc.insecure_channel(f"unix:{self.sock}") as ch:
            try:
                kernel_pb2_grpc.KernelStub(ch).GetEvents(kernel_pb2.GetEventsRequest(), timeout=2)
            except grpc.RpcError as e:
                return bool(e.code() != grpc.StatusCode.UNIMPLEMENTED)
        return True

    def stop(self) -> None:
        """SIGTERM, as systemd would; kill if it does not exit in 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path)
    a.start()
    try:
        yield a
    finally:
        a.stop()
        shutil.rmtree(a.socket_dir, ignore_errors=True)


def _meminfo_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal")


def _online_cpus() -> list[str]:
    with open("/proc/stat") as f:
        return [ln.split()[0][3:] for ln in f if ln.startswith("cpu") and ln[3].isdigit()]


async def test_live_agent_views(agent: Agent) -> None:
    app = TopApp(AgentDataSource(agent.sock), refresh_s=0.2, retry_s=(0.2, 0.5))
    async with app.run_test(size=(120, 40)) as pilot:
        m = app.state.metrics
        await wait_until(
            pilot, lambda: len(m.label_values("cpu_utilization_ratio", "cpu")) > 1, 20, "CPUs"
        )
        await wait_until(pilot, lambda: bool(m.history("memory_used_bytes")), 10, "memory")
        await pilot.pause(0.3)
        bar = widget_text(app.query_one("#status-bar", Static))
        assert bar.startswith(f"● {socket.gethostname()} · bpfdyno {__version__} · kernel")
        assert bar.endswith(agent.sock)
        # One bar per online CPU, in order, plus the total line.
        cpus = _online_cpus()
        assert m.label_values("cpu_utilization_ratio", "cpu") == [*cpus, "total"]
        app.render_views()
        cpu_text = widget_text(app.query_one("#cpu-panel", Static), width=118)
        for cpu in cpus:
            assert f"{cpu:>4} " in cpu_text
        # The memory line shows the host's MemTotal exactly as /proc/meminfo has it.
        total = _meminfo_total_bytes()
        assert m.latest("memory_total_bytes") == total
        mem_text = widget_text(app.query_one("#memory-panel", Static), width=118)
        used = fmt_bytes(m.latest("memory_used_bytes"))
        assert mem_text.startswith(f"{'MEM':<{LABEL}}{used}/{fmt_bytes(total)} ")

        # Agent tab: a row per collector the agent reports, with its state.
        await pilot.press("5")
        await pilot.pause(0.5)
        text = widget_text(app.query_one("#collectors-panel", Static), width=118)
        rows = text.split("\n\n")[0].splitlines()  # the table; reasons follow a blank line
        status = agent.status()
        states = {
            c.name: agent_pb2.CollectorState.Name(c.state).removeprefix("COLLECTOR_STATE_").lower()
            for c in status.collectors
        }
        shown = {r.split()[0]: r.split()[1] for r in rows[1:]}
        assert shown == states
        # Every reason the agent gives is shown, after its collector's name.
        for c in status.collectors:
            if c.reason:
                assert f"{c.name}: {c.reason.split()[0]}" in " ".join(text.split())
        summary = widget_text(app.query_one("#agent-summary", Static), width=118)
        assert f"pid {status.pid}" in summary

        # Processes tab: the agent's own process, found with the filter.
        await pilot.press("2")
        table = app.query_one("#process-table", FastTable)
        if agent.serves_kernel():
            await wait_until(pilot, lambda: app.state.processes is not None, 20, "process table")
            await pilot.press("slash", *f"pid={status.pid}", "enter")
            await wait_until(pilot, lambda: len(table.items) == 1, 10, "the agent's row")
            assert table.items[0].pid == status.pid
            assert "serve" in table.items[0].cmdline
        else:
            await wait_until(pilot, lambda: not app.state.processes_state.ok, 10)
            assert "does not serve the Kernel API" in app.state.processes_state.reason


async def test_agent_restart_is_reported_and_reconnected(agent: Agent) -> None:
    app = TopApp(AgentDataSource(agent.sock), refresh_s=0.2, retry_s=(0.2, 0.5))
    async with app.run_test(size=(200, 30)) as pilot:
        await wait_until(pilot, lambda: app.state.connection.connected, 20, "connected")
        first_start = app.state.connection.agent_started_ts
        agent.stop()
        await wait_until(pilot, lambda: not app.state.connection.connected, 20, "lost")
        await pilot.pause(0.3)
        bar = widget_text(app.query_one("#status-bar", Static), width=198)
        assert bar.startswith(f"✖ cannot reach the agent at {agent.sock}")
        assert "retrying in" in bar
        agent.start()
        started = agent.status().started_unix_seconds
        assert started > first_start
        await wait_until(pilot, lambda: app.state.connection.connected, 30, "reconnected")
        await pilot.pause(0.3)
        bar = widget_text(app.query_one("#status-bar", Static), width=198)
        assert f"reconnected: the agent restarted at {fmt_clock(started)}" in bar
        # Live data flows again: a round newer than the restart arrives.
        await wait_until(pilot, lambda: app.state.metrics.now > started, 10, "new rounds")


async def test_record_then_replay(agent: Agent, tmp_path: Path) -> None:
    source = AgentDataSource(agent.sock)
    try:
        rec = await record(source, seconds=2.0, interval_s=1.0)
    finally:
        await source.close()
    path = tmp_path / "rec.json"
    save_recording(rec, path)
    back = load_recording(path)
    assert len(back.frames) == 2
    assert all(any(r.collector == "host" for r in f.rounds) for f in back.frames)
    if agent.serves_kernel():
        assert all(f.processes is not None and f.processes.processes for f in back.frames)
    else:
        assert dict(back.unavailable)["processes"].endswith(
            "(an older agent, or that part is turned off in its configuration)"
        )
    app = TopApp(RecordedDataSource(back, speed=20.0, loop=False), refresh_s=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        m = app.state.metrics
        await wait_until(pilot, lambda: bool(m.history("memory_total_bytes")), 10, "replay")
        assert m.latest("memory_total_bytes") == _meminfo_total_bytes()
        assert app.state.status is not None and app.state.status.pid == agent.status().pid
    assert os.path.getsize(path) > 0


TRAINER = Path(__file__).parent / "tui_trainer.py"


def _start_trainer(agent: Agent, tmp: Path) -> tuple[subprocess.Popen[str], int]:
    """A PyTorch trainer registered with ``agent``; returns it and its pid once it runs."""
    conf = tmp / "kineto.conf"
    conf.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")  # poll every second
    env = dict(
        os.environ,
        KINETO_USE_DAEMON="1",
        KINETO_IPC_SOCKET_DIR=agent.socket_dir,
        KINETO_CONFIG=str(conf),
    )
    proc = subprocess.Popen(
        [sys.executable, str(TRAINER), "120"], env=env, stdout=subprocess.PIPE, text=True
    )
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()))  # type: ignore[union-attr]
    reader.start()
    reader.join(60)
    if not line or not line[0].startswith("ready "):
        proc.kill()
        raise AssertionError(f"trainer did not start: {line}")
    return proc, int(line[0].split()[1])


async def test_trace_a_real_trainer_from_the_form(agent: Agent, tmp_path: Path) -> None:
    """Trainers tab -> t -> the form -> the agent -> Kineto in PyTorch -> the file shown."""
    trainer, pid = _start_trainer(agent, tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    try:
        app = TopApp(AgentDataSource(agent.sock), refresh_s=0.2, retry_s=(0.2, 0.5))
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_until(pilot, lambda: app.state.connection.connected, 20, "connected")
            await pilot.press("3")
            await wait_until(
                pilot, lambda: any(t.pid == pid for t in app.state.trainers), 30, "trainer"
            )
            app.query_one("#trainer-table", FastTable).move_cursor_to_key(pid)
            await pilot.press("t")
            await wait_until(pilot, lambda: isinstance(app.screen, TraceScreen), 5, "form")
            form = app.screen
            assert form.query_one("#trace-pids", Input).value == str(pid)
            form.query_one("#trace-file", Input).value = str(traces / "t.json")
            await pilot.press("ctrl+s")

            def finished() -> bool:
                st = app.state.last_trace
                return st is not None and st.finished

            await wait_until(pilot, finished, 90, "the trace to finish")
            st = app.state.last_trace
            assert st is not None
            procs = {p.pid: p for p in st.lines()}
            expected = traces / f"t_{pid}.json"
            assert procs[pid].state == "written", procs[pid]
            assert procs[pid].path == str(expected)
            assert procs[pid].size_bytes == expected.stat().st_size
            await pilot.pause(0.3)
            progress = widget_text(form.query_one("#trace-progress", Static), width=116)
            assert str(expected) in progress
    finally:
        trainer.kill()
        trainer.wait()
