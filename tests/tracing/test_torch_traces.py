"""End to end with real PyTorch 2.13 trainers: traces land under Kineto's real names with the
request's trace id, for every kind of process that registers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from tracing_harness import (
    TRAINERS,
    Harness,
    dyno_gputrace_bytes,
    legacy_call,
    trace_json,
)

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.roles import Role
from bpfdyno.tracing.traces import ProcState

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]


def events_of(path: str) -> list[dict[str, object]]:
    data = trace_json(path)
    events = data["traceEvents"]
    assert isinstance(events, list)
    return events


def step_count(path: str) -> int:
    return sum(1 for e in events_of(path) if str(e.get("name", "")).startswith("Optimizer.step#"))


def iterations(h: Harness, name: str, n: int = 3) -> TraceSpec:
    return TraceSpec(log_file=str(h.trace_dir / name), iterations=n)


async def test_duration_trace_from_dyno_cli_bytes(harness: Harness) -> None:
    h = harness
    trainer = h.spawn_script("linear.py")
    [pid] = await trainer.wait_ready()
    await h.wait_trainers(lambda ts: [t.pid for t in ts] == [pid])
    raw = await legacy_call(h.legacy_port, dyno_gputrace_bytes(str(h.trace_dir / "dyno.json")))
    reply = orjson.loads(raw[4:])
    expected_file = str(h.trace_dir / f"dyno_{pid}.json")
    assert reply["processesMatched"] == [pid]
    assert reply["activityProfilersTriggered"] == [pid]
    assert reply["activityProfilersBusy"] == 0
    assert reply["traceFiles"] == {str(pid): expected_file}
    view = await h.wait_done(reply["traceId"], timeout=45)
    [p] = view.processes
    assert (p.state, p.output_path) == (ProcState.WRITTEN, expected_file)
    assert p.size_bytes == os.path.getsize(expected_file)
    assert trace_json(expected_file)["trace_id"] == reply["traceId"]
    ops = {e.get("pid") for e in events_of(expected_file) if e.get("cat") == "cpu_op"}
    assert ops == {pid}
    assert not os.path.exists(expected_file + ".tmp")


async def test_iteration_traces_of_two_trainers_by_slurm_job(harness: Harness) -> None:
    h = harness
    procs = [h.spawn_script("linear.py", job_id=4242) for _ in range(2)]
    other = h.spawn_script("linear.py", job_id=999)
    pids = sorted([(await p.wait_ready())[0] for p in procs])
    [other_pid] = await other.wait_ready()
    await h.wait_trainers(lambda ts: len(ts) == 3)
    assert {t.pid: t.job_id for t in h.service.list_trainers()} == {
        pids[0]: 4242,
        pids[1]: 4242,
        other_pid: 999,
    }
    res = h.service.start_trace(
        TraceRequest(job_id=4242, options=iterations(h, "t.pt.trace.json", 3))
    )
    assert res.matched == tuple(pids)
    assert [p.output_path for p in res.triggered] == [
        str(h.trace_dir / f"t_{pid}.pt.trace.json") for pid in pids
    ]
    assert [s.pid for s in res.not_matched] == [other_pid]
    view = await h.wait_done(res.trace_id, timeout=45)
    assert [p.state for p in view.processes] == [ProcState.WRITTEN] * 2
    for pid in pids:
        path = str(h.trace_dir / f"t_{pid}.pt.trace.json")
        assert trace_json(path)["trace_id"] == res.trace_id
        assert step_count(path) == 3
    assert sorted(os.listdir(h.trace_dir)) == [f"t_{pid}.pt.trace.json" for pid in pids]


async def test_busy_trainer_is_not_given_a_second_config(harness: Harness) -> None:
    h = harness
    trainer = h.spawn_script("linear.py")
    [pid] = await trainer.wait_ready()
    await h.wait_trainers(lambda ts: len(ts) == 1)
    first = h.service.start_trace(
        TraceRequest(options=TraceSpec(log_file=str(h.trace_dir / "first.json")))
    )
    assert [p.pid for p in first.triggered] == [pid]
    pending = h.service.start_trace(TraceRequest(options=iterations(h, "second.json")))
    assert (pending.triggered, [s.pid for s in pending.busy]) == ((), [pid])
    async with asyncio.timeout(30):  # the duration trace's warm-up: the profiler is busy
        while h.service.get_trace(first.trace_id).processes[0].state is not ProcState.TRACING:
            await asyncio.sleep(0.05)
    tracing = h.service.start_trace(TraceRequest(options=iterations(h, "third.json")))
    assert tracing.triggered == ()
    assert [s.reason for s in tracing.busy] == [
        f"busy: it is still working on trace {first.trace_id}"
    ]
    assert pid in h.service.tracing_pids()
    view = await h.wait_done(first.trace_id, timeout=45)
    assert view.processes[0].state is ProcState.WRITTEN
    assert trace_json(str(h.trace_dir / f"first_{pid}.json"))["trace_id"] == first.trace_id
    # Free again once its trace is over: the next request gets it.
    async with asyncio.timeout(30):
        while True:
            nxt = h.service.start_trace(TraceRequest(options=iterations(h, "fourth.json", 2)))
            if nxt.triggered:
                break
            await asyncio.sleep(0.5)
    await h.wait_done(nxt.trace_id, timeout=45)
    assert trace_json(str(h.trace_dir / f"fourth_{pid}.json"))["trace_id"] == nxt.trace_id
    assert sorted(os.listdir(h.trace_dir)) == [f"first_{pid}.json", f"fourth_{pid}.json"]


async def test_spawn_dataloader_workers_register_and_yield_to_the_trainer(
    harness: Harness,
) -> None:
    h = harness
    trainer = h.spawn_script("dataloader.py")
    [pid] = await trainer.wait_ready()
    trainers = await h.wait_trainers(lambda ts: len(ts) == 3)
    workers = [t for t in trainers if t.pid != pid]
    assert all(t.ancestors[0] == pid for t in workers)
    assert {t.pid: t.role for t in trainers} == {
        pid: Role.WORKER,
        workers[0].pid: Role.DATA_WORKER,
        workers[1].pid: Role.DATA_WORKER,
    }
    res = h.service.start_trace(
        TraceRequest(pids=(pid,), process_limit=1, options=iterations(h, "dl.json", 2))
    )
    assert res.matched == (pid, *sorted(t.pid for t in workers))
    assert [p.pid for p in res.triggered] == [pid]
    assert [s.pid for s in res.over_limit] == sorted(t.pid for t in workers)
    view = await h.wait_done(res.trace_id, timeout=45)
    assert view.processes[0].state is ProcState.WRITTEN
    assert step_count(str(h.trace_dir / f"dl_{pid}.json")) == 2
    assert os.listdir(h.trace_dir) == [f"dl_{pid}.json"]


async def test_torchrun_ranks_are_traced_not_the_agent(harness: Harness) -> None:
    h = harness
    run = h.spawn(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            str(TRAINERS / "ddp.py"),
        ]
    )
    ranks = sorted(await run.wait_ready(count=2, timeout=150))
    agent = run.pid
    trainers = await h.wait_trainers(lambda ts: len(ts) == 3)
    assert {t.pid: t.role for t in trainers} == {
        agent: Role.LAUNCHER,
        ranks[0]: Role.WORKER,
        ranks[1]: Role.WORKER,
    }
    res = h.service.start_trace(
        TraceRequest(pids=(agent,), process_limit=2, options=iterations(h, "r.pt.trace.json"))
    )
    assert res.matched == (*ranks, agent)
    assert [p.pid for p in res.triggered] == ranks
    assert [s.pid for s in res.over_limit] == [agent]
    view = await h.wait_done(res.trace_id, timeout=60)
    assert [p.state for p in view.processes] == [ProcState.WRITTEN] * 2
    for pid in ranks:
        path = str(h.trace_dir / f"r_{pid}.pt.trace.json")
        assert trace_json(path)["trace_id"] == res.trace_id
        assert step_count(path) == 3
    assert not os.path.exists(h.trace_dir / f"r_{agent}.pt.trace.json")


async def test_restarted_daemon_still_delivers_the_next_trace(harness: Harness) -> None:
    h = harness
    trainer = h.spawn_script("linear.py")
    [pid] = await trainer.wait_ready()
    await h.wait_trainers(lambda ts: len(ts) == 1)
    await h.restart()
    assert h.service.list_trainers() == []
    await h.wait_trainers(lambda ts: [t.pid for t in ts] == [pid])
    res = h.service.start_trace(TraceRequest(options=iterations(h, "after.json", 2)))
    assert [p.pid for p in res.triggered] == [pid]
    view = await h.wait_done(res.trace_id, timeout=45)
    assert view.processes[0].state is ProcState.WRITTEN
    assert trace_json(str(h.trace_dir / f"after_{pid}.json"))["trace_id"] == res.trace_id


@pytest.mark.root
def test_abstract_name_in_a_fresh_network_namespace(short_tmp: Path) -> None:
    """@dynolog@ (with its trailing NUL) in a namespace of its own; restart included."""
    helper = Path(__file__).with_name("netns_abstract_run.py")
    r = subprocess.run(
        ["unshare", "--net", sys.executable, str(helper), str(short_tmp)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["address"] == "@dynolog@"
    assert out["proc_net_unix"] == ["@dynolog@"]  # 7 characters and the trailing NUL
    assert "already bound in this network namespace" in out["second_bind"]
    assert out["endpoint"].startswith("@dynoconfigclient")
    for phase, name in (("before", "a"), ("after", "b")):
        result = out[phase]
        assert result["state"] == "written"
        assert result["path"] == str(short_tmp / f"{name}_{out['pid']}.pt.trace.json")
        assert trace_json(result["path"])["trace_id"] == result["trace_id"]
