"""The facts of a trace as the fast reader gets them (CPU ops read by a pattern, events found
by their category, parsed one by one) against the facts of the same file parsed whole by the
standard library's ``json.loads``: identical, on the real CUDA traces of a GPU node and on a
file in Kineto's own layout with every hard case in it, in chunks from 4 KiB up."""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from h200_fixtures import DURATION, ITERATIONS, merged

from bpfdyno.analysis import tracefile
from bpfdyno.analysis.summary import summarize_facts
from bpfdyno.analysis.trace_facts import CATEGORIES, TraceFacts, _Reader, read_facts


def reference(data: bytes) -> TraceFacts:
    """The facts with every event of the file parsed by ``json.loads``."""
    doc = json.loads(data)
    facts = TraceFacts("t.json")
    reader = _Reader(facts)
    for key, value in doc.items():
        if key != "traceEvents":
            reader.member(key, value)
    for event in doc["traceEvents"]:
        if isinstance(event, dict) and event.get("cat") in CATEGORIES:
            reader.event(event)
    return facts


def fast(data: bytes) -> TraceFacts:
    return read_facts(io.BytesIO(data), "t.json")


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[int]:
    monkeypatch.setattr(tracefile, "CHUNK", request.param)
    yield request.param


# -- a file in Kineto's layout, with the hard cases --------------------------------------


def event(
    cat: str, name: str, pid: Any, tid: Any, ts: str, dur: str, args: str = "", ph: str = "X"
) -> str:
    """One event exactly as Kineto lays it out (``ts`` and ``dur`` as written in the file)."""
    return (
        f'  {{\n    "ph": "{ph}", "cat": "{cat}", "name": {json.dumps(name, ensure_ascii=False)}, '
        f'"pid": {json.dumps(pid)}, "tid": {json.dumps(tid)},\n'
        f'    "ts": {ts}, "dur": {dur},\n    "args": {{\n      {args}\n    }}\n  }}'
    )


def other(**fields: Any) -> str:
    """An event in another writer's layout (compact, keys in another order)."""
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":"))


MAIN, WORKER, PID = 652, 698, 652
HUGE_STACK = json.dumps(["frame " + "x" * 200 + f" {i}" for i in range(1500)])  # ~300 KB


def step(i: int) -> list[str]:
    """The events of step ``i`` (a millisecond apart), every hard case somewhere."""
    t = 1_000_000 + i * 1000
    length = "-0.5" if i % 50 == 3 else "900.125"  # a negative length on a step
    events = [
        event("cpu_op", f"ProfilerStep#{i}", PID, MAIN, f"{t}.250", length, '"Ev Idx": 0'),
        event("cpu_op", "aten::mm", PID, MAIN, f"{t + 1}.500", "10.001",
              '"External id": 7,"Record function id": 0, "Ev Idx": 1'),
        event("cpu_op", "aten::add_", PID, WORKER, f"{t + 2}.125", "3.5", '"Ev Idx": 2'),
        event("cpu_op", "c10d::allreduce_", PID, MAIN, f"{t + 3}.000", "20.75", '"Ev Idx": 3'),
        # Numbers as JSON allows them: an integer, an exponent, zero and negative lengths.
        event("cpu_op", "aten::int_ts", PID, MAIN, f"{t + 4}", "2E+1"),
        event("cpu_op", "aten::zero", PID, WORKER, f"{t + 5}.5", "0"),
        event("cpu_op", "aten::negative", PID, MAIN, f"{t + 6}.5", "-1.5"),
        # Unicode in a name, raw and escaped.
        event("cpu_op", "größe→中文😀", PID, MAIN, f"{t + 7}.25", "1.25"),
        event("cpu_op", "c10d::broadcast_ é", PID, WORKER, f"{t + 8}.5", "2.5"),
        # Collective, optimizer and DataLoader annotations; a GPU annotation.
        event("user_annotation", "gloo:all_reduce", PID, WORKER, f"{t + 10}.5", "30.25"),
        event("user_annotation", f"Optimizer.step#SGD.step{i}", PID, MAIN, f"{t + 50}.5", "5"),
        event("user_annotation", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
              PID, MAIN, f"{t + 60}.5", "7.75"),
        event("gpu_user_annotation", "fwd", 0, 7, f"{t + 70}.5", "1"),
        # GPU kernels: a plain one, an NCCL one with its sizes, one with a brace in its name.
        event("kernel", "nvjet_sm90_tst", 0, 7, f"{t + 100}.125", "40.5",
              '"queued": 0, "device": 0, "context": 1, "stream": 7, "grid": [2, 66, 1]'),
        event("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 7, f"{t + 150}.5",
              "25.25", '"device": 0, "stream": 7, "Process Group Name": "0", '
              '"In msg nelems": 1024, "Out msg nelems": 1024, "dtype": "Float"'),
        event("kernel", "void k<{lambda(int)#1}>(int)", 0, 7, f"{t + 180}.5", "3",
              '"device": 1, "stream": 9'),
        # Events nobody reads between them.
        event("cuda_runtime", "cudaLaunchKernel", PID, MAIN, f"{t + 99}", "2",
              '"correlation": 5, "cbid": 211'),
        other(ph="f", id=i, pid=0, tid=7, ts=t + 100, cat="ac2g", name="ac2g", bp="e"),
        # The kernel tracks of bpfdyno (compact, as the merge writes them).
        other(ph="X", cat="bpfdyno.sched", name="blocked: lock (futex)", pid=PID,
              tid=1_000_000_001, ts=t + 200.5, dur=100.25,
              args={"tid": MAIN, "cause": "lock", "syscall": "futex", "state": "S"}),
        other(ph="X", cat="bpfdyno.sched", name="runnable", pid=PID, tid=1_000_000_001,
              ts=t + 300.5, dur=4.5,
              args={"tid": WORKER, "held_by_pid": 9, "held_by_comm": "hog ✓"}),
        other(ph="X", cat="bpfdyno.net", name="send", pid=PID, tid=1_000_000_002,
              ts=t + 400.25, dur=2.5,
              args={"bytes": 4096, "calls": 2, "local": "10.0.0.1:1", "peer": "10.0.0.2:2"}),
    ]  # fmt: skip
    if i % 7 == 0:
        # A name that fools a pattern: escaped quotes, a "}, {" and a category inside it.
        events.append(
            event("cpu_op", 'my "op"}, {"cat": "kernel", "x": {', PID, MAIN, f"{t + 9}.5", "1")
        )
    if i % 13 == 0:
        # A "}, {" in a string of the last event a chunk may end in (after a CPU op: read once
        # only), and an instant CPU op (not an interval: not read).
        events.append(event("cpu_op", "aten::before", PID, MAIN, f"{t + 14}", "0.5"))
        events.append(event("user_annotation", "x}, {y", PID, MAIN, f"{t + 14}.5", "1"))
        events.append(event("cpu_op", "mark", PID, MAIN, f"{t + 15}.5", "0", ph="i"))
    if i % 11 == 0:
        # The category's name as a value elsewhere, and a CPU op in another layout.
        events.append(event("cuda_runtime", "cudaMemcpy", PID, MAIN, f"{t + 11}", "1",
                            '"kind": "cpu_op", "also": "kernel"'))  # fmt: skip
        events.append(other(cat="cpu_op", ph="X", ts=t + 12.5, dur=3, name="aten::other",
                            pid=PID, tid=MAIN, args={"a": [{"cat": "cpu_op"}]}))  # fmt: skip
    if i % 17 == 4:
        # A kernel whose args name its device twice (JSON: the last one counts), and one with
        # "device" inside a string after its own.
        twice = '"device": 0, "stream": 7, "grid": [1, 1, 1], "device": 1'
        quoted = '"device": 0, "note": "a \\"device\\": 1 string"'
        events.append(event("kernel", "twice", 0, 7, f"{t + 190}.5", "2", twice))
        events.append(event("kernel", "quoted", 0, 7, f"{t + 195}.5", "2", quoted))
    if i % 97 == 5:
        # Stacks and shapes: one event's args of ~300 KB, nested arrays.
        events.append(
            event("cpu_op", "aten::conv2d", PID, MAIN, f"{t + 13}.5", "44.5",
                  f'"Input Dims": [[8, 3, 224, 224], [64, 3, 7, 7], []], '
                  f'"Call stack": {HUGE_STACK}')
        )  # fmt: skip
    return events


def synthetic(steps: int) -> bytes:
    """A trace in Kineto's layout: members, CPU part, the span, GPU part, members after."""
    head = (
        '{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": "H200"}\n  ],\n'
        '  "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},\n'
        '  "baseTimeNanoseconds": 1790857026000000000,\n  "traceEvents": [\n'
    )
    events = [e for i in range(steps) for e in step(i)]
    half = len(events) // 2
    span = event("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler",
                 "1000000.5", f"{steps * 1000}.25", '"Op count": 0')  # fmt: skip
    info = other(ph="X", cat="bpfdyno.info", name="kernel tracks", pid=PID, tid=1_000_000_000,
                 ts=1_000_000.5, dur=1, args={"tracks": ["sched", "net"]})  # fmt: skip
    body = ",\n".join([*events[:half], span, *events[half:], info])
    tail = '\n  ],\n  "traceName": "rank3.pt.trace.json",\n  "trace_id": "abc"\n}'
    return (head + body + tail).encode()


@pytest.fixture(scope="module")
def tricky() -> bytes:
    data = synthetic(3000)
    assert len(data) > 20 << 20  # five chunks of the real size
    return data


@pytest.mark.parametrize("small_chunks", [4096, 1 << 16, 4 << 20], indirect=True)
def test_a_tricky_file_in_kinetos_layout(tricky: bytes, small_chunks: int) -> None:
    """Escapes, braces and category names inside strings, unicode, JSON's number forms,
    zero and negative lengths, huge args, other layouts between Kineto's, events across
    chunk boundaries: the same facts as a whole parse, the same summary."""
    want = reference(tricky)
    got = fast(tricky)
    assert got == want
    assert summarize_facts(got) == summarize_facts(want)
    # What the file holds, so the comparison compares something.
    assert (got.rank, got.world_size, got.trace_id) == (3, 8, "abc")
    assert len(got.profiler_steps) == 3000 and len(got.optimizer_steps) == 3000
    assert got.profiler_steps[7] == (7, 1_007_000.25, 1_007_900.375)
    assert got.profiler_steps[53] == (53, 1_053_000.25, 1_053_000.25)
    assert len(got.enqueues) == 3000 and len(got.collectives) == 6000
    assert sum(len(t) for t in got.ops.values()) // 2 == 3000 * 9 + 429 + 231 + 273 + 31
    assert sorted(got.gpu_busy) == [0, 1] and len(got.offcpu) == 6000


@pytest.mark.parametrize("small_chunks", [4096, 4 << 20], indirect=True)
@pytest.mark.parametrize("trace", [ITERATIONS, DURATION], ids=["iterations", "duration"])
def test_the_real_cuda_traces(trace: Path, small_chunks: int) -> None:
    """Both real files from the GPU node, plain and gzip: the same facts as a whole parse."""
    data = merged(trace)
    want = reference(data)
    assert fast(data) == want
    assert fast(gzip.compress(data, compresslevel=1)) == want
    assert sum(len(t) for t in want.ops.values()) > 0 and want.window is not None
