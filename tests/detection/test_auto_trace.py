"""The automatic trace on a confirmed straggler: the real tracing service, its registry and
its audit log; two trainers of two jobs poll; confirmations come from another thread."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bpfdyno.app.detection_trace import AutoTrace
from bpfdyno.detection.events import EventLog
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.trainers import TrainerRegistry

IDLE = 3  # a poll's config type: the profiler can take a config


def event(kind: DetectionKind, job: str, rank: int, pid: int) -> DetectionEvent:
    return DetectionEvent(kind, job, rank, pid, "node-a", 1.7e9, f"job {job} rank {rank}")


async def test_a_confirmed_straggler_traces_its_job_once_per_window(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    traces = tmp_path / "traces"
    traces.mkdir()
    svc = TracingService(
        allowed_dirs=[str(tmp_path)],
        default_timeout_s=60.0,
        registry=TrainerRegistry(),
        trace_dir=str(traces),
        proc_root=tmp_path / "proc",
    )
    svc.on_request(b"\0dynoconfigclient-10\0", KinetoRequest(IDLE, 1818, (10,)))
    svc.on_request(b"\0dynoconfigclient-11\0", KinetoRequest(IDLE, 999, (11,)))
    log = EventLog()
    auto = AutoTrace(svc, iterations=5, every_s=3600.0)
    log.listeners.append(auto.on_events)
    await auto.start()

    async def confirm(*events: DetectionEvent) -> None:
        await asyncio.to_thread(log.add, events)  # from the collector's thread
        await asyncio.sleep(0.05)  # the trace starts on the loop

    await confirm(
        event(DetectionKind.SUSPECTED, "999", 0, 11), event(DetectionKind.CONFIRMED, "1818", 2, 10)
    )
    assert len(auto.started) == 1
    (record,) = [r for r in svc.audit.records(0) if r.action == "start_trace"]
    assert (record.transport, record.decision, record.trace_id) == (
        "in-process",
        "accepted",
        auto.started[0],
    )
    (process,) = record.processes
    assert process.pid == 10
    assert process.output_path.startswith(f"{traces}/")
    assert "ACTIVITIES_ITERATIONS=5" in record.request_json

    # Within the window the same job is not traced again; another job is.
    await confirm(event(DetectionKind.CONFIRMED, "1818", 2, 10))
    assert len(auto.started) == 1
    await confirm(event(DetectionKind.CONFIRMED, "999", 0, 11))
    assert len(auto.started) == 2
    assert [r.trace_id for r in svc.audit.records(0) if r.action == "start_trace"] == auto.started
    (status,) = auto.statuses()
    assert status.reason.endswith("2 started, 0 refused")


async def test_a_job_with_no_trainer_here_is_audited_as_nothing_and_not_retried(
    tmp_path: Path,
) -> None:
    (tmp_path / "proc").mkdir()
    svc = TracingService(
        allowed_dirs=[str(tmp_path)],
        default_timeout_s=60.0,
        registry=TrainerRegistry(),
        trace_dir=str(tmp_path),
        proc_root=tmp_path / "proc",
    )
    auto = AutoTrace(svc, iterations=5, every_s=3600.0)
    await auto.start()
    auto.on_events([event(DetectionKind.CONFIRMED, "5", 1, 77)])
    await asyncio.sleep(0.05)
    auto.on_events([event(DetectionKind.CONFIRMED, "5", 1, 77)])
    await asyncio.sleep(0.05)
    (record,) = [r for r in svc.audit.records(0) if r.action == "start_trace"]
    assert (record.transport, record.message) == ("in-process", "triggered 0 of 0 matched")
    assert (len(auto.started), auto.refused) == (1, 0)


def test_the_automatic_trace_is_off_unless_configured() -> None:
    from bpfdyno.app import assembly
    from bpfdyno.core.config import load

    names = [c.name for c in assembly.build(load(None)).components]
    assert "detection_auto_trace" not in names
    on = assembly.build(load(None, [("detection.auto_trace", "true")])).components
    assert [c.name for c in on] == ["tracing", "detection_peers", "detection_auto_trace"]
