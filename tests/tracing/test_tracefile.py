"""The one reader of trace files: real CUDA traces from a GPU node, files larger than its
chunks, JSON shaped to fool it, files that try to exhaust it, and files that are not files."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from h200_fixtures import DURATION, ITERATIONS, SPAN, kineto_body, merged

from bpfdyno.analysis import tracefile
from bpfdyno.analysis.trace_facts import CATEGORIES as READ
from bpfdyno.analysis.tracefile import (
    Categories,
    ReadLimits,
    SpanFinder,
    TraceFileError,
    find_profiler_span,
    json_stream,
    open_regular,
    scan_trace,
)

#: What the summary reads, every event parsed (no "light" CPU ops).
CATEGORIES = Categories(READ.names, READ.prefixes)


def scan(data: bytes, categories: Categories = CATEGORIES, **limits: Any) -> list[Any]:
    stream = json_stream(io.BytesIO(data))
    return list(scan_trace(stream, "t.json", categories, ReadLimits(**limits)))


def expected(data: bytes, categories: Categories = CATEGORIES) -> list[Any]:
    """What a full parse (json.loads) says the reader must yield."""
    doc = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    events = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") in categories]
    return sorted(k for k in doc if k != "traceEvents"), events


def split(items: list[Any]) -> tuple[list[str], list[Any]]:
    """(the members' names, sorted; the events) of what the reader yielded."""
    members = sorted(item[0] for kind, item in items if kind == "member")
    return members, [item for kind, item in items if kind == "event"]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[int]:
    monkeypatch.setattr(tracefile, "CHUNK", request.param)
    yield request.param


@pytest.mark.parametrize("small_chunks", [4096, 1 << 20, 4 << 20], indirect=True)
@pytest.mark.parametrize("trace", [ITERATIONS, DURATION], ids=["iterations", "duration"])
def test_every_event_of_the_real_cuda_traces(trace: Path, small_chunks: int) -> None:
    """Both real files (0.8 and 28 MB of JSON), plain and gzip, in chunks from 4 KiB up: the
    same members and the same events, in the same order, as a full parse."""
    data = merged(trace)
    want = expected(data)
    assert len(want[1]) in (1804, 74427)
    assert split(scan(data)) == want
    assert split(scan(gzip.compress(data, compresslevel=1))) == want
    # The summary's own categories read CPU ops "light": exactly their name and times...
    chunks = [item for kind, item in scan(data, READ) if kind == "light"]
    light = [
        (name.decode(), thread.decode(), float(ts), float(dur))
        for cat, fields in chunks
        if cat == "cpu_op"
        for name, thread, ts, dur in fields
    ]
    ops = [e for e in want[1] if e["cat"] == "cpu_op"]
    assert light == [(e["name"], f'{e["pid"]}, "tid": {e["tid"]}', e["ts"], e["dur"]) for e in ops]
    # ... and GPU kernels: their name, times and device.
    kernels = [
        (name.decode(), float(ts), float(dur), int(device))
        for cat, fields in chunks
        if cat == "kernel"
        for name, ts, dur, device in fields
    ]
    assert kernels == [
        (e["name"], e["ts"], e["dur"], e["args"]["device"]) for e in want[1] if e["cat"] == "kernel"
    ]


def test_a_plain_file_of_1_5_mb_of_cpu_ops() -> None:
    """The reader that came before gave up when the file's last piece was shorter than what it
    asked for: any file over 1 MB failed ("is not complete JSON ... (truncated?)")."""
    events = [
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": f"aten::op{i}",
            "pid": 1,
            "tid": 1,
            "ts": i * 10.0,
            "dur": 5.0,
            "args": {"External id": i},
        }
        for i in range(12_000)
    ]
    data = json.dumps({"schemaVersion": 1, "traceEvents": events}, indent=2).encode()
    assert len(data) > 1_500_000
    assert split(scan(data)) == (["schemaVersion"], events)


TRICKY = [
    # A "}, {" and a category key inside strings, in an event that is read and one that is not.
    {"ph": "X", "cat": "cpu_op", "name": 'f}, {"cat": "kernel", "x": "}, {', "ts": 1.5, "dur": 2},
    {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": '}, {"cat": "cpu_op", "ts": 9, "dur": 9}, {',
        "ts": 2,
    },
    # Nested objects before "cat" (another writer's key order), and arrays of objects.
    {
        "args": {"a": [{"b": 1}, {"c": {"d": [1, {"e": "}, {"}]}}]},
        "ph": "X",
        "cat": "kernel",
        "ts": 3,
    },
    {"ph": "X", "cat": "ac2g", "args": [{"cat": "cpu_op"}, {"cat": "kernel"}], "ts": 4},
    # Unicode, escapes, big and negative numbers, a non-object element, an event with no ts.
    {"ph": "X", "cat": "user_annotation", "name": '\u00e9\u4e2d\U0001f600 \\"q" \n', "ts": -5e300},
    7,
    {"ph": "X", "cat": "bpfdyno.sched", "name": "x", "ts": 12345678901234.567, "args": {}},
    {"cat": "Trace", "ph": "X", "name": "PyTorch Profiler (0)", "ts": 0, "dur": 10},
]


@pytest.mark.parametrize("small_chunks", [1, 2, 3, 5, 7, 64, 1 << 20], indirect=True)
@pytest.mark.parametrize("separators", [(",", ":"), (", ", ": ")], ids=["compact", "spaced"])
def test_json_shaped_to_fool_the_reader(small_chunks: int, separators: tuple[str, str]) -> None:
    """Every event in every chunking (down to one byte at a time), compact or spaced."""
    doc = {"deviceProperties": [{"id": 0}], "traceEvents": TRICKY, "traceName": "t"}
    data = json.dumps(doc, separators=separators, ensure_ascii=False).encode()
    members, events = split(scan(data))
    assert members == ["deviceProperties", "traceName"]
    assert events == [e for e in TRICKY if isinstance(e, dict) and e.get("cat") in CATEGORIES]
    assert [e["cat"] for e in events] == [
        "cpu_op",
        "kernel",
        "user_annotation",
        "bpfdyno.sched",
        "Trace",
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "is empty"),
        (b"  \n ", "is empty"),
        (b"root:x:0:0:root:/root:/bin/bash\n", "is not a JSON object"),
        (b'{"a": 1}', 'has no "traceEvents" array'),
        (b'{"a": 1, "traceEvents": {}}', '"traceEvents" is not an array'),
        (b'{"traceEvents": [{"cat": "cpu_op", "ts": 1}, {"cat": "cpu_op", "ts": ', "does not end"),
        (
            b'{"traceEvents": [{"cat": "cpu_op", "ts": 1}, {"cat": "cpu_op", "ts": 2}]',
            "does not end",
        ),
        (
            b'{"traceEvents": [{"cat": "cpu_op", "ts": 1}, {"cat": "cpu_op", "ts": 1 2}]}',
            "not valid JSON",
        ),
        (b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "traceEvents": []}', "malformed"),
    ],
)
def test_broken_files_say_why_without_quoting_them(data: bytes, message: str) -> None:
    with pytest.raises(TraceFileError, match=message) as e:
        scan(data)
    assert "root:" not in str(e.value) and "'r'" not in str(e.value)


def test_deeply_nested_events_are_refused_not_crashed_on() -> None:
    deep = b'{"cat": "cpu_op", "ts": 1, "args": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    data = b'{"traceEvents": [' + deep + b"]}"
    with pytest.raises(TraceFileError, match="is not valid JSON near byte 17"):
        scan(data, max_event_bytes=1 << 20)


def gzip_stream(parts: Iterator[bytes]) -> bytes:
    """A gzip file of the concatenated parts, compressed as they come (nothing held whole)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 31)
    return b"".join(z.compress(p) for p in parts) + z.flush()


def test_a_small_gzip_file_inflating_to_gigabytes_stops_at_the_limit() -> None:
    """64 MiB of whitespace between two events (65 KB of gzip): valid JSON, read to its end
    under the default limits; refused at the JSON limit when that is lower."""
    spaces = b" " * (1 << 20)
    data = gzip_stream(
        iter([b'{"traceEvents": [{"cat": "cpu_op", "ts": 1},', *[spaces] * 64, b"{}]}"])
    )
    assert len(data) < 100_000
    with pytest.raises(TraceFileError, match=r"more than 33554432 bytes of JSON.*max_trace_json"):
        scan(data, max_json_bytes=32 << 20)
    assert split(scan(data)) == ([], [{"cat": "cpu_op", "ts": 1}])


def test_one_huge_string_costs_a_bounded_amount_of_memory(tmp_path: Path) -> None:
    """A 200 KB gzip file holding one 256 MiB JSON string: refused at the event limit, the
    reader's memory staying near it (a child process measures its own peak)."""
    path = tmp_path / "big.json.gz"
    chunk = b"a" * (1 << 20)
    path.write_bytes(
        gzip_stream(iter([b'{"traceEvents": [{"cat": "cpu_op", "name": "', *[chunk] * 256]))
    )
    assert path.stat().st_size < 1_000_000
    code = f"""
import resource
from bpfdyno.analysis.summary import summarize_file
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
s = summarize_file({str(path)!r})
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024, s.error)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grown_mib, error = out.stdout.split(" ", 1)
    assert "longer than 16777216 bytes" in error
    assert int(grown_mib) < 100, out.stdout


def test_open_regular_refuses_links_fifos_and_directories(tmp_path: Path) -> None:
    (tmp_path / "f.json").write_text("{}")
    os.symlink(tmp_path / "f.json", tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")
    with open_regular(str(tmp_path / "f.json")) as f:
        assert f.read() == b"{}"
    with pytest.raises(TraceFileError, match=r"link\.json is a symbolic link, not a trace file"):
        open_regular(str(tmp_path / "link.json"))
    # A FIFO nobody writes to: refused at once, never waited on.
    opened = threading.Event()

    def try_fifo() -> None:
        with pytest.raises(TraceFileError, match=r"fifo\.json is not a regular file"):
            open_regular(str(tmp_path / "fifo.json"))
        opened.set()

    t = threading.Thread(target=try_fifo, daemon=True)
    t.start()
    assert opened.wait(30), "opening a FIFO blocked"
    with pytest.raises(TraceFileError, match="is not a regular file"):
        open_regular(str(tmp_path))
    with pytest.raises(TraceFileError, match=r"cannot read .*nope\.json: No such file"):
        open_regular(str(tmp_path / "nope.json"))


def span_of(data: bytes) -> tuple[int, int]:
    for e in json.loads(data)["traceEvents"]:
        if e.get("cat") == "Trace":
            ts, dur = Decimal(str(e["ts"])), Decimal(str(e["dur"]))
            return int(ts * 1000), int((ts + dur) * 1000)
    raise AssertionError("no span")


def test_the_span_mid_file_in_a_real_cuda_trace() -> None:
    """Kineto's own CUDA trace has its span at byte 10.9 M of 23.2 M, GPU activities after."""
    body = kineto_body(DURATION)
    at = body.index(SPAN)
    assert 10_000_000 < at < len(body) - 12_000_000
    lo = body.index(b"[") + 1
    close = body.rindex(b"]")
    span = find_profiler_span(lambda off, n: body[off : off + n], lo, close)
    assert span == span_of(body) == (4_812_692_883_908_193, 4_812_694_383_940_240)


@pytest.mark.parametrize("piece", [1, 7, 24, 4096, 65_537, 1 << 20])
def test_the_span_found_in_a_stream_of_any_chunking(piece: int) -> None:
    body = kineto_body(ITERATIONS)
    finder = SpanFinder()
    for i in range(0, len(body), piece):
        finder.feed(body[i : i + piece])
    finder.feed(b"", final=True)
    assert finder.span == span_of(body)


def test_a_user_op_named_like_the_span_is_not_it() -> None:
    fake = {"ph": "X", "cat": "user_annotation", "name": "PyTorch Profiler (0)", "ts": 5, "dur": 1}
    real = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "ts": 1, "dur": 100}
    data = json.dumps({"traceEvents": [real, fake]}).encode()
    span = find_profiler_span(lambda off, n: data[off : off + n], 0, len(data))
    assert span == (1_000, 101_000)
