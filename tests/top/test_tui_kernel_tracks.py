"""The trace panel tells what became of each process's kernel tracks."""

from __future__ import annotations

import io

from rich.console import Console

from bpfdyno.rpc.traces import TraceStart, TraceStatus
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.wire import from_pb
from bpfdyno.tui.model import TraceProgress
from bpfdyno.tui.widgets.trainers import trace_table


def progress(status: pb.TraceStatus) -> TraceProgress:
    """The UI's view of a trace whose state the agent sent as ``status``."""
    return TraceProgress(TraceStart(status.trace_id), from_pb(TraceStatus, status))


def rendered(status: pb.TraceStatus) -> str:
    console = Console(width=160, file=io.StringIO(), record=True, color_system=None)
    console.print(trace_table(progress(status)))
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
    lines = progress(status).lines()
    assert [p.state for p in lines] == ["written", "written", "merging", "written"]
    assert lines[0].kernel_tracks == (
        "kernel tracks net,sched merged (812 events, 3 records lost); "
        "nccl: process 11 maps no libnccl"
    )
    assert lines[3].kernel_tracks == ""
    text = rendered(status)
    assert "kernel tracks net,sched merged (812 events, 3 records lost)" in text
    assert (
        "kernel tracks net not merged: writing the merged copy failed (No space left on device)"
        in text
    )
    assert "kernel tracks sched merging" in text
