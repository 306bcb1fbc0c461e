"""The legacy dyno JSON RPC over real TCP: dyno's exact bytes, dynolog's replies, bad frames."""

from __future__ import annotations

import asyncio
import random
import socket
import struct
from pathlib import Path

import orjson
import pytest
from tracing_harness import (
    Harness,
    KinetoClient,
    dyno_gputrace_bytes,
    frame,
    legacy_call,
    unframe,
)

from bpfdyno.app.tracing import TracingComponent
from bpfdyno.core.config import load
from bpfdyno.core.errors import PermissionDenied
from bpfdyno.core.identity import Requester
from bpfdyno.core.status import PartState
from bpfdyno.server.legacy_rpc import MAX_FRAME_BYTES
from bpfdyno.version import __version__

# What `dyno status`, `dyno version`, `dyno dcgm-pause` and `dyno dcgm-resume` send.
DYNO_STATUS = b'\x12\x00\x00\x00{"fn":"getStatus"}'
DYNO_VERSION = b'\x13\x00\x00\x00{"fn":"getVersion"}'
DYNO_DCGM_PAUSE = b'\x35\x00\x00\x00\n{\n    "fn": "dcgmProfPause",\n    "duration_s": 300\n}'
DYNO_DCGM_RESUME = b'\x17\x00\x00\x00{"fn":"dcgmProfResume"}'


async def test_dyno_status_version_and_dcgm_exact_bytes(harness: Harness) -> None:
    port = harness.legacy_port
    assert await legacy_call(port, DYNO_STATUS) == b'\x0c\x00\x00\x00{"status":1}'
    version = f'{{"version":"{__version__}"}}'.encode()
    assert await legacy_call(port, DYNO_VERSION) == struct.pack("<i", len(version)) + version
    # No GPU monitor: dynolog answers false too.
    assert await legacy_call(port, DYNO_DCGM_PAUSE) == b'\x10\x00\x00\x00{"status":false}'
    assert await legacy_call(port, DYNO_DCGM_RESUME) == b'\x10\x00\x00\x00{"status":false}'


async def test_dcgm_calls_reach_the_gpu_monitor(short_tmp: Path) -> None:
    calls: list[object] = []

    def pause(duration_s: int) -> bool:
        calls.append(("pause", duration_s))
        return True

    def resume() -> bool:
        calls.append("resume")
        return True

    cfg = load(
        None, [("kineto.socket_dir", f'"{short_tmp}"'), ("legacy_rpc.listen", '["127.0.0.1:0"]')]
    )
    comp = TracingComponent(cfg, dcgm_pause=pause, dcgm_resume=resume)
    await comp.start()
    try:
        assert comp.legacy is not None
        port = comp.legacy.bound[0][1]
        assert unframe(await legacy_call(port, DYNO_DCGM_PAUSE)) == {"status": True}
        assert unframe(await legacy_call(port, DYNO_DCGM_RESUME)) == {"status": True}
        assert calls == [("pause", 300), "resume"]
        bad = unframe(await legacy_call(port, frame({"fn": "dcgmProfPause", "duration_s": "10"})))
        assert bad["status"] == "failed"
        assert "'duration_s' must be an integer" in str(bad["error"])
        assert calls == [("pause", 300), "resume"]
    finally:
        await comp.stop()


async def test_only_the_pauser_or_root_ends_a_gpu_profiling_pause(short_tmp: Path) -> None:
    """Found by reading the code: any user's ``dcgm-resume`` ended another user's pause (and
    a shorter pause cut a longer one short). A pause is now its pauser's: another user's
    resume is refused naming the rule, the monitor stays paused until the last pause ends,
    and root may end them all."""
    calls: list[object] = []
    now = [1000.0]

    def pause(duration_s: int) -> bool:
        calls.append(("pause", duration_s))
        return True

    def resume() -> bool:
        calls.append("resume")
        return True

    cfg = load(None, [("kineto.socket_dir", f'"{short_tmp}"'), ("legacy_rpc.enabled", "false")])
    comp = TracingComponent(cfg, dcgm_pause=pause, dcgm_resume=resume)
    svc = comp.service
    svc._mono = lambda: now[0]
    alice, bob, root = (Requester(uid, "grpc-unix") for uid in (1001, 1002, 0))
    assert svc.dcgm_pause(300, alice)
    with pytest.raises(PermissionDenied) as e:
        svc.dcgm_resume(bob)
    assert e.value.rule == "not_pauser"
    assert str(e.value) == (
        "refused by rule 'not_pauser': the GPU profiling pause is another user's: only the "
        "user who paused or root may end it; it ends by itself in 300 s"
    )
    now[0] += 100
    assert svc.dcgm_pause(60, bob)  # shorter than what is left of hers: hers still holds
    assert svc.dcgm_resume(bob)  # his own ends; hers goes on (200 s left)
    assert svc.dcgm_resume(alice)  # hers ends: nothing left
    assert calls == [("pause", 300), ("pause", 200), ("pause", 200), "resume"]
    calls.clear()
    assert svc.dcgm_pause(30, alice) and svc.dcgm_pause(30, bob)
    assert svc.dcgm_resume(root)
    assert calls == [("pause", 30), ("pause", 30), "resume"]
    now[0] += 1000  # a pause that ended by itself is nobody's: anyone may resume
    svc.dcgm_pause(30, alice)
    now[0] += 31
    assert svc.dcgm_resume(bob)


async def test_dyno_gputrace_bytes_trigger_a_registered_client(harness: Harness) -> None:
    client = KinetoClient(str(harness.socket_dir))
    other = KinetoClient(str(harness.socket_dir))
    try:
        await client.poll([8100, 8000])
        await other.poll([8200, 8000], job_id=31)  # another job: not matched
        log_file = str(harness.trace_dir / "trace.json")
        raw = await legacy_call(harness.legacy_port, dyno_gputrace_bytes(log_file))
        reply = unframe(raw)
        trace_id = reply.pop("traceId")
        assert reply == {
            "activityProfilersBusy": 0,
            "activityProfilersTriggered": [8100],
            "eventProfilersBusy": 0,
            "eventProfilersTriggered": [],
            "processesMatched": [8100],
            "traceFiles": {"8100": str(harness.trace_dir / "trace_8100.json")},
        }
        # Compact JSON, keys sorted, as dynolog's nlohmann::json dump.
        assert raw[4:].startswith(
            b'{"activityProfilersBusy":0,"activityProfilersTriggered":[8100],'
        )
        config = await client.poll([8100, 8000])
        assert config.splitlines() == [
            f"ACTIVITIES_LOG_FILE={log_file}",
            "PROFILE_START_TIME=0",
            "ACTIVITIES_DURATION_MSECS=500",
            "PROFILE_REPORT_INPUT_SHAPES=false",
            "PROFILE_WITH_STACK=false",
            "PROFILE_WITH_FLOPS=false",
            "PROFILE_WITH_MODULES=false",
            f"REQUEST_TRACE_ID={trace_id}",
        ]
        # The same request again: the process now holds a config, so it is busy.
        again = unframe(await legacy_call(harness.legacy_port, dyno_gputrace_bytes(log_file)))
        assert again["activityProfilersBusy"] == 1
        assert again["activityProfilersTriggered"] == []
        assert again["traceFiles"] == {}
    finally:
        client.close()
        other.close()


async def test_rejected_trace_request_keeps_dyno_fields(harness: Harness) -> None:
    reply = unframe(await legacy_call(harness.legacy_port, dyno_gputrace_bytes("/etc/x.json")))
    assert reply["status"] == "failed"
    assert reply["rule"] == "outside_allowed_dirs"
    assert reply["processesMatched"] == [] and reply["activityProfilersTriggered"] == []
    missing = unframe(
        await legacy_call(harness.legacy_port, frame({"fn": "setKinetOnDemandRequest"}))
    )
    assert missing["status"] == "failed"
    assert "'config'" in str(missing["error"])


async def test_bad_frames_get_error_replies(harness: Harness) -> None:
    port = harness.legacy_port
    cases = {
        b"\x05\x00\x00\x00{oops": "not valid JSON",
        frame(b"[1, 2]"): "JSON object",
        frame({"nofn": 1}): "missing 'fn'",
        frame({"fn": "rm -rf"}): "unknown fn",
        struct.pack("<i", 0): "bad frame length 0",
        struct.pack("<i", -5) + b"xxxx": "bad frame length -5",
        struct.pack("<i", MAX_FRAME_BYTES + 1) + b"{}": f"bad frame length {MAX_FRAME_BYTES + 1}",
        struct.pack("<i", 100) + b'{"fn": "getSt': "closed after 13 bytes",
    }
    for data, expected in cases.items():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        if expected.startswith("closed"):
            writer.write_eof()
        await writer.drain()
        reply = unframe(await asyncio.wait_for(reader.read(), 10))
        writer.close()
        assert reply["status"] == "failed", data
        assert expected in str(reply["error"]), (data, reply)
    http = await legacy_call(port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert http.startswith(b"HTTP/1.0 400 Bad Request\r\n")
    assert b"not HTTP" in http


async def test_slow_client_times_out_while_others_are_served(short_tmp: Path) -> None:
    cfg = load(
        None,
        [
            ("kineto.socket_dir", f'"{short_tmp}"'),
            ("legacy_rpc.listen", '["127.0.0.1:0"]'),
            ("legacy_rpc.timeout_s", "1.0"),
        ],
    )
    comp = TracingComponent(cfg)
    await comp.start()
    try:
        assert comp.legacy is not None
        port = comp.legacy.bound[0][1]
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
        slow_writer.write(b"\x20\x00")  # half a length prefix, then nothing
        replies = await asyncio.gather(*(legacy_call(port, DYNO_STATUS) for _ in range(30)))
        assert replies == [b'\x0c\x00\x00\x00{"status":1}'] * 30
        assert not slow_reader.at_eof()  # still waiting while the others were answered
        slow = unframe(await asyncio.wait_for(slow_reader.read(), 10))
        assert "no complete request within 1 s" in str(slow["error"])
        slow_writer.close()
    finally:
        await comp.stop()


async def test_fuzzed_frames_leave_it_serving(harness: Harness) -> None:
    rng = random.Random(99)
    port = harness.legacy_port
    valid = frame({"fn": "setKinetOnDemandRequest", "config": "A=1", "pids": [0], "job_id": 0})

    def fuzz(i: int) -> bytes:
        kind = i % 3
        if kind == 0:
            return valid[: rng.randrange(1, len(valid))]  # truncated
        if kind == 1:
            body = rng.randbytes(rng.randrange(1, 300))
            return struct.pack("<i", len(body)) + body  # random body
        body = bytearray(valid[4:])
        for _ in range(3):
            body[rng.randrange(len(body))] = rng.randrange(256)  # mutated JSON
        return struct.pack("<i", len(body)) + bytes(body)

    async def send(data: bytes) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        writer.write_eof()
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        (size,) = struct.unpack_from("<i", reply)
        assert len(reply) == 4 + size  # always a well-formed reply, never a silent close
        orjson.loads(reply[4:])

    frames = [fuzz(i) for i in range(1500)]
    for start in range(0, len(frames), 50):
        await asyncio.gather(*(send(f) for f in frames[start : start + 50]))
    assert await legacy_call(port, DYNO_STATUS) == b'\x0c\x00\x00\x00{"status":1}'
    assert harness.comp.statuses()[1].state is PartState.OK


async def test_ipv6_and_ipv4_listen_and_a_taken_port_degrades(short_tmp: Path) -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy_port = taken.getsockname()[1]
    cfg = load(
        None,
        [
            ("kineto.socket_dir", f'"{short_tmp}"'),
            ("legacy_rpc.listen", f'["127.0.0.1:{busy_port}", "[::1]:0"]'),
        ],
    )
    comp = TracingComponent(cfg)
    await comp.start()
    try:
        assert comp.legacy is not None
        [(host, port)] = comp.legacy.bound
        assert host == "::1"
        assert await legacy_call(port, DYNO_STATUS, host="::1") == b'\x0c\x00\x00\x00{"status":1}'
        state = comp.statuses()[1]
        assert state.state is PartState.DEGRADED
        assert f"127.0.0.1:{busy_port}" in state.reason
    finally:
        await comp.stop()
        taken.close()
