"""Kernel tracks over the Tracing gRPC service and the CLI: the request's tracks, the
per-process status, GetTraceSummary and ``bpfdyno trace-summary --trace-id``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from tracing_harness import Harness, KinetoClient, behave_like_kineto, grpc_api, run_cli

from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.server.tracing import servicer_factory


@pytest.fixture
async def api(harness: Harness) -> AsyncIterator[tuple[Harness, str, pb_grpc.TracingStub]]:
    path = str(harness.base / "grpc.sock")
    # Behind the agent's front socket, as `bpfdyno serve` serves it: calls are attributed.
    async with grpc_api(path, servicer_factory(harness.service)):
        channel = grpc.aio.insecure_channel(f"unix:{path}")
        try:
            yield harness, path, pb_grpc.TracingStub(channel)
        finally:
            await channel.close()


async def test_bad_tracks_are_refused_with_the_rule(
    api: tuple[Harness, str, pb_grpc.TracingStub],
) -> None:
    _, _, stub = api
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.StartTrace(pb.StartTraceRequest(log_file="/tmp/x.json", kernel_tracks="disk"))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown kernel track(s) 'disk'" in str(e.value.details())
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.GetTraceSummary(pb.GetTraceRequest(trace_id="nope"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


async def test_tracks_status_and_summary_of_a_trace(
    api: tuple[Harness, str, pb_grpc.TracingStub],
) -> None:
    h, sock, stub = api
    client = KinetoClient(str(h.socket_dir))
    stop = asyncio.Event()
    trace_file = h.trace_dir / "k_9300.json"
    task = asyncio.create_task(behave_like_kineto(client, [9300], 0, trace_file, stop))
    try:
        await h.wait_trainers(lambda ts: len(ts) == 1)
        rc, out, err = await run_cli(
            "gputrace",
            "--socket",
            sock,
            "--log-file",
            str(h.trace_dir / "k.json"),
            "--iterations",
            "2",
            "--kernel-tracks",
            "sched,net",
            "--pre-window-s",
            "2",
            "--wait",
            "--timeout",
            "30",
        )
        assert rc == 0, out + err
        trace_id = out.split()[1].rstrip(":")
        status = await stub.GetTrace(pb.GetTraceRequest(trace_id=trace_id))
        [p] = status.processes
        assert list(p.kernel_tracks.requested) == ["net", "sched"]
        # This harness has no capture: the file is Kineto's and the status says why.
        assert p.kernel_tracks.state == "not merged"
        assert "kernel tracks are disabled" in p.kernel_tracks.reason
        assert "kernel tracks net,sched not merged: kernel tracks are disabled" in out
        summary = await stub.GetTraceSummary(pb.GetTraceRequest(trace_id=trace_id))
        [s] = summary.processes
        assert (s.pid, s.path, s.error, s.trace_id) == (9300, p.output_path, "", trace_id)
        rc, out, err = await run_cli(
            "trace-summary", "--socket", sock, "--trace-id", trace_id, "--json"
        )
        assert rc == 0, err
        [row] = json.loads(out)["processes"]
        assert (row["pid"], row["rank"], row["net_sent_bytes"], row["error"]) == (9300, -1, 0, "")
    finally:
        stop.set()
        await task
        client.close()


async def test_trace_summary_needs_files_or_an_id() -> None:
    rc, _, err = await run_cli("trace-summary")
    assert rc == 2 and "give trace files, or --trace-id" in err
