"""NCCL's profiler plugin in full mode during a trace, its records merged into the trace file
as rows of the process: the real plugin library, loaded by a real PyTorch trainer and driven
through its v5 entry points as NCCL drives them (`trainers/nccl_plugin_calls.py`, one
AllReduce per step at exact offsets of the plugin's clock); the real tracing component with
its kernel-track capture and merge; the plugin's full mode asked at the trace's start by the
merge's listener, its records read at the end.

Expected exactly: every step inside the profiler's window has its collective (seqNumber =
the step), its kernel channel and its proxy step, each inside the step's annotation, with
the durations, bytes, GPU time and network wait the trainer drove.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kernel_tracks_helpers import events, of_cat, row_names, window_us
from tracing_harness import TRAINERS, Harness

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.sources.nccl_profiler.build import build_plugin
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver
from bpfdyno.tracing.nccl_track import NcclTrack
from bpfdyno.tracing.traces import KernelTrackState, ProcState

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

STEPS = 6
ANNOTATION = "bpfdyno_test:allreduce "


@pytest.fixture
async def harness(short_tmp: Path) -> AsyncIterator[tuple[Harness, Path, Path]]:
    """The capture harness with the plugin's receiver wired into its merge, the plugin
    library, and the plugin's shm directory."""
    library = build_plugin(short_tmp / "lib")
    shm = short_tmp / "shm"
    shm.mkdir()
    h = Harness(short_tmp, capture=True)
    assert h.comp.kernel_tracks is not None
    h.comp.kernel_tracks.nccl = NcclTrack(NcclProfilerReceiver(shm_dir=shm), lambda: [])
    async with h:
        yield h, library, shm


async def test_full_mode_records_are_merged_as_rows_with_exact_values(
    harness: tuple[Harness, Path, Path],
) -> None:
    h, library, shm = harness
    trainer = h.spawn(
        [sys.executable, str(TRAINERS / "nccl_plugin_calls.py"), str(library)],
        extra_env={"BPFDYNO_NCCL_SHM_DIR": str(shm)},
    )
    [pid] = await trainer.wait_ready()
    await h.wait_trainers(lambda ts: [t.pid for t in ts] == [pid])
    res = h.service.start_trace(
        TraceRequest(
            options=TraceSpec(log_file=str(h.trace_dir / "p.json"), iterations=STEPS),
            kernel_tracks=("sched", "nccl"),
        )
    )
    view = await h.wait_done(res.trace_id, timeout=90)
    [p] = view.processes
    assert p.state is ProcState.WRITTEN, p.reason
    # The trainer has no libnccl for the uprobes: the nccl track is the plugin's rows.
    k = p.kernel_tracks
    assert (k.state, k.requested, k.merged) == (
        KernelTrackState.MERGED,
        ("sched", "nccl"),
        ("sched", "nccl"),
    ), k

    evs = events(p.output_path)
    lo, hi = window_us(evs)
    steps = {
        int(e["name"][len(ANNOTATION) :]): (e["ts"], e["ts"] + e["dur"])
        for e in evs
        if e.get("ph") == "X"
        and e.get("pid") == pid
        and str(e.get("name", "")).startswith(ANNOTATION)
        and e["dur"] > 0
    }
    assert len(steps) >= STEPS - 1, sorted(steps)
    rows = row_names(evs, pid)
    nccl = of_cat(evs, "bpfdyno.nccl_profiler")
    by_row: dict[str, list[dict[str, object]]] = {}
    for e in nccl:
        assert e["pid"] == pid
        by_row.setdefault(rows[e["tid"]], []).append(e)
    assert set(by_row) == {"NCCL collectives", "NCCL kernel channels", "NCCL proxy steps"}

    def inside(e: dict[str, object], seq: int) -> bool:
        start, end = steps[seq]
        ts, dur = float(e["ts"]), float(e["dur"])
        return start - 0.002 <= ts and ts + dur <= end + 0.002  # µs rounding of the file

    # One collective per step in the window, each with the step's seqNumber, inside its
    # annotation; the values the trainer drove.
    colls = by_row["NCCL collectives"]
    assert sorted(int(e["args"]["seq"]) for e in colls) == sorted(steps)
    for e in colls:
        args = dict(e["args"])
        assert inside(e, args["seq"]), (e, steps[args["seq"]])
        assert (e["name"], e["dur"]) == ("AllReduce", 5.0)
        del args["seq"]
        assert args == {
            "bytes": 4096,
            "channels": 1,
            "net_wait_ns": 2000,
            "enqueue_ns": 1000,
            "gpu_ns": 3000,
        }
    channels = by_row["NCCL kernel channels"]
    assert sorted(int(e["args"]["seq"]) for e in channels) == sorted(steps)
    for e in channels:
        assert inside(e, e["args"]["seq"])
        assert (e["name"], e["dur"]) == ("AllReduce channel 0", 4.5)
        assert e["args"] == {"seq": e["args"]["seq"], "channel": 0, "gpu_ns": 3000}
    proxy = by_row["NCCL proxy steps"]
    assert sorted(int(e["args"]["seq"]) for e in proxy) == sorted(steps)
    for e in proxy:
        assert inside(e, e["args"]["seq"])
        assert (e["name"], e["dur"]) == ("step 0 channel 0", 2.0)
        args = dict(e["args"])
        del args["seq"]
        assert args == {"bytes": 4096, "net_wait_ns": 2000, "last_state": "SendWait"}
    assert all(lo - 0.002 <= float(e["ts"]) <= hi for e in nccl)
