"""NCCL's sequence numbers pair the ranks' collectives: a file's NCCL collectives take the
seqNumber of NCCL's profiler plugin's collective row over them (the rows as the agent's merge
writes them, `bpfdyno.sources.nccl_profiler.track.trace_events`), and the verdict pairs two
ranks' collectives by it where both files have it — also where completion times would pair
them otherwise (clocks of two hosts apart by more than half the collectives' spacing)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence
from bpfdyno.sources.nccl_profiler.layout import Record, RecordKind
from bpfdyno.sources.nccl_profiler.track import trace_events

BASE_NS = 1_800_000_000_000_000_000
PID = 41
N = 12
SPACING_US = 2000.0  # an AllReduce every 2 ms
FIRST_SEQ = 40


def kernel(ts: float) -> dict[str, Any]:
    """An NCCL AllReduce kernel on the GPU as Kineto writes it (500 µs)."""
    args = {
        "device": 0, "stream": 7, "Collective name": "allreduce", "In msg nelems": 1024,
        "Out msg nelems": 1024, "Group size": 2, "dtype": "Float", "Process Group Name": "0",
        "Process Group Description": "default_pg",
    }  # fmt: skip
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "pid": 0, "tid": 7, "ts": ts, "dur": 500.0, "args": args}  # fmt: skip


def plugin_rows(starts_us: list[float], with_seq: bool) -> list[dict[str, Any]]:
    """The plugin's collective (from 100 µs before each kernel to 100 µs after it, seqNumber
    FIRST_SEQ + i) with its kernel channel, as the merge writes them (monotonic 0 = the
    file's ts 0: offset = base)."""
    records = []
    for i, ts in enumerate(starts_us):
        start = round((ts - 100) * 1000)
        common = dict(commit=i + 1, comm_slot=0, func=1, seq=FIRST_SEQ + i, start_ns=start,
                      gpu_start_ns=0, gpu_stop_ns=0, net_wait_ns=0, enqueue_ns=1000)  # fmt: skip
        records.append(Record(kind=RecordKind.COLL, channel=0, extra=1, duration_ns=700_000,
                              bytes=4096, **common))  # type: ignore[arg-type]  # fmt: skip
        records.append(Record(kind=RecordKind.KERNEL_CH, channel=0, extra=0,
                              duration_ns=500_000, bytes=0, **common))  # type: ignore[arg-type]  # fmt: skip
    rows = trace_events(records, PID, BASE_NS, BASE_NS)
    return rows if with_seq else []


def rank_file(tmp_path: Path, rank: int, clock_ahead_us: float, with_seq: bool) -> str:
    """Rank ``rank``'s file on a host whose clock is ``clock_ahead_us`` ahead."""
    starts = [1000.0 + clock_ahead_us + SPACING_US * i for i in range(N)]
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 0.0, "dur": 40_000.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID, "tid": PID, "ts": 0.0,
         "dur": 10.0, "args": {}},
        *(kernel(ts) for ts in starts),
        *plugin_rows(starts, with_seq),
    ]  # fmt: skip
    doc = {"baseTimeNanoseconds": BASE_NS, "traceEvents": events,
           "distributedInfo": {"rank": rank, "world_size": 2}}  # fmt: skip
    path = tmp_path / f"r{rank}-{with_seq}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def evidence(path: str, host: str) -> RankEvidence:
    ev = summarize_file(path).evidence
    assert ev is not None
    return dataclasses.replace(ev, host=host)


def test_each_collective_takes_the_seq_number_of_the_plugin_s_row_over_it(
    tmp_path: Path,
) -> None:
    ev = evidence(rank_file(tmp_path, 0, 0.0, with_seq=True), "a")
    assert [(c.op, c.nccl_seq) for c in ev.collectives] == [
        ("allreduce", FIRST_SEQ + i) for i in range(N)
    ]
    plain = evidence(rank_file(tmp_path, 0, 0.0, with_seq=False), "a")
    assert [c.nccl_seq for c in plain.collectives] == [None] * N


@pytest.mark.parametrize("with_seq", [True, False])
def test_the_seq_number_pairs_collectives_whatever_the_clocks(
    tmp_path: Path, with_seq: bool
) -> None:
    """Rank 1's host clock is 1.5 ms ahead (no offset measured): its completions are nearer
    rank 0's next ones (0.5 ms) than their own (1.5 ms). By sequence number every collective
    pairs with its own, and rank 1 shows exactly the clock's 1.5 ms in each; by completion
    time (no numbers) each pairs with the next, one fewer, rank 1 0.5 ms early."""
    ranks = [
        evidence(rank_file(tmp_path, 0, 0.0, with_seq), "a"),
        evidence(rank_file(tmp_path, 1, 1500.0, with_seq), "b"),
    ]
    v = compare(ranks)
    late = {t.rank: t.lateness_seconds for t in v.ranks}
    if with_seq:
        assert v.matched == N
        assert late[1] == pytest.approx(0.0015)
    else:
        assert v.matched == N - 1
        assert late[1] == pytest.approx(-0.0005)
