"""Full-mode records as trace events: the NCCL profiler's track for a trace file.

`trace_events` turns the records `NcclProfilerReceiver.drain_records` hands over into Chrome
trace-format complete events ("ph": "X") on one thread row per kind, their times on the
trace's own clock given as base_ns (the CLOCK_REALTIME ns the file's ts 0 stands for, as
Kineto's files count in microseconds). GPU kernel channels stay on the CPU clock: NCCL's GPU
timer (globaltimer) is not comparable with it, so a channel's row spans the CPU times at which
NCCL's proxy saw it start and stop, and its GPU duration is in its args.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from bpfdyno.rpc.kernel_tracks import CAT_NCCL_PROFILER
from bpfdyno.sources.nccl_profiler.layout import FUNC_NAMES, Record, RecordKind

#: The rows' thread ids: numbers (as every other row of a trace file), apart from the
#: kernel tracks' synthetic rows (from 1_000_000_000 up) and from real threads.
TID_BASE = 1_100_000_000
#: Thread row names, per record kind.
ROWS = {
    RecordKind.COLL: "NCCL collectives",
    RecordKind.P2P: "NCCL point-to-point",
    RecordKind.KERNEL_CH: "NCCL kernel channels",
    RecordKind.PROXY_STEP: "NCCL proxy steps",
}
#: Proxy step wait states by the ABI's numbers (the state a step ended in).
STEP_STATES = {
    8: "SendGPUWait",
    9: "SendWait",
    10: "RecvWait",
    11: "RecvFlushWait",
    12: "RecvGPUWait",
    20: "SendPeerWait",
}


def _latest(records: Iterable[Record]) -> list[Record]:
    """The records with each collective's (point-to-point's) update in place of its first
    record: one event per operation, with its final values."""
    out: list[Record] = []
    at: dict[tuple[int, int, int, int], int] = {}
    for r in records:
        if r.kind in (RecordKind.COLL, RecordKind.P2P):
            at[(r.kind, r.comm_slot, r.seq, r.start_ns)] = len(out)
        elif r.kind in (RecordKind.COLL_UPDATE, RecordKind.P2P_UPDATE):
            first = RecordKind.COLL if r.kind == RecordKind.COLL_UPDATE else RecordKind.P2P
            i = at.get((first, r.comm_slot, r.seq, r.start_ns))
            if i is not None:
                out[i] = dataclasses.replace(r, kind=first)
            else:  # its first record is not among these: the update has the values in full
                out.append(dataclasses.replace(r, kind=first))
            continue
        out.append(r)
    return out


def trace_events(
    records: Iterable[Record], pid: int, realtime_offset_ns: int, base_ns: int
) -> list[dict[str, Any]]:
    """The records as trace events of process pid (see the module's description)."""
    events: list[dict[str, Any]] = []
    rows: set[RecordKind] = set()
    for r in _latest(records):
        kind = RecordKind(r.kind)
        rows.add(kind)
        func = FUNC_NAMES.get(r.func, "Other")
        args: dict[str, Any] = {}
        if kind == RecordKind.COLL:
            name = func
            args = {
                "seq": r.seq,
                "bytes": r.bytes,
                "channels": r.extra,
                "net_wait_ns": r.net_wait_ns,
                "enqueue_ns": r.enqueue_ns,
            }
            if r.gpu_stop_ns > r.gpu_start_ns > 0:
                args["gpu_ns"] = r.gpu_stop_ns - r.gpu_start_ns
        elif kind == RecordKind.P2P:
            name = func
            args = {"peer": r.extra, "bytes": r.bytes, "net_wait_ns": r.net_wait_ns}
        elif kind == RecordKind.KERNEL_CH:
            name = f"{func} channel {r.channel}"
            args = {"seq": r.seq, "channel": r.channel}
            if r.gpu_stop_ns > r.gpu_start_ns > 0:
                args["gpu_ns"] = r.gpu_stop_ns - r.gpu_start_ns
        else:
            name = f"step {r.extra} channel {r.channel}"
            args = {
                "seq": r.seq,
                "bytes": r.bytes,
                "net_wait_ns": r.net_wait_ns,
                "last_state": STEP_STATES.get(r.func, str(r.func)),
            }
        events.append(
            {
                "ph": "X",
                "cat": CAT_NCCL_PROFILER,
                "name": name,
                "pid": pid,
                "tid": TID_BASE + kind,
                "ts": (r.start_ns + realtime_offset_ns - base_ns) / 1000,
                "dur": r.duration_ns / 1000,
                "args": args,
            }
        )
    for kind in sorted(rows):
        events.append(
            {
                "ph": "M",
                "name": "thread_name",
                "pid": pid,
                "tid": TID_BASE + kind,
                "args": {"name": ROWS[kind]},
            }
        )
    return events
