"""The Tracing gRPC service (a real server on a Unix socket) and the CLI commands on top."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import orjson
import pytest
from tracing_harness import (
    Harness,
    KinetoClient,
    behave_like_kineto,
    frame,
    grpc_api,
    legacy_call,
    run_cli,
    unframe,
)

from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.server.tracing import servicer_factory


@dataclass
class Api:
    harness: Harness
    socket: str
    stub: pb_grpc.TracingStub


@pytest.fixture
async def api(harness: Harness) -> AsyncIterator[Api]:
    path = str(harness.base / "grpc.sock")
    async with grpc_api(path, servicer_factory(harness.service)):
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            yield Api(harness, path, pb_grpc.TracingStub(channel))
        finally:
            await channel.close()


async def test_grpc_start_watch_and_errors(api: Api) -> None:
    h = api.harness
    client = KinetoClient(str(h.socket_dir))
    stop = asyncio.Event()
    out = h.trace_dir / "g_9100.pt.trace.json"
    task = asyncio.create_task(behave_like_kineto(client, [9100, 9000], 12, out, stop))
    try:
        await h.wait_trainers(lambda ts: len(ts) == 1)
        listed = await api.stub.ListTrainers(pb.ListTrainersRequest(job_id=12))
        assert [(t.pid, list(t.ancestors), t.job_id, t.role) for t in listed.trainers] == [
            (9100, [9000], 12, pb.TRAINER_ROLE_WORKER)
        ]
        assert (await api.stub.ListTrainers(pb.ListTrainersRequest(job_id=13))).trainers == []
        resp = await api.stub.StartTrace(
            pb.StartTraceRequest(
                job_id=12, log_file=str(h.trace_dir / "g.pt.trace.json"), iterations=4
            )
        )
        assert [(p.pid, p.output_path) for p in resp.triggered] == [(9100, str(out))]
        assert "ACTIVITIES_ITERATIONS=4" in resp.config_text.splitlines()
        states = []
        async for status in api.stub.WatchTrace(pb.GetTraceRequest(trace_id=resp.trace_id)):
            states.append(status.processes[0].state)
        assert states[0] == pb.PROCESS_TRACE_STATE_PENDING
        assert states[-1] == pb.PROCESS_TRACE_STATE_WRITTEN
        assert pb.PROCESS_TRACE_STATE_TRACING in states
        final = await api.stub.GetTrace(pb.GetTraceRequest(trace_id=resp.trace_id))
        assert final.done and final.processes[0].size_bytes == len('{"traceEvents": []}')

        with pytest.raises(grpc.aio.AioRpcError) as info:
            await api.stub.StartTrace(pb.StartTraceRequest(log_file="/etc/x.json"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "outside_allowed_dirs" in (info.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await api.stub.GetTrace(pb.GetTraceRequest(trace_id="0000"))
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
        dcgm = await api.stub.DcgmPause(pb.DcgmPauseRequest(duration_s=10))
        assert not dcgm.status and "no GPU monitor" in dcgm.reason
        h.service.unavailable_reason = "the Kineto IPC endpoint is not running: test"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await api.stub.StartTrace(pb.StartTraceRequest(log_file=str(h.trace_dir / "u.json")))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stop.set()
        await task
        client.close()


async def test_cli_gputrace_wait_reports_real_files(api: Api) -> None:
    h = api.harness
    clients = [KinetoClient(str(h.socket_dir)) for _ in range(2)]
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            behave_like_kineto(c, [9200 + i, 9000], 0, h.trace_dir / f"c_{9200 + i}.json", stop)
        )
        for i, c in enumerate(clients)
    ]
    try:
        await h.wait_trainers(lambda ts: len(ts) == 2)
        rc, out, _ = await run_cli("trainers", "--host", api.socket)
        assert rc == 0
        assert [line.split()[:4] for line in out.splitlines()[1:]] == [
            ["9200", "-", "0", "idle"],  # no pid namespace of its own: no second pid
            ["9201", "-", "0", "idle"],
        ]
        rc, out, err = await run_cli(
            "gputrace",
            "--host",
            api.socket,
            "--log-file",
            str(h.trace_dir / "c.json"),
            "--iterations",
            "2",
            "--process-limit",
            "1",
            "--wait",
            "--timeout",
            "30",
        )
        assert rc == 0, out + err
        assert f"pid     9200 (job 0): {h.trace_dir}/c_9200.json" in out
        assert "c_9201" not in out.split("Not traced:")[0]  # only the triggered file is promised
        assert "pid     9201 (job 0): over the process limit of 1" in out
        final = out.split("trace ")[-1].splitlines()
        assert final[0].endswith(": done")
        assert final[1].split() == [
            "pid",
            "9200",
            "written",
            "19",
            "bytes",
            f"{h.trace_dir}/c_9200.json",
        ]
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        for c in clients:
            c.close()


async def test_cli_json_writes_64_bit_integers_as_numbers(api: Api) -> None:
    h = api.harness
    client = KinetoClient(str(h.socket_dir))
    stop = asyncio.Event()
    out_file = h.trace_dir / "j_9400.json"
    task = asyncio.create_task(behave_like_kineto(client, [9400, 9000], 77, out_file, stop))
    try:
        await h.wait_trainers(lambda ts: len(ts) == 1)
        rc, out, err = await run_cli("trainers", "--host", api.socket, "--json")
        assert rc == 0, err
        (trainer,) = orjson.loads(out)["trainers"]
        assert trainer["job_id"] == 77 and type(trainer["job_id"]) is int  # int64
        assert type(trainer["polls"]) is int  # uint64
        rc, out, err = await run_cli(
            "gputrace",
            "--host",
            api.socket,
            "--job-id",
            "77",
            "--log-file",
            str(h.trace_dir / "j.json"),
            "--iterations",
            "2",
            "--wait",
            "--timeout",
            "30",
            "--json",
        )
        assert rc == 0, out + err
        obj = orjson.loads(out)  # nothing but the JSON document, even while waiting
        (triggered,) = obj["request"]["triggered"]
        assert triggered == {"pid": 9400, "job_id": 77, "output_path": str(out_file)}
        (proc,) = obj["trace"]["processes"]
        assert proc["size_bytes"] == len('{"traceEvents": []}') and type(proc["size_bytes"]) is int
        assert proc["job_id"] == 77 and proc["state"] == "PROCESS_TRACE_STATE_WRITTEN"
    finally:
        stop.set()
        await task
        client.close()


async def test_cli_explains_no_match_and_failures(api: Api) -> None:
    h = api.harness
    client = KinetoClient(str(h.socket_dir))
    stop = asyncio.Event()
    task = asyncio.create_task(behave_like_kineto(client, [9300, 9000], 4242, None, stop))
    try:
        await h.wait_trainers(lambda ts: len(ts) == 1)
        log_file = str(h.trace_dir / "n.json")
        rc, out, _ = await run_cli("gputrace", "--host", api.socket, "--log-file", log_file)
        assert rc == 0
        assert "No processes were matched." in out
        assert (
            "pid     9300 (job 4242): its job id is 4242, the request asked for job 0; "
            "pass --job-id 4242 to trace it" in out
        )
        rc, _, _ = await run_cli(
            "gputrace", "--host", api.socket, "--log-file", log_file, "--fail-on-no-process"
        )
        assert rc == 1
        rc, _, err = await run_cli("gputrace", "--host", api.socket, "--log-file", "rel.json")
        assert rc == 2 and "not_absolute" in err
        rc, _, err = await run_cli(
            "gputrace", "--host", api.socket, "--log-file", log_file, "--pids", "1,x"
        )
        assert rc == 2 and "--pids" in err
        # A duration trace the process never starts (it stays idle): --wait reports the failure.
        rc, out, _ = await run_cli(
            "gputrace",
            "--host",
            api.socket,
            "--log-file",
            log_file,
            "--job-id",
            "4242",
            "--wait",
            "--timeout",
            "30",
        )
        assert rc == 1
        assert "failed" in out and "never started tracing" in out
        rc, out, _ = await run_cli("dcgm-pause", "--host", api.socket, "--duration-s", "5")
        assert rc == 1 and out.startswith("status: false (no GPU monitor")
    finally:
        stop.set()
        await task
        client.close()


async def test_cli_without_agent_says_what_to_do(short_tmp: Path) -> None:
    rc, _, err = await run_cli("trainers", "--host", str(short_tmp / "none.sock"))
    assert rc == 1
    assert "cannot reach the agent" in err and "bpfdyno serve" in err


async def test_pause_duration_rule_is_the_same_on_every_entry_point(api: Api) -> None:
    """The CLI, gRPC and the legacy RPC refuse a 0 s pause with the one rule's words."""
    h = api.harness
    words = "the pause duration must be a positive number of seconds up to 604800"
    rc, _, err = await run_cli("dcgm-pause", "--host", api.socket, "--duration-s", "0")
    assert rc == 2 and words in err
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await api.stub.DcgmPause(pb.DcgmPauseRequest(duration_s=0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in str(info.value.details())
    reply = unframe(
        await legacy_call(h.legacy_port, frame({"fn": "dcgmProfPause", "duration_s": 0}))
    )
    assert reply["status"] == "failed" and words in str(reply["error"])


async def test_a_job_id_where_no_scheduler_answers_means_this_nodes_agent(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dyno's `gputrace --job-id 1234` means the trainers of job 1234 on this node. Where
    SLURM's client is installed but no controller answers (here: real squeue with a
    configuration whose controller does not resolve), or SLURM is absent, the command says so
    in one line and traces this node's trainers of the job instead of exiting 2."""
    h = api.harness
    monkeypatch.delenv("BPFDYNO_TARGET", raising=False)
    # This node's agent is the test's (the default socket belongs to the machine).
    monkeypatch.setattr("bpfdyno.client.connection.DEFAULT_SOCKET", api.socket)
    conf = tmp_path / "slurm.conf"
    conf.write_text(
        "ClusterName=nowhere\nSlurmctldHost=no-controller.invalid\n"
        "NodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n"
    )
    monkeypatch.setenv("SLURM_CONF", str(conf))
    client = KinetoClient(str(h.socket_dir))
    stop = asyncio.Event()
    out_file = h.trace_dir / "s_9500.json"
    task = asyncio.create_task(behave_like_kineto(client, [9500, 9000], 1234, out_file, stop))
    try:
        await h.wait_trainers(lambda ts: len(ts) == 1)
        log_file = str(h.trace_dir / "s.json")
        argv = ("gputrace", "--job-id", "1234", "--iterations", "2", "--log-file", log_file,
                "--wait", "--timeout", "30")  # fmt: skip
        rc, out, err = await run_cli(*argv)
        assert rc == 0, out + err
        note, *rest = err.splitlines()
        assert rest == [], err  # one line, not SLURM's errors
        assert note.startswith("bpfdyno gputrace: no scheduler answers here (squeue failed: ")
        assert note.endswith(
            "): job 1234 on this node's agent only; for every node of the job run it where "
            "SLURM answers, or name the nodes with --hosts h1,h2"
        )
        assert f"pid     9500 (job 1234): {out_file}" in out
        assert out_file.exists()
        # No SLURM at all: the same meaning, with that reason.
        monkeypatch.setenv("PATH", str(tmp_path))
        rc, out, err = await run_cli(*argv[:-3], "--log-file", str(h.trace_dir / "t.json"))
        assert rc == 0, out + err
        assert err == (
            "bpfdyno gputrace: no scheduler answers here (SLURM's squeue is not installed): job "
            "1234 on this node's agent only; for every node of the job run it where SLURM "
            "answers, or name the nodes with --hosts h1,h2\n"
        )
        # An array task has no meaning without SLURM: still an error, exit 2.
        rc, _, err = await run_cli("gputrace", "--job-id", "1234_5", "--log-file", log_file)
        assert rc == 2 and "squeue is not installed" in err
    finally:
        stop.set()
        await task
        client.close()
