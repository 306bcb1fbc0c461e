"""SIGKILL in the middle of a metrics-log write never leaves the JSON-lines file corrupt.

A child process runs the real `JsonlExporter` writing large rounds (about 1 MB a line, so
most of its time is spent inside ``write``) into one file; the test SIGKILLs it at random
moments and restarts it on the same file, over and over. A kill mid-write leaves a torn
last line (the test checks that it happened, so the repair path really ran); the next
start must cut it, and in the end every line of the file parses, in order, and none is
lost except those torn.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

pytestmark = [pytest.mark.slow]

#: Kill the writer at least this often, and until this many kills tore a line (at most
#: MAX_KILLS times: only some kills land inside write(), depending on the machine).
MIN_KILLS = 12
MIN_TORN = 3
MAX_KILLS = 200

LINE_BYTES = 4_000_000
MAX_BYTES = 40_000_000  # rotation keeps the disk use bounded: path, path.1, path.2

# The writer of the JSON-lines exporter, fed pre-encoded ~4 MB lines in a tight loop, so a
# kill lands inside write() most of the time. Each line carries its run and sequence number.
WRITER = textwrap.dedent(
    f"""
    import sys
    from bpfdyno.exporters.jsonl import RotatingLineWriter

    writer = RotatingLineWriter(sys.argv[1], max_bytes={MAX_BYTES}, backups=2)
    writer.write_line(b'{{"run":%d}}\\n' % int(sys.argv[2]))  # opens (and repairs) the file
    print("ready", writer.repaired_bytes, flush=True)
    pad = b"x" * {LINE_BYTES}
    seq = 0
    while True:
        writer.write_line(b'{{"run":%d,"seq":%d,"pad":"%s"}}\\n' % (int(sys.argv[2]), seq, pad))
        seq += 1
    """
)


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _files(path: Path) -> list[Path]:
    return [p for p in (path.with_name(path.name + ".2"), path.with_name(path.name + ".1"), path)
            if p.exists()]  # fmt: skip


def test_sigkill_mid_write_never_leaves_a_broken_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    rng = random.Random(14)
    torn = 0
    repaired_runs = 0
    run = 0
    while run < MIN_KILLS or torn < MIN_TORN:
        assert run < MAX_KILLS, f"only {torn} of {run} kills landed inside a write"
        child = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(run)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None
        ready, repaired = child.stdout.readline().split()
        assert ready == "ready"
        repaired_runs += int(repaired) > 0
        time.sleep(rng.uniform(0.05, 0.3))
        child.kill()
        child.wait()
        # What a kill leaves: at most one torn line, at the very end of the current file
        # (which is missing if the kill fell between a rotation's rename and the next line).
        data = path.read_bytes() if path.exists() else b""
        if data and not data.endswith(b"\n"):
            torn += 1
        run += 1
    last_torn = path.exists() and not path.read_bytes().endswith(b"\n")
    assert repaired_runs == torn - last_torn
    last_seq: dict[int, int] = {}
    for f in _files(path):
        data = f.read_bytes()
        if f == path and not data.endswith(b"\n"):
            data = data[: data.rfind(b"\n") + 1]  # the last kill's: cut by the next writer
        for line in data.splitlines():
            obj = orjson.loads(line)  # raises on any broken or glued line
            if "seq" in obj:
                # In order within a run (its first lines may have rotated away): nothing
                # glued, duplicated or skipped.
                if obj["run"] in last_seq:
                    assert obj["seq"] == last_seq[obj["run"]] + 1, obj["run"]
                last_seq[obj["run"]] = obj["seq"]
                assert len(obj["pad"]) == LINE_BYTES
