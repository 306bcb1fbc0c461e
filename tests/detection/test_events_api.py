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

from bpfdyno.analysis.verdict import verdict_text
from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon
from bpfdyno.cli.main import main
from bpfdyno.client.agent import AgentClient
from bpfdyno.core.config import load
from bpfdyno.detection.collector import DetectionCollector, DetectionSettings
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.diagnosis import CauseTime, Finding, Verdict
from bpfdyno.server.detection import detection_servicer_factory
from bpfdyno.server.grpc_server import GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.services.detection import DetectionService
from bpfdyno.tracing.capture.causes import syscall_name

#: Says "r" once its start-up is over (seconds on a loaded machine), then waits in a read.
WAITING = (
    "import os, socket\na, b = socket.socketpair()\nos.write(1, b'r')\nos.read(a.fileno(), 1)\n"
)


def _in_read(pid: int) -> bool:
    """Whether the process's main thread sleeps in read(2) on its socket."""
    try:
        number = int(Path(f"/proc/{pid}/syscall").read_text().split()[0])
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, ValueError, IndexError):
        return False
    return state == "S" and syscall_name(number) == "read"


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
        for p in procs:  # past their start-up reads
            assert p.stdout is not None and p.stdout.read(1) == b"r"
        # ... and each asleep in its socket read (a loaded machine may take seconds to start
        # Python: a fixed pause stopped one before its read).
        deadline = time.monotonic() + 60
        while not all(_in_read(p.pid) for p in procs):
            assert time.monotonic() < deadline, "the rank processes never reached their read"
            time.sleep(0.05)
        yield procs
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[str, Daemon, list[int], EventLog]]:
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
            yield sock, daemon, pids, log
        finally:
            await server.stop()
            await daemon.stop()


async def test_a_hang_reaches_watchers_the_cli_the_log_and_the_metrics(
    agent: tuple[str, Daemon, list[int], EventLog],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    sock, daemon, pids, _ = agent
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
    agent: tuple[str, Daemon, list[int], EventLog], capsys: pytest.CaptureFixture[str]
) -> None:
    sock, _, _, _ = agent
    status = await asyncio.to_thread(main, ["events", "--socket", sock, "--job-id", "9" * 300])
    err = capsys.readouterr().err
    assert status == 2
    assert "a job id of 300 characters: give at most 256" in err


async def test_a_traced_verdict_reaches_clients_with_its_structured_fields(
    agent: tuple[str, Daemon, list[int], EventLog], capsys: pytest.CaptureFixture[str]
) -> None:
    """The automatic trace's event (as `AutoTrace` posts it) through gRPC and `bpfdyno
    events`: the verdict's rank, kind, share and causes as fields, its text under the line."""
    sock, _, _, log = agent
    finding = Finding(
        2, "node-a", 4242, "late", 3.26, 0.24,
        (CauseTime("cpu_wait", 3.26, "the CPU was held by stress-hog (pid 9) 51%"),),
        summary="rank 2 on node-a held the job back",
    )  # fmt: skip
    verdict = Verdict("rank 2 on node-a held the job back", (finding,), within_noise=False)
    traced = DetectionEvent(
        DetectionKind.TRACED, "7", 2, 4242, "node-a", 1.7e9,
        "job 7 rank 2: automatic trace 00ab of 2 rank(s) on this node: verdict: rank 2 ...",
        trace_id="00ab", trace_files=("/t/a_1.json", "/t/a_2.json"),
        verdict_text=verdict_text(verdict), verdict=verdict,
    )  # fmt: skip
    await asyncio.to_thread(log.add, [traced])
    async with AgentClient(sock) as client:
        assert await client.detection_events("7") == [traced]
    assert await asyncio.to_thread(main, ["events", "--socket", sock, "--json"]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    as_json = orjson.loads(line)
    assert (as_json["kind"], as_json["trace_id"], as_json["trace_files"]) == (
        "DETECTION_KIND_TRACED",
        "00ab",
        ["/t/a_1.json", "/t/a_2.json"],
    )
    (straggler,) = as_json["verdict"]["stragglers"]
    assert (straggler["rank"], straggler["kind"], straggler["share"]) == (2, "late", 0.24)
    assert straggler["causes"][0]["cause"] == "cpu_wait"
    assert await asyncio.to_thread(main, ["events", "--socket", sock]) == 0
    text = capsys.readouterr().out
    assert "node-a TRACED: job 7 rank 2: automatic trace 00ab" in text
    assert "    verdict: rank 2 on node-a held the job back\n" in text
    assert (
        "      waiting for a CPU     3.26 s  the CPU was held by stress-hog (pid 9) 51%\n" in text
    )
    assert "    file: /t/a_2.json" in text
