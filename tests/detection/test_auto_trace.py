"""The automatic trace on a confirmed straggler: the real tracing service, its registry and
its audit log; two trainers of two jobs poll; confirmations come from another thread."""

from __future__ import annotations

import asyncio
import json
import time
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


def tracing_service(
    tmp_path: Path, timeout_s: float, trace_dir: Path, ahead_s: list[float] | None = None
) -> TracingService:
    """The real tracing service over an empty /proc under ``tmp_path``, writing into
    ``trace_dir``; its clocks run ``ahead_s[0]`` seconds ahead of the real ones (read at
    every call: a test moves them on)."""
    (tmp_path / "proc").mkdir()
    ahead = ahead_s if ahead_s is not None else [0.0]
    return TracingService(
        allowed_dirs=[str(tmp_path)],
        default_timeout_s=timeout_s,
        registry=TrainerRegistry(),
        trace_dir=str(trace_dir),
        proc_root=tmp_path / "proc",
        wall=lambda: time.time() + ahead[0],
        mono=lambda: time.monotonic() + ahead[0],
    )


async def first_traced(log: EventLog) -> DetectionEvent:
    """The first ``traced`` event the log holds, once there is one."""
    while True:
        got = [e for e in log.held() if e.kind is DetectionKind.TRACED]
        if got:
            return got[0]
        await asyncio.sleep(0.05)


async def test_a_confirmed_straggler_traces_its_job_once_per_window(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    svc = tracing_service(tmp_path, 60.0, traces)
    # Job 1818's four ranks (more than a request's default limit of 3), job 999's one.
    ranks = {"1818": [10, 12, 13, 14], "999": [11]}
    for job, pids in ranks.items():
        for pid in pids:
            name = f"\0dynoconfigclient-{pid}\0".encode()
            svc.on_request(name, KinetoRequest(IDLE, int(job), (pid,)))
    log = EventLog()
    auto = AutoTrace(svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: ranks.get(job, []))
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
    assert sorted(p.pid for p in record.processes) == [10, 12, 13, 14]
    assert all(p.output_path.startswith(f"{traces}/") for p in record.processes)
    assert "ACTIVITIES_ITERATIONS=5" in record.request_json

    # Within the window the same job is not traced again; another job is.
    await confirm(event(DetectionKind.CONFIRMED, "1818", 2, 10))
    assert len(auto.started) == 1
    await confirm(event(DetectionKind.CONFIRMED, "999", 0, 11))
    assert len(auto.started) == 2
    assert [r.trace_id for r in svc.audit.records(0) if r.action == "start_trace"] == auto.started
    (status,) = auto.statuses()
    assert status.reason.endswith("2 started, 0 refused")
    await auto.stop()


async def test_a_job_with_no_trainer_here_is_audited_as_nothing_and_not_retried(
    tmp_path: Path,
) -> None:
    svc = tracing_service(tmp_path, 60.0, tmp_path)
    auto = AutoTrace(svc, 5, 3600.0, EventLog(), "node-a", job_ranks=lambda job: [])
    await auto.start()
    auto.on_events([event(DetectionKind.CONFIRMED, "5", 1, 77)])
    await asyncio.sleep(0.05)
    auto.on_events([event(DetectionKind.CONFIRMED, "5", 1, 77)])
    await asyncio.sleep(0.05)
    (record,) = [r for r in svc.audit.records(0) if r.action == "start_trace"]
    assert (record.transport, record.message) == ("in-process", "triggered 0 of 0 matched")
    assert (len(auto.started), auto.refused) == (1, 0)
    await auto.stop()


async def test_a_trace_that_wrote_no_file_posts_a_traced_event_without_a_verdict(
    tmp_path: Path,
) -> None:
    """The trainer takes its config (it polls) but never writes its file: the trace times
    out, and the event says so, naming the trace and the process's state."""
    svc = tracing_service(tmp_path, 1.0, tmp_path)
    svc.on_request(b"\0dynoconfigclient-10\0", KinetoRequest(IDLE, 1818, (10,)))
    log = EventLog()
    auto = AutoTrace(svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: [10])
    log.listeners.append(auto.on_events)
    await auto.start()
    checks = asyncio.create_task(svc.tracker.run_file_checks())  # as the tracing part runs it
    await asyncio.to_thread(log.add, [event(DetectionKind.CONFIRMED, "1818", 2, 10)])

    e = await asyncio.wait_for(first_traced(log), 30)
    (trace_id,) = auto.started
    assert (e.job_id, e.rank, e.pid, e.host, e.trace_id) == ("1818", 2, 10, "node-a", trace_id)
    assert (e.trace_files, e.verdict_text, e.verdict) == ((), "", None)
    assert e.summary.startswith(
        f"job 1818 rank 2: automatic trace {trace_id}: no file written, no verdict: "
        "no trace file yet: "
    ), e.summary
    assert log.counts() == {"confirmed": 1, "traced": 1}
    await auto.stop()
    checks.cancel()


async def test_a_timed_trace_starts_every_rank_at_one_moment(tmp_path: Path) -> None:
    """With auto_trace_seconds, a duration trace with one start time for all the job's ranks,
    far enough ahead for their next poll and Kineto's warm-up."""
    svc = tracing_service(tmp_path, 60.0, tmp_path)
    for pid in (10, 12):
        name = f"\0dynoconfigclient-{pid}\0".encode()
        svc.on_request(name, KinetoRequest(IDLE, 1818, (pid,)))
    log = EventLog()
    auto = AutoTrace(svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: [10, 12], seconds=4.0)
    await auto.start()
    before_ms = time.time() * 1000
    auto.on_events([event(DetectionKind.CONFIRMED, "1818", 2, 10)])
    await asyncio.sleep(0.05)
    (record,) = [r for r in svc.audit.records(0) if r.action == "start_trace"]
    assert sorted(p.pid for p in record.processes) == [10, 12]
    config = json.loads(record.request_json)["config"]
    assert "ACTIVITIES_DURATION_MSECS=4000" in config
    assert "ACTIVITIES_ITERATIONS" not in config
    (start,) = [int(line.split("=")[1]) for line in config.split("\n") if "START_TIME=" in line]
    # The trainers' poll interval (5 s), Kineto's warm-up (5 s) and a margin (2 s) ahead.
    assert before_ms + 12_000 <= start <= before_ms + 13_000, (start, before_ms)
    (status,) = auto.statuses()
    assert "for 4 s from a common start" in status.reason
    await auto.stop()


def test_the_automatic_trace_is_off_unless_configured() -> None:
    from bpfdyno.app import assembly
    from bpfdyno.core.config import load

    names = [c.name for c in assembly.build(load(None)).components]
    assert "detection_auto_trace" not in names
    on = assembly.build(load(None, [("detection.auto_trace", "true")])).components
    assert [c.name for c in on] == ["tracing", "detection_peers", "detection_auto_trace"]


async def test_a_job_wide_trace_names_the_peer_it_could_not_trace(tmp_path: Path) -> None:
    """The job has a rank on another node whose agent does not answer: this node's rank is
    traced (it never writes: the trace times out), and the event names the peer and why."""
    from bpfdyno.app.detection_peers import Peer

    svc = tracing_service(tmp_path, 1.0, tmp_path)
    svc.on_request(b"\0dynoconfigclient-10\0", KinetoRequest(IDLE, 1818, (10,)))
    log = EventLog()
    nobody = Peer("127.0.0.1:9", "node-b", "1818")  # the discard port: nothing listens
    auto = AutoTrace(
        svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: [10],
        job_peers=lambda job: [(nobody, 2)] if job == "1818" else [],
    )  # fmt: skip
    log.listeners.append(auto.on_events)
    await auto.start()
    checks = asyncio.create_task(svc.tracker.run_file_checks())
    await asyncio.to_thread(log.add, [event(DetectionKind.CONFIRMED, "1818", 2, 10)])

    e = await asyncio.wait_for(first_traced(log), 60)
    (trace_id,) = auto.started
    assert (e.rank, e.trace_id, e.trace_files, e.verdict) == (2, trace_id, (), None)
    head = f"job 1818 rank 2: automatic trace {trace_id} of 0 rank(s) on 0 node(s) (not traced: "
    assert e.summary.startswith(head + "node-b: "), e.summary
    assert e.summary.endswith("): no file written, no verdict"), e.summary
    await auto.stop()
    checks.cancel()


def start_times_ms(svc: TracingService) -> list[int]:
    """PROFILE_START_TIME of every trace the service started, in order."""
    out = []
    for r in svc.audit.records(0):
        if r.action == "start_trace":
            config = json.loads(r.request_json)["config"]
            out += [int(line.split("=")[1]) for line in config.split("\n") if "START_TIME=" in line]
    return out


async def test_a_timed_trace_whose_ranks_dropped_the_config_is_started_again_once(
    tmp_path: Path,
) -> None:
    """Both ranks take the timed config and never start (their Kineto dropped it): the job is
    traced again with a new start, once, on the same processes (one of them no longer among
    the detection's ranks); the event names the first try and who dropped it. The second try
    is dropped too, and there is no third."""
    shift = [0.0]  # the agent's wall clock runs ahead of the real one by this many seconds
    svc = tracing_service(tmp_path, 120.0, tmp_path, shift)
    names = {pid: f"\0dynoconfigclient-{pid}\0".encode() for pid in (10, 12)}

    def poll_all(times: int) -> None:
        for _ in range(times):
            for pid, name in names.items():
                svc.on_request(name, KinetoRequest(IDLE, 1818, (pid,)))

    poll_all(1)
    log = EventLog()
    ranks = [10, 12]  # the detection's latest round
    auto = AutoTrace(
        svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: ranks, seconds=4.0,
        wall=lambda: time.time() + shift[0],
    )  # fmt: skip
    log.listeners.append(auto.on_events)
    await auto.start()
    await asyncio.to_thread(log.add, [event(DetectionKind.CONFIRMED, "1818", 2, 10)])
    await asyncio.sleep(0.05)
    (first,) = auto.started
    ranks.remove(12)  # say, a round that missed it while it was stopped
    poll_all(1)  # each takes its config
    assert {p.state.value for p in svc.get_trace(first).processes} == {"delivered"}
    shift[0] += 20.0  # past the start: idle polls now mean Kineto never started
    poll_all(4)
    view = svc.get_trace(first)
    assert [(p.state.value, p.config_dropped) for p in view.processes] == [("failed", True)] * 2

    async def tries(n: int) -> None:
        while len(auto.started) < n:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(tries(2), 10)  # the ranks are idle: no wait for them
    second = auto.started[1]
    assert second != first
    one, two = start_times_ms(svc)
    records = [r for r in svc.audit.records(0) if r.action == "start_trace"]
    assert [sorted(p.pid for p in r.processes) for r in records] == [[10, 12], [10, 12]]
    # A new start, planned when the second try began: 12-13 s ahead of the agent's clock,
    # which has moved on by the 20 s the first try's ranks were idle past its start.
    now_ms = (time.time() + shift[0]) * 1000
    assert now_ms + 11_000 <= two <= now_ms + 13_000, (two, now_ms)
    assert two - one >= 20_000, (one, two)
    poll_all(1)
    shift[0] += 20.0
    poll_all(4)

    e = await asyncio.wait_for(first_traced(log), 10)
    assert (e.trace_id, e.trace_files, e.verdict) == (second, (), None)
    assert e.summary.startswith(
        f"job 1818 rank 2: automatic trace {second} (try 2; trace {first}: config dropped by "
        "pid 10, pid 12): no file written, no verdict: "
    ), e.summary
    assert "never started tracing" in e.summary, e.summary
    await asyncio.sleep(0.2)
    assert (len(auto.started), auto.refused, log.counts()) == (2, 0, {"confirmed": 1, "traced": 1})
    await auto.stop()


async def test_a_timed_trace_that_timed_out_is_not_tried_again(tmp_path: Path) -> None:
    """Only a dropped config is tried again: a rank that took it and never wrote a file
    (the trace timed out) is reported as it is."""
    shift = [0.0]  # the agent's clocks run ahead of the real ones by this many seconds
    svc = tracing_service(tmp_path, 1.0, tmp_path, shift)
    name = b"\0dynoconfigclient-10\0"
    svc.on_request(name, KinetoRequest(IDLE, 1818, (10,)))
    log = EventLog()
    auto = AutoTrace(
        svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: [10], seconds=4.0,
        wall=lambda: time.time() + shift[0],
    )  # fmt: skip
    log.listeners.append(auto.on_events)
    await auto.start()
    checks = asyncio.create_task(svc.tracker.run_file_checks())
    await asyncio.to_thread(log.add, [event(DetectionKind.CONFIRMED, "1818", 2, 10)])
    await asyncio.sleep(0.05)
    svc.on_request(name, KinetoRequest(IDLE, 1818, (10,)))  # takes it, then nothing
    shift[0] += 60.0  # past the start, the 4 s and the timeout

    e = await asyncio.wait_for(first_traced(log), 30)
    (trace_id,) = auto.started
    (p,) = svc.get_trace(trace_id).processes
    assert (p.state.value, p.config_dropped) == ("timed_out", False)
    assert e.summary.startswith(f"job 1818 rank 2: automatic trace {trace_id}: no file"), e.summary
    await asyncio.sleep(0.2)
    assert len(auto.started) == 1
    await auto.stop()
    checks.cancel()


async def test_a_job_wide_timed_trace_is_tried_again_on_every_node(tmp_path: Path) -> None:
    """The job has a rank on another node (its agent does not answer); this node's rank
    dropped the timed config: the whole job is traced again, the peer asked again, and the
    event names both the first try and the peer."""
    from bpfdyno.app.detection_peers import Peer

    shift = [0.0]
    svc = tracing_service(tmp_path, 120.0, tmp_path, shift)
    name = b"\0dynoconfigclient-10\0"
    svc.on_request(name, KinetoRequest(IDLE, 1818, (10,)))
    log = EventLog()
    nobody = Peer("127.0.0.1:9", "node-b", "1818")  # the discard port: nothing listens
    auto = AutoTrace(
        svc, 5, 3600.0, log, "node-a", job_ranks=lambda job: [10], seconds=4.0,
        job_peers=lambda job: [(nobody, 2)] if job == "1818" else [],
        wall=lambda: time.time() + shift[0],
    )  # fmt: skip
    log.listeners.append(auto.on_events)
    await auto.start()
    await asyncio.to_thread(log.add, [event(DetectionKind.CONFIRMED, "1818", 2, 10)])

    async def dropped_try(n: int) -> str:
        while len(auto.started) < n:
            await asyncio.sleep(0.02)
        svc.on_request(name, KinetoRequest(IDLE, 1818, (10,)))  # takes its config
        shift[0] += 20.0
        for _ in range(4):
            svc.on_request(name, KinetoRequest(IDLE, 1818, (10,)))
        return auto.started[n - 1]

    first = await asyncio.wait_for(dropped_try(1), 10)
    second = await asyncio.wait_for(dropped_try(2), 30)
    e = await asyncio.wait_for(first_traced(log), 30)
    assert (e.trace_id, e.trace_files, e.verdict) == (second, (), None)
    head = (
        f"job 1818 rank 2: automatic trace {second} (try 2; trace {first}: config dropped by "
        "pid 10) of 0 rank(s) on 0 node(s) (not traced: node-b: "
    )
    assert e.summary.startswith(head), e.summary
    assert e.summary.endswith("): no file written, no verdict"), e.summary
    assert len(auto.started) == 2
    await auto.stop()
