"""The trace panel tells what became of each process's kernel tracks."""

from __future__ import annotations

import io

from rich.console import Console

from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.tui.convert_tracing import trace_from_pb
from bpfdyno.tui.widgets.trainers import trace_table


def rendered(status: pb.TraceStatus) -> str:
    console = Console(width=160, file=io.StringIO(), record=True, color_system=None)
    console.print(trace_table(trace_from_pb(status)))
    return console.export_text()


def test_merged_not_merged_and_merging() -> None:
    status = pb.TraceStatus(
        trace_id="t1",
        done=False,
        processes=[
            pb.ProcessTrace(
                pid=11,
                state=pb.PROCESS_TRACE_STATE_WRITTEN,
                output_path="/tmp/t_11.json",
                size_bytes=2048,
                kernel_tracks=pb.KernelTracks(
                    requested=["net", "sched", "nccl"],
                    state="merged",
                    merged=["net", "sched"],
                    events=812,
                    lost=3,
                    reason="nccl: process 11 maps no libnccl",
                ),
            ),
            pb.ProcessTrace(
                pid=12,
                state=pb.PROCESS_TRACE_STATE_WRITTEN,
                output_path="/tmp/t_12.json",
                kernel_tracks=pb.KernelTracks(
                    requested=["net"],
                    state="not merged",
                    reason="writing the merged copy failed (No space left on device)",
                ),
            ),
            pb.ProcessTrace(
                pid=13,
                state=pb.PROCESS_TRACE_STATE_MERGING,
                output_path="/tmp/t_13.json",
                kernel_tracks=pb.KernelTracks(requested=["sched"], state="merging"),
            ),
            pb.ProcessTrace(pid=14, state=pb.PROCESS_TRACE_STATE_WRITTEN, output_path="/t/x"),
        ],
    )
    record = trace_from_pb(status)
    assert [p.state for p in record.processes] == ["written", "written", "merging", "written"]
    assert record.processes[0].kernel_tracks == (
        "kernel tracks net,sched merged (812 events, 3 records lost); "
        "nccl: process 11 maps no libnccl"
    )
    assert record.processes[3].kernel_tracks == ""
    text = rendered(status)
    assert "kernel tracks net,sched merged (812 events, 3 records lost)" in text
    assert (
        "kernel tracks net not merged: writing the merged copy failed (No space left on device)"
        in text
    )
    assert "kernel tracks sched merging" in text
