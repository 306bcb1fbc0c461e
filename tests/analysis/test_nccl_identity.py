"""What identifies an NCCL collective across ranks besides when it completes: the process
group and the sizes PyTorch names on its kernel (multi-rank traces), not this rank's stream."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence

PID = 41


def nccl_kernel(ts: float, stream: int, nelems: int) -> dict[str, Any]:
    args = {
        "device": 0,
        "stream": stream,
        "Collective name": "allreduce",
        "In msg nelems": nelems,
        "Out msg nelems": nelems,
        "Group size": 2,
        "dtype": "BFloat16",
        "Process Group Name": "0",
        "Process Group Description": "default_pg",
    }
    return {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            "pid": 0, "tid": stream, "ts": ts, "dur": 50.0, "args": args}  # fmt: skip


def rank_file(tmp_path: Path, rank: int, stream: int, nelems: int) -> str:
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 0.0, "dur": 100_000.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": PID + rank, "tid": PID + rank,
         "ts": 0.0, "dur": 10.0, "args": {}},
        *(nccl_kernel(1000.0 + 10_000 * i, stream, nelems) for i in range(8)),
    ]  # fmt: skip
    doc = {"baseTimeNanoseconds": 1_800_000_000_000_000_000, "traceEvents": events,
           "distributedInfo": {"rank": rank, "world_size": 2}}  # fmt: skip
    path = tmp_path / f"r{rank}.json"
    path.write_text(json.dumps(doc))
    return str(path)


def evidence(path: str) -> RankEvidence:
    ev = summarize_file(path).evidence
    assert ev is not None
    return ev


def test_the_process_group_and_the_payload_come_from_the_kernel(tmp_path: Path) -> None:
    ev = evidence(rank_file(tmp_path, 0, 7, 1 << 20))
    assert {(c.op, c.group, c.size_bytes) for c in ev.collectives} == {
        ("allreduce", "process group 0", 2 << 20)  # 1 Mi bf16 elements
    }


def test_ranks_whose_streams_differ_are_paired_by_their_process_group(tmp_path: Path) -> None:
    v = compare(
        [
            evidence(rank_file(tmp_path, 0, 7, 1 << 20)),
            evidence(rank_file(tmp_path, 1, 13, 1 << 20)),
        ]
    )
    assert v.matched == 8 and v.within_noise


def test_all_reduces_of_other_sizes_are_other_collectives(tmp_path: Path) -> None:
    """Rank 1's all-reduces complete with rank 0's but carry twice the bytes: not the same
    collectives (another job's, a mixed-up file), so nothing is compared."""
    r0 = evidence(rank_file(tmp_path, 0, 7, 1 << 20))
    r1 = evidence(rank_file(tmp_path, 1, 7, 2 << 20))
    v = compare([r0, r1])
    assert v.matched == 0 and v.headline.startswith("not compared: too little overlap")
    same = dataclasses.replace(
        r1, collectives=tuple(dataclasses.replace(c, size_bytes=0) for c in r1.collectives)
    )
    assert compare([r0, same]).matched == 8  # sizes unknown on one side: time decides
