"""Detection events through the whole agent path: a real daemon runs the detection collector
over real rank processes, one of them stopped; its event reaches a gRPC watcher, `bpfdyno
events` (text and --json), the log and the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon
from bpfdyno.cli.main import main
from bpfdyno.client.agent import AgentClient
from bpfdyno.core.config import load
from bpfdyno.detection.collector import DetectionCollector, DetectionSettings
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.server.detection import detection_servicer_factory
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.services.detection import DetectionService

#: Says "r" once its start-up is over (seconds on a loaded machine), then waits in a read.
WAITING = (
    "import os, socket\na, b = socket.socketpair()\nos.write(1, b'r')\nos.read(a.fileno(), 1)\n"
)


@contextlib.contextmanager
def ranks(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WAITING],
            env={**os.environ, "RANK": str(r)},
            stdout=subprocess.PIPE,
        )
        for r in range(n)
    ]
    try:
        for p in procs:  # past their start-up reads, and into their last read
            assert p.stdout is not None and p.stdout.read(1) == b"r"
            deadline = time.monotonic() + 10
            while Path(f"/proc/{p.pid}/stat").read_text().rpartition(")")[2][1] != "S":
                assert time.monotonic() < deadline, f"process {p.pid} never went to sleep"
                time.sleep(0.01)
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[str, Daemon, list[int]]]:
    sock = str(tmp_path / "agent.sock")
    cfg = load(
        None,
        [("collectors.detection.interval_s", "0.25"), ("grpc.socket", f'"{sock}"')],
    )
    log = EventLog()
    with ranks(3) as procs:
        pids = [p.pid for p in procs]
        collector = DetectionCollector(
            lambda: [RankProcess(pid, "7") for pid in pids],
            log,
            "node-a",
            DetectionSettings.of(3.0, 6, 2, 3, 1, hang_after_s=1.0),
        )
        daemon = Daemon(cfg, [collector], catalog=CATALOG)
        server = GrpcServer(
            cfg.grpc,
            AgentService(daemon, CATALOG),
            [detection_servicer_factory(DetectionService(log))],
        )
        await server.start()
        await daemon.start()
        try:
            yield sock, daemon, pids
        finally:
            await server.stop()
            await daemon.stop()


async def test_a_hang_reaches_watchers_the_cli_the_log_and_the_metrics(
    agent: tuple[str, Daemon, list[int]],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sock, daemon, pids = agent
    caplog.set_level(logging.WARNING, logger="bpfdyno.detection")
    async with AgentClient(sock) as client:
        assert await client.detection_events() == []
        watcher = client.watch_detection_events("7")
        os.kill(pids[1], signal.SIGSTOP)
        first: DetectionEvent = await asyncio.wait_for(anext(aiter(watcher)), timeout=15)
        assert (first.kind, first.job_id, first.rank, first.pid, first.host) == (
            DetectionKind.HANG,
            "7",
            1,
            pids[1],
            "node-a",
        )
        assert first.hang_state == "stopped"
        assert first.threads[0].state == "T"
        assert await client.detection_events("7") == [first]
        assert await client.detection_events("8") == []

    assert await asyncio.to_thread(main, ["events", "--socket", sock, "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    as_json = orjson.loads(line)
    assert (as_json["kind"], as_json["rank"], as_json["hang_state"]) == (
        "DETECTION_KIND_HANG",
        1,
        "stopped",
    )
    assert await asyncio.to_thread(main, ["events", "--socket", sock]) == 0
    text = capsys.readouterr().out
    assert "node-a HANG: job 7 hangs: rank 1 is stopped (main thread T" in text
    assert f"tid {pids[1]} python T read on a socket" in text

    assert [r.getMessage() for r in caplog.records if "hangs" in r.getMessage()] == [
        f"detection: {first.summary} (host node-a, pid {pids[1]})"
    ]
    values = {
        (v.spec.name, v.labels): v.points[-1].value
        for v in daemon.store.latest(["job_hang", "detection_events_total", "straggler_*"])
    }
    assert values[("job_hang", (("job_id", "7"),))] == 1.0
    assert values[("detection_events_total", (("kind", "hang"),))] == 1.0
    assert values[("detection_events_total", (("kind", "suspected"),))] == 0.0
    assert values[("straggler_suspected", (("job_id", "7"), ("rank", "1")))] == 0.0


async def test_a_job_id_too_long_is_refused_with_what_to_do(
    agent: tuple[str, Daemon, list[int]], capsys: pytest.CaptureFixture[str]
) -> None:
    sock, _, _ = agent
    status = await asyncio.to_thread(main, ["events", "--socket", sock, "--job-id", "9" * 300])
    err = capsys.readouterr().err
    assert status == 2
    assert "a job id of 300 characters: give at most 256" in err
