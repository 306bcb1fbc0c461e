"""Recordings: the JSON codec, validation with clear errors, and replay as a data source."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from tui_synthetic import BASE_TS, make_recording

from bpfdyno.rpc.processes import ProcessRow
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.codec import RecordingError, decode, encode
from bpfdyno.tui.datasource import (
    Disconnected,
    RecordedDataSource,
    RequestFailed,
    ServiceUnavailable,
)
from bpfdyno.tui.recorded import FORMAT, VERSION, Recording, load_recording, parse_recording


def _as_json(rec: Recording) -> dict[str, object]:
    obj = encode(rec)
    assert isinstance(obj, dict)
    return {"format": FORMAT, "version": VERSION, **obj}


def test_round_trip_through_json_text(tmp_path: Path) -> None:
    rec = make_recording(processes=5, frames=2, gpus=1)
    path = tmp_path / "rec.json"
    # Strict JSON: NaN must have been written as null.
    path.write_text(json.dumps(_as_json(rec), allow_nan=False))
    back = load_recording(path)
    # Compared as encoded values: NaN (unknown) never equals itself as a float.
    assert encode(back) == encode(rec)
    assert math.isnan(back.status.collectors[-1].interval_s)  # the pmu collector's


def test_version_1_recordings_still_replay() -> None:
    """Made before process rows took the API's field names."""
    rec = make_recording(processes=3, frames=1)
    obj = _as_json(rec)
    obj["version"] = 1
    rows = obj["frames"][0]["processes"]["rows"]  # type: ignore[index]
    for row in rows:
        row["threads"] = row.pop("num_threads")
        row["start_ts"] = row.pop("start_unix_seconds")
        row["job_id"] = row.pop("slurm_job_id")
    rows[0]["rss_bytes"] = None  # version 1 rows could leave it unknown
    back = parse_recording(obj)
    (frame,) = back.frames
    (original,) = rec.frames
    assert frame.processes is not None and original.processes is not None
    assert encode(frame.processes.rows[1:]) == encode(original.processes.rows[1:])
    assert frame.processes.rows[0].rss_bytes == 0
    assert frame.processes.rows[0].num_threads == original.processes.rows[0].num_threads


def test_unknown_values_are_null_and_read_back_as_unknown() -> None:
    obj = encode(ProcessRow(pid=1, comm="x"))
    assert obj["cpu_ratio"] is None and obj["gpu_memory_bytes"] is None
    back = decode(ProcessRow, obj)
    assert math.isnan(back.cpu_ratio) and back.gpu_memory_bytes is None


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
            "recording.status.collectors: expected a list, got dict",
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
    seen = [(r.ts, r.collector) for r in [await anext(stream) for _ in range(12)]]
    # Frame 0, frame 1, then frame 0 again 2 s later (span + interval): time keeps going.
    kinds = ("host", "self", "sched", "net")
    assert seen == [(BASE_TS + t, c) for t in (0, 1, 2) for c in kinds]
    table = await src.processes(10)
    assert table.ts == BASE_TS + 2
    # Trainers' poll times move with the replay too (frame 0 polled at BASE_TS - 1).
    assert (await src.trainers())[0].last_poll_ts == BASE_TS - 1 + 2


async def test_replay_job_filter_and_limit() -> None:
    src = RecordedDataSource(make_recording(processes=40, frames=1), speed=1000.0)
    job = await src.processes(100, job_id="5678")
    assert [r.pid for r in job.rows] == [1007, 1021, 1042, 1077, 1091, 1112, 1147, 1182, 1217, 1252]
    assert len((await src.processes(5)).rows) == 5


async def test_disconnect_ends_streams_and_calls_until_reconnect() -> None:
    src = RecordedDataSource(make_recording(processes=1, frames=1), speed=1000.0, loop=False)
    stream = src.stream_metrics()
    await anext(stream)
    started = (await src.status()).started_ts
    src.disconnect("stopped for the test")
    with pytest.raises(Disconnected, match="stopped for the test"):
        await src.status()
    with pytest.raises(Disconnected):
        async with asyncio.timeout(2):
            while True:
                await anext(stream)
    src.reconnect(restarted=True)
    assert (await src.status()).started_ts == started + 1000.0


async def test_unavailable_parts_and_trace_replay() -> None:
    rec = make_recording(
        processes=30, frames=1, unavailable=(("events", "no Kernel API"), ("trainers", "off"))
    )
    src = RecordedDataSource(rec, speed=1000.0)
    with pytest.raises(ServiceUnavailable, match="no Kernel API"):
        await anext(src.stream_events())
    with pytest.raises(ServiceUnavailable, match="off"):
        await src.trainers()
    ok = RecordedDataSource(make_recording(processes=30, frames=1), speed=1000.0)
    req = TraceSpec(log_file="/tmp/t.json", pids=(1021,), duration_ms=500)
    first = await ok.start_trace(req)
    assert ok.trace_requests == [req]
    states = [first.state] + [s.state async for s in ok.watch_trace(first.trace_id)]
    assert states == ["pending", "running", "done"]
    empty = RecordedDataSource(Recording(rec.status, rec.specs, rec.frames), speed=1000.0)
    with pytest.raises(RequestFailed, match="this recording holds no trace to replay"):
        await empty.start_trace(req)


async def test_event_stream_starts_with_the_frames_already_played() -> None:
    rec = make_recording(processes=1, frames=3, gpus=0)
    src = RecordedDataSource(rec, speed=1000.0, loop=False)
    metrics = src.stream_metrics()
    for _ in range(8):  # frames 0 and 1 (host, self, sched, net each)
        await anext(metrics)
    events = src.stream_events()
    got = [await anext(events) for _ in range(4)]
    # Frame 0: exec, retransmit, reset; frame 1: exec only (see tui_synthetic.events).
    assert [e.kind for e in got] == ["exec", "tcp_retransmit", "tcp_reset_received", "exec"]
    assert got[3].ts_ns == int((BASE_TS + 1) * 1e9) + 1_000_000
    await anext(metrics)  # frame 2 plays: its events follow
    nxt = await asyncio.wait_for(anext(events), 5)
    assert (nxt.kind, nxt.pid) == ("exec", 20002)
