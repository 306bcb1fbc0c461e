"""The streaming merge on real Kineto trace files (written by PyTorch 2.13 for this module):
exact splicing, gzip, every failure leaving the original byte for byte."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from tracing_harness import Harness

from bpfdyno.core.identity import files_as
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.merge import (
    Insertion,
    MergeError,
    TraceLayout,
    inspect_trace,
    merge_into_trace,
)
from bpfdyno.tracing.traces import ProcState

EVENT = b'{"ph":"i","s":"t","cat":"bpfdyno.net","name":"x","pid":1,"tid":2,"ts":5.000}'


@pytest.fixture(scope="module")
def kineto_trace(torch_ready: str) -> Iterator[bytes]:
    """The bytes of a real on-demand trace (3 iterations of a tiny trainer)."""
    base = Path(tempfile.mkdtemp(prefix="bdm-", dir="/tmp"))

    async def trace() -> bytes:
        h = Harness(base)
        async with h:
            trainer = h.spawn_script("linear.py")
            [pid] = await trainer.wait_ready()
            await h.wait_trainers(lambda ts: [t.pid for t in ts] == [pid])
            req = TraceRequest(
                options=TraceSpec(log_file=str(h.trace_dir / "k.json"), iterations=3)
            )
            view = await h.wait_done(h.service.start_trace(req).trace_id, timeout=60)
            [p] = view.processes
            assert p.state is ProcState.WRITTEN
            return Path(p.output_path).read_bytes()

    try:
        yield asyncio.run(trace())
    finally:
        shutil.rmtree(base, ignore_errors=True)


def one_event(_: TraceLayout) -> Insertion:
    return Insertion([EVENT, EVENT])


def leftovers(directory: Path) -> list[str]:
    return [n for n in os.listdir(directory) if "bpfdyno-merge" in n]


def test_events_go_just_before_the_closing_bracket(kineto_trace: bytes, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(kineto_trace)
    os.chmod(path, 0o640)
    layout, result = merge_into_trace(str(path), one_event)
    merged = path.read_bytes()
    close = layout.close_offset
    assert kineto_trace[close : close + 1] == b"]"
    insert = b",\n" + EVENT + b",\n" + EVENT + b"\n"
    assert merged == kineto_trace[:close] + insert + kineto_trace[close:]  # Kineto's bytes kept
    assert (result.events_added, result.size_before, result.size_after) == (
        2,
        len(kineto_trace),
        len(merged),
    )
    assert os.stat(path).st_mode & 0o777 == 0o640
    original, data = json.loads(kineto_trace), json.loads(merged)
    assert data["traceEvents"] == [*original["traceEvents"], json.loads(EVENT), json.loads(EVENT)]
    assert {k: v for k, v in data.items() if k != "traceEvents"} == {
        k: v for k, v in original.items() if k != "traceEvents"
    }
    # The layout read from the head and tail alone.
    exact = json.loads(kineto_trace, parse_float=Decimal)
    span = next(e for e in exact["traceEvents"] if e.get("cat") == "Trace")
    assert layout.base_ns == original["baseTimeNanoseconds"]
    assert layout.window_ns == (int(span["ts"] * 1000), int((span["ts"] + span["dur"]) * 1000))
    assert layout.members["trace_id"] == original["trace_id"]
    assert not layout.compressed and not layout.empty
    assert leftovers(tmp_path) == []


def test_members_are_added_only_when_missing(kineto_trace: bytes, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(kineto_trace)
    dist = {"rank": 1, "world_size": 2}
    merge_into_trace(
        str(path), lambda _: Insertion([EVENT], {"distributedInfo": dist, "trace_id": "not ours"})
    )
    data = json.loads(path.read_bytes())
    assert data["distributedInfo"] == dist
    assert data["trace_id"] == json.loads(kineto_trace)["trace_id"]  # Kineto's wins


def test_gzip_traces_are_merged_compressed(kineto_trace: bytes, tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(kineto_trace))
    layout, _ = merge_into_trace(str(path), one_event)
    assert layout.compressed
    merged = gzip.decompress(path.read_bytes())
    close = layout.close_offset
    assert (
        merged
        == kineto_trace[:close] + b",\n" + EVENT + b",\n" + EVENT + b"\n" + kineto_trace[close:]
    )


def test_an_empty_event_array(kineto_trace: bytes, tmp_path: Path) -> None:
    head = kineto_trace[: kineto_trace.index(b'"traceEvents": [') + len(b'"traceEvents": [')]
    tail = kineto_trace[kineto_trace.rindex(b"]") :]
    path = tmp_path / "e.json"
    path.write_bytes(head + b"\n  " + tail)
    layout, _ = merge_into_trace(str(path), one_event)
    assert layout.empty
    assert json.loads(path.read_bytes())["traceEvents"] == [json.loads(EVENT)] * 2


def test_no_events_no_change(kineto_trace: bytes, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(kineto_trace)
    before = os.stat(path)
    _, result = merge_into_trace(str(path), lambda _: Insertion([]))
    assert result.events_added == 0 and os.stat(path).st_ino == before.st_ino


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:-200], "does not end like a complete Kineto trace"),
        (lambda b: b[: len(b) // 2], "does not end like a complete Kineto trace"),
        (lambda b: b[:-2], "does not end like a complete Kineto trace"),
        (lambda b: b"", "is empty"),
        (lambda b: b"[1, 2]", "is not a JSON object"),
        (lambda b: b.replace(b'"traceEvents"', b'"events"'), 'has no "traceEvents" array'),
    ],
)
def test_a_broken_file_is_left_byte_for_byte(
    kineto_trace: bytes, tmp_path: Path, damage: object, message: str
) -> None:
    assert callable(damage)
    broken = damage(kineto_trace)
    path = tmp_path / "t.json"
    path.write_bytes(broken)
    with pytest.raises(MergeError, match=message):
        merge_into_trace(str(path), one_event)
    assert path.read_bytes() == broken
    assert leftovers(tmp_path) == []


def test_a_file_changed_while_merging_is_left_alone(kineto_trace: bytes, tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_bytes(kineto_trace)

    def build(layout: TraceLayout) -> Insertion:
        with open(path, "ab") as f:  # someone appends meanwhile
            f.write(b"\n")
        return Insertion([EVENT])

    with pytest.raises(MergeError, match="changed while the kernel tracks were merged"):
        merge_into_trace(str(path), build)
    assert path.read_bytes() == kineto_trace + b"\n"
    assert leftovers(tmp_path) == []


@pytest.mark.root
def test_no_space_left_leaves_the_original(kineto_trace: bytes, tmp_path: Path) -> None:
    """A tmpfs with room for the file but not for its merged copy."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
    try:
        path = mnt / "t.json"
        path.write_bytes(kineto_trace)
        st = os.statvfs(mnt)
        (mnt / "filler").write_bytes(b"\0" * (st.f_bavail * st.f_frsize - len(kineto_trace) // 2))
        with pytest.raises(MergeError) as e:
            merge_into_trace(str(path), one_event)
        assert "No space left on device" in str(e.value)
        assert "free space in that directory" in str(e.value)
        assert "the trace is as Kineto wrote it" in str(e.value)
        assert path.read_bytes() == kineto_trace
        assert leftovers(mnt) == []
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_inspect_reads_only_head_and_tail(kineto_trace: bytes, tmp_path: Path) -> None:
    """A body that is not JSON at all is not looked at (it is copied, never parsed)."""
    original = json.loads(kineto_trace)
    start = kineto_trace.index(b'"traceEvents": [') + len(b'"traceEvents": [')
    end = kineto_trace.rindex(b"]")
    filler = b"\n" + b" " * (10 << 20) + b'{"not": "parsed"}'
    body = kineto_trace[start:end].rstrip()
    path = tmp_path / "big.json"
    path.write_bytes(kineto_trace[:start] + filler + b"," + body + b"\n" + kineto_trace[end:])
    layout = inspect_trace(str(path))
    assert layout.base_ns == original["baseTimeNanoseconds"]
    assert layout.window_ns is not None


NOBODY = 65534


@pytest.fixture
def shared_dirs() -> Iterator[tuple[Path, Path]]:
    """(a directory only ``nobody`` controls, a directory only root may enter), both under a
    root directory every user may traverse."""
    base = Path(tempfile.mkdtemp(prefix="bdm-own-", dir="/tmp"))
    os.chmod(base, 0o755)
    theirs, roots = base / "theirs", base / "roots"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, NOBODY, NOBODY)
    roots.mkdir(mode=0o700)
    try:
        yield theirs, roots
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_merge_acts_as_the_file_owner(
    kineto_trace: bytes, shared_dirs: tuple[Path, Path]
) -> None:
    """A user's trace is merged with that user's rights: the copy is theirs, mode kept."""
    theirs, _ = shared_dirs
    path = theirs / "t.json"
    path.write_bytes(kineto_trace)
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o640)
    with files_as(NOBODY, NOBODY):
        _, result = merge_into_trace(str(path), one_event)
    st = path.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (NOBODY, NOBODY, 0o640)
    assert result.events_added == 2 and leftovers(theirs) == []


@pytest.mark.parametrize("via", ["file link", "directory link"])
def test_a_link_the_owner_planted_reads_and_writes_nothing_of_root(
    kineto_trace: bytes, shared_dirs: tuple[Path, Path], via: str
) -> None:
    """Between Kineto's rename and the merge, the owner swaps in a link to a root-only trace:
    the merge (as the owner) can neither read it nor write next to it; the victim is intact."""
    theirs, roots = shared_dirs
    victim = roots / "t.json"
    victim.write_bytes(kineto_trace)
    os.chmod(victim, 0o600)
    if via == "file link":
        path = theirs / "t.json"
        os.symlink(victim, path)
    else:
        os.symlink(roots, theirs / "d")
        path = theirs / "d" / "t.json"
    with pytest.raises(MergeError), files_as(NOBODY, NOBODY):
        merge_into_trace(str(path), one_event)
    assert victim.read_bytes() == kineto_trace
    assert sorted(os.listdir(roots)) == ["t.json"] and leftovers(theirs) == []
