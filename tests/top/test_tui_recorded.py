"""Recordings: the JSON codec, validation with clear errors, and replay as a data source."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from tui_synthetic import BASE_TS, make_recording

from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.rpc.processes import ProcessList, ProcessRow
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.codec import RecordingError, decode, encode
from bpfdyno.tui.recorded import (
    FORMAT,
    VERSION,
    RecordedDataSource,
    Recording,
    load_recording,
    parse_recording,
)


def _as_json(rec: Recording) -> dict[str, object]:
    obj = encode(rec)
    assert isinstance(obj, dict)
    return {"format": FORMAT, "version": VERSION, **obj}


def test_round_trip_through_json_text(tmp_path: Path) -> None:
    rec = make_recording(processes=5, frames=2, gpus=1)
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(_as_json(rec), allow_nan=False))  # strict JSON: no NaN
    back = load_recording(path)
    # Compared as encoded values: NaN (unknown) never equals itself as a float.
    assert encode(back) == encode(rec)
    assert back.status == rec.status and back.trace == rec.trace
    assert back.frames[1].events == rec.frames[1].events


def test_recordings_hold_the_api_s_messages_with_unknown_values_left_out() -> None:
    table = ProcessList((ProcessRow(pid=1, comm="x", rss_bytes=1 << 40),), 5.0, 9)
    frame = encode(replace(make_recording(processes=1, frames=1).frames[0], processes=table))
    (row,) = frame["processes"]["processes"]
    # The message's JSON: .proto field names, 64-bit counts as numbers, unknown left out.
    assert row == {"pid": 1, "comm": "x", "rss_bytes": 1 << 40}
    back = decode(ProcessList, frame["processes"])
    assert math.isnan(back.processes[0].cpu_ratio) and back.processes[0].gpu_memory_bytes is None


def test_recordings_of_unknown_versions_are_refused_with_what_to_do() -> None:
    obj = _as_json(make_recording(processes=3, frames=1))
    obj["version"] = 1
    with pytest.raises(RecordingError) as e:
        parse_recording(obj)
    assert str(e.value) == (
        "recording version 1 is not supported; this build reads versions 2 and 3 (record it "
        "again with this bpfdyno)"
    )
    # A version-3 body labelled 2 is not what version 2 wrote: said so, not a crash.
    obj["version"] = 2
    with pytest.raises(RecordingError) as e:
        parse_recording(obj)
    assert str(e.value).startswith("a version-2 recording with an unexpected field")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda o: o.update(format="other"), 'not a bpfdyno top recording: expected "format"'),
        (lambda o: o.update(version=9), "recording version 9 is not supported; this build reads"),
        (lambda o: o.pop("status"), "recording has no 'status'"),
        (lambda o: o.update(frames=[]), "recording has no frames; record at least one interval"),
        (
            lambda o: o["frames"][0].update(ts="soon"),
            "recording.frames[0].ts: expected float, got 'soon'",
        ),
        (
            lambda o: o["status"].update(collectors={"host": "ok"}),
            "recording.status: Failed to parse collectors field: repeated field collectors "
            "must be in [] which is {'host': 'ok'}",
        ),
        (lambda o: o.update(interval_s=0), "interval_s must be positive, got 0.0"),
    ],
)
def test_bad_recordings_name_what_is_wrong(mutate: object, message: str) -> None:
    obj = _as_json(make_recording(processes=2, frames=1))
    mutate(obj)  # type: ignore[operator]
    with pytest.raises(RecordingError) as e:
        parse_recording(obj)
    assert str(e.value).startswith(message)


def test_load_recording_file_errors(tmp_path: Path) -> None:
    with pytest.raises(RecordingError, match=r"cannot read recording .*missing.json"):
        load_recording(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RecordingError, match=r"bad.json is not JSON"):
        load_recording(bad)


async def test_replay_plays_frames_in_order_then_loops_with_shifted_time() -> None:
    rec = make_recording(processes=40, frames=2, gpus=0)
    src = RecordedDataSource(rec, speed=1000.0, loop=True)
    stream = src.stream_metrics()
    kinds = ("host", "self", "sched", "net", "fabric", "irq")
    seen = [(r.unix_seconds, r.collector) for r in [await anext(stream) for _ in range(18)]]
    # Frame 0, frame 1, then frame 0 again 2 s later (span + interval): time keeps going.
    assert seen == [(BASE_TS + t, c) for t in (0, 1, 2) for c in kinds]
    table = await src.processes(10)
    assert table.unix_seconds == BASE_TS + 2
    # Trainers' poll times move with the replay too (frame 0 polled at BASE_TS - 1).
    assert (await src.trainers())[0].last_poll_unix_seconds == BASE_TS - 1 + 2


async def test_replay_job_filter_and_limit() -> None:
    src = RecordedDataSource(make_recording(processes=40, frames=1), speed=1000.0)
    job = await src.processes(100, job_id="5678")
    assert [r.pid for r in job.processes] == [
        1007, 1021, 1042, 1077, 1091, 1112, 1147, 1182, 1217, 1252
    ]  # fmt: skip
    assert len((await src.processes(5)).processes) == 5


async def test_disconnect_ends_streams_and_calls_until_reconnect() -> None:
    src = RecordedDataSource(make_recording(processes=1, frames=1), speed=1000.0, loop=False)
    stream = src.stream_metrics()
    await anext(stream)
    started = (await src.status()).started_unix_seconds
    src.disconnect("stopped for the test")
    with pytest.raises(AgentError, match="stopped for the test") as e:
        await src.status()
    assert e.value.kind is ErrorKind.UNREACHABLE
    with pytest.raises(AgentError):
        async with asyncio.timeout(2):
            while True:
                await anext(stream)
    src.reconnect(restarted=True)
    assert (await src.status()).started_unix_seconds == started + 1000.0


async def test_unavailable_parts_and_trace_replay() -> None:
    rec = make_recording(
        processes=30, frames=1, unavailable={"events": "no Kernel API", "trainers": "off"}
    )
    src = RecordedDataSource(rec, speed=1000.0)
    with pytest.raises(AgentError, match="no Kernel API") as e:
        await anext(src.stream_events())
    assert e.value.kind is ErrorKind.UNAVAILABLE
    with pytest.raises(AgentError, match="off"):
        await src.trainers()
    ok = RecordedDataSource(make_recording(processes=30, frames=1), speed=1000.0)
    req = TraceSpec(log_file="/tmp/t.json", pids=(1021,), duration_ms=500)
    first = await ok.start_trace(req)
    assert ok.trace_requests == [req]
    assert [p.pid for p in first.triggered] == [1021, 1091]  # the recording's trainers
    states = [s.outcome async for s in ok.watch_trace(first.trace_id)]
    assert states == ["running", "done"]
    empty = RecordedDataSource(Recording(rec.status, rec.specs, rec.frames), speed=1000.0)
    with pytest.raises(AgentError, match="this recording holds no trace to replay"):
        await empty.start_trace(req)


async def test_event_stream_starts_with_the_frames_already_played() -> None:
    rec = make_recording(processes=1, frames=3, gpus=0)
    src = RecordedDataSource(rec, speed=1000.0, loop=False)
    metrics = src.stream_metrics()
    for _ in range(12):  # frames 0 and 1 (host, self, sched, net, fabric, irq each)
        await anext(metrics)
    events = src.stream_events()
    got = [await anext(events) for _ in range(4)]
    # Frame 0: exec, retransmit, reset; frame 1: exec only (see tui_synthetic.events).
    assert [e.kind for e in got] == ["exec", "tcp_retransmit", "tcp_reset_received", "exec"]
    assert got[3].unix_ns == int((BASE_TS + 1) * 1e9) + 1_000_000
    await anext(metrics)  # frame 2 plays: its events follow
    nxt = await asyncio.wait_for(anext(events), 5)
    assert (nxt.kind, nxt.pid) == ("exec", 20002)
