"""JSON-lines exporter: format, rotation that never splits or loses a line."""

from __future__ import annotations

import io
import time
from pathlib import Path

import orjson

from bpfdyno.core.config import JsonlSection
from bpfdyno.core.metrics import MetricKind, MetricTable, Round, sample
from bpfdyno.exporters.jsonl import JsonlExporter, RotatingLineWriter, encode_round, series_key

REG = MetricTable("t")
USED = REG.declare("t_used_bytes", MetricKind.GAUGE, "bytes", "Used.", ("dev",))
LOAD = REG.declare("t_load_ratio", MetricKind.RATIO, "ratio", "Load.")


def test_series_key_escapes_like_prometheus() -> None:
    assert series_key("a", ()) == "a"
    assert series_key("a", (("x", 'q"u\\o\nte'),)) == 'a{x="q\\"u\\\\o\\nte"}'


def test_encode_round_exact() -> None:
    rnd = Round(
        "host", 1700000000.5, [sample(USED, 42, {"dev": "sda"}), sample(LOAD, float("nan"))]
    )
    assert encode_round(rnd, "node1") == (
        b'{"ts":1700000000.5,"host":"node1","collector":"host",'
        b'"values":{"t_used_bytes{dev=\\"sda\\"}":42.0}}\n'
    )


def test_rotation_keeps_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    w = RotatingLineWriter(str(path), max_bytes=100, backups=3)
    lines = [f'{{"n":{i},"pad":"{"x" * 20}"}}\n'.encode() for i in range(10)]  # 37-38 bytes
    for line in lines:
        w.write_line(line)
    w.close()
    files = [path.with_name(f"m.jsonl.{i}") for i in (3, 2, 1)] + [path]
    assert [f.exists() for f in files] == [True, True, True, True]
    # 2 lines per file (a third would pass 100 bytes): 10 lines -> 5 files, the oldest dropped
    got = b"".join(f.read_bytes() for f in files)
    assert got == b"".join(lines[2:])
    for f in files:
        assert f.stat().st_size <= 100
        assert f.read_bytes().endswith(b"\n")
    assert not path.with_name("m.jsonl.4").exists()
    assert w.rotations == 4


def test_a_line_longer_than_the_limit_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    w = RotatingLineWriter(str(path), max_bytes=50, backups=1)
    w.write_line(b"short\n")
    big = b"y" * 120 + b"\n"
    w.write_line(big)
    w.close()
    assert path.read_bytes() == big
    assert path.with_name("m.jsonl.1").read_bytes() == b"short\n"


def test_reopening_appends_and_counts_existing_size(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_bytes(b"x" * 90 + b"\n")
    w = RotatingLineWriter(str(path), max_bytes=100, backups=1)
    w.write_line(b"0123456789\n")  # 91 + 11 > 100: rotates first, nothing is truncated
    w.close()
    assert path.with_name("m.jsonl.1").read_bytes() == b"x" * 90 + b"\n"
    assert path.read_bytes() == b"0123456789\n"


def test_exporter_to_file_and_stdout(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "m.jsonl"
    exp = JsonlExporter(JsonlSection(enabled=True, path=str(path), max_bytes=4096, backups=2))
    for i in range(100):
        exp.submit(Round("t", 1000.0 + i, [sample(LOAD, i / 100)]))
    exp.close()
    rows = [
        orjson.loads(line)
        for f in (path.with_name("m.jsonl.2"), path.with_name("m.jsonl.1"), path)
        if f.exists()
        for line in f.read_bytes().splitlines()
    ]
    assert [r["values"]["t_load_ratio"] for r in rows][-5:] == [0.95, 0.96, 0.97, 0.98, 0.99]
    assert rows[-1]["ts"] == 1099.0 and rows[-1]["collector"] == "t"

    out = io.BytesIO()
    exp2 = JsonlExporter(JsonlSection(enabled=True, path="-"), stdout=out)
    exp2.submit(Round("t", 5.0, [sample(LOAD, 0.5)]))
    exp2.close()
    assert orjson.loads(out.getvalue())["values"] == {"t_load_ratio": 0.5}


def test_write_failures_keep_lines_for_retry(tmp_path: Path) -> None:
    blocker = tmp_path / "dir-not-file"
    blocker.write_text("")  # a file where the exporter needs a directory: writes fail
    path = blocker / "m.jsonl"
    exp = JsonlExporter(JsonlSection(enabled=True, path=str(path), max_bytes=4096, backups=1))
    exp.submit(Round("t", 1.0, [sample(LOAD, 0.1)]))
    exp.submit(Round("t", 2.0, [sample(LOAD, 0.2)]))
    deadline = time.time() + 5
    while exp.write_errors < 2 and time.time() < deadline:
        time.sleep(0.01)
    assert exp.write_errors >= 2
    blocker.unlink()
    blocker.mkdir()
    exp.close()
    assert [orjson.loads(x)["ts"] for x in path.read_bytes().splitlines()] == [1.0, 2.0]
