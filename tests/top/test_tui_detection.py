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
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from pty_screen import PtyScreen, bpfdyno

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
