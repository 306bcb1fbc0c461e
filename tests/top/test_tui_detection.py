"""``bpfdyno top --job-id`` in a real terminal (a pty read by pyte) shows the rank the agent's
detection flags, live: a real agent (daemon, gRPC server on loopback TCP, the detection
collector at a 0.25 s interval) watches four real processes with ``RANK`` set; rank 3 spins
on CPU 1 beside a hog pinned there, so it waits for a CPU while ranks 0-2 sleep. The node's
row carries the marker and the evidence, the cluster screen lists the events; the node's
Detection tab lists them with rank, host and evidence; when the hog stops, the rank is
cleared and the marker goes."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pty_screen import PtyScreen, bpfdyno
from tui_helpers import screen_text, wait_until

from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon
from bpfdyno.core.config import load
from bpfdyno.detection.collector import DetectionCollector, DetectionSettings
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess
from bpfdyno.rpc.detection import DetectionKind
from bpfdyno.server.detection import detection_servicer_factory
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.services.detection import DetectionService
from bpfdyno.tui.app import TopApp
from bpfdyno.tui.datasource import AgentDataSource
from bpfdyno.tui.detection_model import flagged, flags_by_pid

pytestmark = pytest.mark.slow

SLEEPER = "import time\ntime.sleep(3600)\n"
SPINNER = "while True:\n    pass\n"
JOB = "7"
HOST = "node-a"


@contextlib.contextmanager
def _process(source: str, rank: int | None, cpu: int | None) -> Iterator[subprocess.Popen[bytes]]:
    env = {k: v for k, v in os.environ.items() if k != "RANK"}
    if rank is not None:
        env["RANK"] = str(rank)
    p = subprocess.Popen([sys.executable, "-c", source], env=env)
    try:
        if cpu is not None:
            os.sched_setaffinity(p.pid, {cpu})
        yield p
    finally:
        p.kill()
        p.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _agent(tmp: Path, pids: list[int], port: int) -> AsyncIterator[EventLog]:
    cfg = load(
        None,
        [
            ("collectors.detection.interval_s", "0.25"),
            ("grpc.socket", f'"{tmp / "a.sock"}"'),
            ("grpc.tcp", f'"127.0.0.1:{port}"'),
            ("grpc.insecure_tcp", "true"),
        ],
    )
    events = EventLog()
    collector = DetectionCollector(
        lambda: [RankProcess(pid, JOB) for pid in pids],
        events,
        HOST,
        DetectionSettings.of(3.0, 6, 2, 3, 1, hang_after_s=600.0),
    )
    daemon = Daemon(cfg, [collector], [], catalog=CATALOG)
    server = GrpcServer(
        cfg.grpc,
        AgentService(daemon, CATALOG),
        [detection_servicer_factory(DetectionService(events, collector.rank_signals))],
    )
    await server.start()
    await daemon.start()
    try:
        yield events
    finally:
        await server.stop()
        await daemon.stop()


async def _wait(screen: PtyScreen, *what: str, timeout: float = 60.0) -> str:
    """The screen once it shows every pattern of ``what`` at once (the parts of a screen are
    drawn one after the other); waited for on a thread: the agent runs on this test's loop."""
    patterns = [re.compile(w) for w in what]
    return await asyncio.to_thread(
        screen.wait_for,
        lambda text: all(p.search(text) for p in patterns),
        timeout,
        " and ".join(what),
    )


async def test_top_job_id_marks_the_straggling_rank_and_lists_the_events(tmp_path: Path) -> None:
    port = _free_port()
    with (
        _process(SLEEPER, 0, 0) as r0,
        _process(SLEEPER, 1, 0) as r1,
        _process(SLEEPER, 2, 0) as r2,
        _process(SPINNER, 3, 1) as r3,
    ):
        hog = subprocess.Popen([sys.executable, "-c", SPINNER])
        try:
            os.sched_setaffinity(hog.pid, {1})
            async with _agent(tmp_path, [r0.pid, r1.pid, r2.pid, r3.pid], port) as events:
                env = {k: v for k, v in os.environ.items() if not k.startswith("BPFDYNO_")}
                argv = bpfdyno("top", "--job-id", JOB, "--hosts", f"127.0.0.1:{port}")
                with PtyScreen(argv, 200, 50, env) as screen:
                    # -- the cluster screen: the node's row, and the job's events --------
                    text = await _wait(
                        screen,
                        r"CONFIRMED rank 3: cpu_wait_share \d+\.\d\d",
                        r"detection: 1 rank\(s\) stand out",
                        rf" confirmed {JOB} 3 {HOST} ",
                        rf" suspected {JOB} 3 {HOST} ",
                    )
                    kinds = [e.kind for e in events.held()]
                    assert kinds[:2] == [DetectionKind.SUSPECTED, DetectionKind.CONFIRMED]
                    assert {(e.rank, e.pid, e.host) for e in events.held()} == {(3, r3.pid, HOST)}
                    row = next(line for line in text.splitlines() if "CONFIRMED rank 3" in line)
                    assert row.lstrip().startswith("127.0.0.1 ")
                    assert re.search(
                        r"CONFIRMED rank 3: cpu_wait_share (\d+\.\d\d) vs job median 0\.\d\d", row
                    )
                    assert re.search(
                        rf"job {JOB} rank 3 on {HOST} CONFIRMED: cpu_wait_share \d+\.\d\d vs "
                        r"job median 0\.\d\d",
                        text,
                    )
                    lines = text.splitlines()
                    confirmed = next(
                        i for i, s in enumerate(lines) if f" confirmed {JOB} 3 {HOST} " in s
                    )
                    suspected = next(
                        i for i, s in enumerate(lines) if f" suspected {JOB} 3 {HOST} " in s
                    )
                    assert confirmed < suspected  # newest first
                    assert f" confirmed {JOB} 3 {HOST} {r3.pid} cpu_wait_share" in lines[confirmed]
                    # -- the node's full view: the Detection tab -------------------------
                    screen.type("\r")
                    await _wait(screen, r"6 Detection")
                    screen.type("6")
                    await _wait(
                        screen,
                        r"TIME\s+KIND\s+JOB\s+RANK\s+HOST\s+PID\s+EVIDENCE",
                        rf"\d\d:\d\d:\d\d\s+confirmed\s+{JOB}\s+3\s+{HOST}\s+{r3.pid}\s+"
                        r"cpu_wait_share \d+\.\d\d vs job median 0\.\d\d",
                        rf"1 rank\(s\) stand out · \d+ event\(s\) held · job {JOB}",
                        rf"job {JOB} rank 3 on {HOST} CONFIRMED: cpu_wait_share",
                    )
                    # -- the rank no longer waits: cleared, the marker goes --------------
                    # Stopped rather than left spinning alone: on a shared two-core machine
                    # a spinner pinned to a CPU waits whenever anything else runs there.
                    hog.kill()
                    hog.wait()
                    r3.send_signal(signal.SIGSTOP)
                    await _wait(
                        screen,
                        r"no rank stands out · \d+ event\(s\) held",
                        rf"\d\d:\d\d:\d\d\s+cleared\s+{JOB}\s+3\s+{HOST}\s+{r3.pid}\s+"
                        rf"job {JOB} rank 3 no longer stands out",
                    )
                    assert events.held()[-1].kind is DetectionKind.CLEARED
                    screen.type("c")  # back to the cluster screen: no marker on the row
                    text = await _wait(
                        screen, r"detection: no rank stands out", rf" cleared {JOB} 3 {HOST} "
                    )
                    assert "CONFIRMED rank 3" not in text
        finally:
            hog.kill()
            hog.wait()


LINEAR = Path(__file__).resolve().parents[1] / "tracing" / "trainers" / "linear.py"
#: Off here: BPF and hardware collectors (this tests the UI), and gloo's probes (the trainers
#: use no gloo, and compiling them would only slow the agent's start).
SERVE_SETTINGS = (
    *(f"collectors.{c}.enabled=false" for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm")),
    "collectors.irq.enabled=false",
    "collectors.detection.interval_s=0.5",
    "detection.gloo_peer_waits=false",
    "legacy_rpc.enabled=false",
    "budget.enabled=false",
)


@contextlib.contextmanager
def _serve(tmp: Path, socket_dir: str) -> Iterator[str]:
    """A real ``bpfdyno serve`` on a private socket; its socket path once it answers."""
    sock = str(tmp / "agent.sock")
    settings = [*SERVE_SETTINGS, f'kineto.socket_dir="{socket_dir}"']
    proc = subprocess.Popen(
        bpfdyno("serve", "--socket", sock, *(f"--set={s}" for s in settings)),
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(sock):
            assert proc.poll() is None, "the agent exited"
            assert time.monotonic() < deadline, "the agent did not start in 60 s"
            time.sleep(0.1)
        yield sock
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _trainer(
    tmp: Path, socket_dir: str, rank: int, cpu: int, busy_ms: float, sleep_s: float
) -> subprocess.Popen[str]:
    """A real PyTorch trainer registered with the agent, as rank ``rank`` of one job."""
    conf = tmp / "kineto.conf"
    conf.write_text("ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))},
        "KINETO_USE_DAEMON": "1",
        "KINETO_IPC_SOCKET_DIR": socket_dir,
        "KINETO_CONFIG": str(conf),
        "OMP_NUM_THREADS": "1",
        "RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29411",
    }
    argv = [sys.executable, str(LINEAR), "--seconds", "300", "--cpu", str(cpu)]
    argv += ["--busy-ms", str(busy_ms), "--step-sleep", str(sleep_s)]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)


# Three PyTorch processes start and import torch on a machine that may be loaded: more than
# the default five minutes were seen to be needed there.
@pytest.mark.timeout(600)
async def test_the_trainers_tab_marks_the_flagged_rank_s_row(tmp_path: Path) -> None:
    """A real agent with three real trainers registered as ranks of one job; rank 2 spins part
    of each step on CPU 1 beside a hog: its row says CONFIRMED, the summary says why."""
    socket_dir = tempfile.mkdtemp(prefix="bdtd", dir="/tmp")  # Kineto's names stay short
    trainers: list[subprocess.Popen[str]] = []
    hog: subprocess.Popen[bytes] | None = None
    try:
        with _serve(tmp_path, socket_dir) as sock:
            # The healthy ranks wake ten times a second (each wake-up on a loaded machine may
            # wait for a CPU); rank 2 wants its CPU most of the time, and a hog at the highest
            # priority holds that CPU.
            for rank, cpu, busy, sleep in ((0, 0, 0.0, 0.1), (1, 0, 0.0, 0.1), (2, 1, 50.0, 0.01)):
                trainers.append(_trainer(tmp_path, socket_dir, rank, cpu, busy, sleep))
            pids = []
            for t in trainers:
                assert t.stdout is not None
                line = await asyncio.to_thread(t.stdout.readline)
                assert line.startswith("ready "), line
                pids.append(int(line.split()[1]))
            hog = subprocess.Popen([sys.executable, "-c", SPINNER])
            os.sched_setaffinity(hog.pid, {1})
            os.setpriority(os.PRIO_PROCESS, hog.pid, -20)
            app = TopApp(AgentDataSource(sock), refresh_s=0.3, retry_s=(0.2, 0.5))
            async with app.run_test(size=(160, 30)) as pilot:
                await wait_until(pilot, lambda: app.state.connection.connected, 30, "connected")
                await pilot.press("3")

                def confirmed() -> bool:
                    flags = flags_by_pid(flagged(app.state.detection))
                    registered = {t.pid for t in app.state.trainers}
                    return (
                        pids[2] in flags
                        and flags[pids[2]].marker == "CONFIRMED"
                        and (set(pids) <= registered)
                    )

                await wait_until(pilot, confirmed, 120, "rank 2 confirmed, every rank listed")
                await pilot.pause(0.7)  # a refresh of the tab
                text = screen_text(app)
        row = next(line for line in text.splitlines() if line.lstrip().startswith(f"{pids[2]} "))
        assert re.search(r"\sCONFIRMED\s", row), row
        # Why, as the detection saw it: the CPU it waited for, or (when the other ranks'
        # CPU was as contended, as once in CI) its main thread busy while theirs slept.
        assert re.search(
            r"rank 2 CONFIRMED: (cpu_wait_share|main_busy_share) \d+\.\d\d vs job median "
            r"\d+\.\d\d",
            text,
        ), text
        for pid in pids[:2]:  # the others keep their trace state's word
            other = next(line for line in text.splitlines() if line.lstrip().startswith(f"{pid} "))
            assert re.search(r"\s(idle|CONFIRMED|SUSPECTED)\s", other), other
    finally:
        for t in trainers:
            t.kill()
            t.wait()
        if hog is not None:
            hog.kill()
            hog.wait()
        shutil.rmtree(socket_dir, ignore_errors=True)
