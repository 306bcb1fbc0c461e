"""How the tracker follows a part that asked for kernel tracks: recording from the request,
the config kept back until the recording is in place, merging after the file, written after
the merge, the listener told at each step; the request's track rules."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bpfdyno.core.errors import InvalidArgument
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest, TracingService
from bpfdyno.tracing.capture.records import NO_TRACKS, KernelTrackRequest, Track
from bpfdyno.tracing.ipc.wire import KinetoRequest
from bpfdyno.tracing.safety import PROTECTIONS, PlacementChecker
from bpfdyno.tracing.traces import (
    MAX_DELIVERIES,
    NEVER_STARTED_POLLS,
    TIMED_HOLD_S,
    WAITING_FOR_RECORDING,
    KernelTrackState,
    KernelTrackStatus,
    PartRef,
    ProcState,
)
from bpfdyno.tracing.trainers import TrainerRegistry

IDLE, BUSY = 3, 1
PID = 200
ADDR = b"\0dynoconfigclient-200\0"
DEFAULT = KernelTrackRequest(frozenset({Track.NET, Track.SCHED}), 5.0)


class Listener:
    """Records what the tracker told it (the capture itself is tested elsewhere); its
    recordings are in place at once unless ``ready`` is cleared."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, PartRef]] = []
        self.ready = True

    def requested(self, part: PartRef) -> None:
        self.calls.append(("requested", part))

    def armed(self, part: PartRef) -> bool:
        return self.ready

    def written(self, part: PartRef) -> None:
        self.calls.append(("written", part))

    def ended(self, part: PartRef) -> None:
        self.calls.append(("ended", part))


@pytest.fixture
def svc(tmp_path: Path) -> TracingService:
    (tmp_path / "proc").mkdir()
    return TracingService(
        allowed_dirs=[str(tmp_path)],
        default_timeout_s=60.0,
        registry=TrainerRegistry(max_entries=16, expire_after_s=60.0),
        proc_root=tmp_path / "proc",
        default_tracks=DEFAULT,
        # As on a host with the kernel's link protections on (a memory snapshot can only go to
        # Kineto's fixed /tmp path, which the placement rules allow only then).
        placement=PlacementChecker(tmp_path / "proc", protections=lambda: dict(PROTECTIONS)),
    )


def poll(svc: TracingService, ctype: int = IDLE) -> str:
    return svc.on_request(ADDR, KinetoRequest(ctype, 0, (PID,)))


def start(svc: TracingService, tmp_path: Path, **kw: object) -> str:
    poll(svc)
    opts = TraceSpec(log_file=str(tmp_path / "t.json"), iterations=2)
    res = svc.start_trace(TraceRequest(options=opts, **kw))  # type: ignore[arg-type]
    assert [p.pid for p in res.triggered] == [PID]
    return res.trace_id


def test_merging_between_the_file_and_written(svc: TracingService, tmp_path: Path) -> None:
    listener = Listener()
    svc.tracker.set_listener(listener)
    trace_id = start(svc, tmp_path)
    [p] = svc.get_trace(trace_id).processes
    assert p.kernel_tracks == KernelTrackStatus(("net", "sched"), KernelTrackState.RECORDING)
    assert [(c, r.pid, r.tracks) for c, r in listener.calls] == [("requested", PID, DEFAULT)]
    assert "REQUEST_TRACE_ID" in poll(svc)  # delivered
    assert [c for c, _ in listener.calls] == ["requested"]
    poll(svc, BUSY)
    path = tmp_path / f"t_{PID}.json"
    path.write_text("{}")
    poll(svc)
    [p] = svc.get_trace(trace_id).processes
    assert p.state is ProcState.MERGING
    assert p.reason == "Kineto wrote the trace file; adding the kernel tracks (net, sched)"
    assert p.kernel_tracks.state is KernelTrackState.MERGING
    assert [c for c, _ in listener.calls] == ["requested", "written"]
    assert listener.calls[1][1].output_path == str(path)
    assert not svc.get_trace(trace_id).done
    svc.tracker.check()  # no timeout, no second "written" while merging
    poll(svc)
    assert [c for c, _ in listener.calls] == ["requested", "written"]
    done = KernelTrackStatus(("net", "sched"), KernelTrackState.MERGED, ("net", "sched"), 42)
    svc.tracker.merge_done(trace_id, ADDR, done, 1234)
    view = svc.get_trace(trace_id)
    [p] = view.processes
    assert view.done
    assert (p.state, p.size_bytes, p.kernel_tracks) == (ProcState.WRITTEN, 1234, done)
    assert p.reason == "trace file written with the kernel tracks net, sched"


def test_the_config_waits_for_the_recording(svc: TracingService, tmp_path: Path) -> None:
    """Kineto starts its window when it takes the config at the earliest: while the capture
    is still attaching (say NCCL's uprobes), polls get nothing and the part says why."""
    listener = Listener()
    listener.ready = False
    svc.tracker.set_listener(listener)
    trace_id = start(svc, tmp_path)
    assert poll(svc) == ""
    [p] = svc.get_trace(trace_id).processes
    assert (p.state, p.reason) == (ProcState.PENDING, WAITING_FOR_RECORDING)
    version = svc.get_trace(trace_id).version
    assert poll(svc) == ""
    assert svc.get_trace(trace_id).version == version  # said once, not at every poll
    listener.ready = True
    assert "REQUEST_TRACE_ID" in poll(svc)
    [p] = svc.get_trace(trace_id).processes
    assert p.state is ProcState.DELIVERED
    assert [c for c, _ in listener.calls] == ["requested"]


def _timed(svc: TracingService, tmp_path: Path, ahead_s: float) -> str:
    """A duration trace starting ``ahead_s`` from now, while the recording is not in place."""
    listener = Listener()
    listener.ready = False
    svc.tracker.set_listener(listener)
    poll(svc)
    start_ms = int((time.time() + ahead_s) * 1000)
    opts = TraceSpec(log_file=str(tmp_path / "t.json"), profile_start_time_ms=start_ms)
    return svc.start_trace(TraceRequest(options=opts)).trace_id


def test_a_timed_config_far_enough_ahead_waits_for_the_recording(
    svc: TracingService, tmp_path: Path
) -> None:
    trace_id = _timed(svc, tmp_path, TIMED_HOLD_S + 30)
    assert poll(svc) == ""
    [p] = svc.get_trace(trace_id).processes
    assert (p.state, p.reason) == (ProcState.PENDING, WAITING_FOR_RECORDING)


def test_a_timed_config_too_close_to_wait_is_handed_out_before_the_recording(
    svc: TracingService, tmp_path: Path
) -> None:
    """Found on a fresh agent: attaching (and first compiling) the capture took 6 s, so a job
    trace's config, planned 12 s ahead of its start, reached its process with less than
    Kineto's warm-up and its 1 s tick to spare, and Kineto dropped it on every rank. A timed
    config is kept back for its recording only while its start is more than TIMED_HOLD_S
    away; closer, it goes out at once and its kernel tracks begin when the probes are in."""
    trace_id = _timed(svc, tmp_path, TIMED_HOLD_S - 1)
    assert "PROFILE_START_TIME=" in poll(svc)
    [p] = svc.get_trace(trace_id).processes
    assert p.state is ProcState.DELIVERED
    assert p.reason == (
        "config delivered before its kernel-track recording was in place (its start is too "
        "close to wait: Kineto would drop a later config; the tracks begin when the probes "
        "are attached); waiting for tracing to start"
    )
    assert p.kernel_tracks.state is KernelTrackState.RECORDING


def test_a_recording_that_never_starts_times_out_saying_so(
    svc: TracingService, tmp_path: Path
) -> None:
    listener = Listener()
    listener.ready = False
    svc.tracker.set_listener(listener)
    poll(svc)
    opts = TraceSpec(log_file=str(tmp_path / "t.json"), iterations=2)
    res = svc.start_trace(TraceRequest(options=opts, timeout_s=0.001))
    poll(svc)
    time.sleep(0.01)  # past the deadline
    svc.tracker.check()
    [p] = svc.get_trace(res.trace_id).processes
    assert p.state is ProcState.TIMED_OUT
    assert p.reason.startswith("timed out: the kernel-track recording never started")
    assert [c for c, _ in listener.calls] == ["requested", "ended"]  # the recording dropped


def test_a_pending_part_that_ends_drops_its_recording(svc: TracingService, tmp_path: Path) -> None:
    listener = Listener()
    svc.tracker.set_listener(listener)
    start(svc, tmp_path)
    svc.tracker.on_gone(ADDR)  # the process exits before its next poll
    assert [c for c, _ in listener.calls] == ["requested", "ended"]


def test_a_failed_merge_is_still_written_with_why(svc: TracingService, tmp_path: Path) -> None:
    svc.tracker.set_listener(Listener())
    trace_id = start(svc, tmp_path)
    poll(svc)
    (tmp_path / f"t_{PID}.json").write_text("{}")
    svc.tracker.check()
    why = "writing the merged copy failed (No space left on device)"
    svc.tracker.merge_done(
        trace_id, ADDR, KernelTrackStatus(("net",), KernelTrackState.NOT_MERGED, reason=why), 2
    )
    [p] = svc.get_trace(trace_id).processes
    assert p.state is ProcState.WRITTEN
    assert p.reason == f"trace file written; kernel tracks not merged: {why}"


def test_a_failed_trace_drops_its_recording(svc: TracingService, tmp_path: Path) -> None:
    listener = Listener()
    svc.tracker.set_listener(listener)
    poll(svc)
    opts = TraceSpec(log_file=str(tmp_path / "d.json"))  # a duration trace
    trace_id = svc.start_trace(TraceRequest(options=opts)).trace_id
    poll(svc)  # delivered
    for _ in range(NEVER_STARTED_POLLS * MAX_DELIVERIES):
        poll(svc)  # dropped, handed out again while the recording goes on, dropped...
    [p] = svc.get_trace(trace_id).processes
    assert p.state is ProcState.FAILED
    assert p.kernel_tracks.state is KernelTrackState.NOT_MERGED
    assert p.kernel_tracks.reason == "no trace file to merge into"
    assert [c for c, _ in listener.calls] == ["requested", "ended"]


def test_without_a_capture_requests_are_noted(svc: TracingService, tmp_path: Path) -> None:
    trace_id = start(svc, tmp_path)
    poll(svc)
    (tmp_path / f"t_{PID}.json").write_text("{}")
    svc.tracker.check()
    [p] = svc.get_trace(trace_id).processes
    assert p.state is ProcState.WRITTEN  # at once: nothing to merge
    assert p.reason == "trace file written"
    assert p.kernel_tracks.state is KernelTrackState.NOT_MERGED
    assert "disabled" in p.kernel_tracks.reason


def test_none_asked_none_recorded(svc: TracingService, tmp_path: Path) -> None:
    listener = Listener()
    svc.tracker.set_listener(listener)
    trace_id = start(svc, tmp_path, kernel_tracks=())
    poll(svc)
    (tmp_path / f"t_{PID}.json").write_text("{}")
    svc.tracker.check()
    [p] = svc.get_trace(trace_id).processes
    assert (p.state, p.kernel_tracks) == (ProcState.WRITTEN, KernelTrackStatus())
    assert listener.calls == []


def test_request_tracks_and_pre_window(svc: TracingService, tmp_path: Path) -> None:
    listener = Listener()
    svc.tracker.set_listener(listener)
    start(svc, tmp_path, kernel_tracks=("nccl", "gpu"), pre_window_s=0.5)
    [(_, part)] = listener.calls
    assert part.tracks == KernelTrackRequest(frozenset({Track.NCCL, Track.GPU}), 0.5)


@pytest.mark.parametrize(
    ("kw", "rule", "words"),
    [
        ({"kernel_tracks": ("net", "disk")}, "bad_kernel_tracks", "unknown kernel track(s) disk"),
        ({"pre_window_s": -1.0}, "bad_pre_window", "the pre-window must be 0..3600 seconds"),
        ({"pre_window_s": 7200.0}, "bad_pre_window", "got 7200"),
    ],
)
def test_bad_track_requests_are_refused(
    svc: TracingService, tmp_path: Path, kw: dict[str, object], rule: str, words: str
) -> None:
    poll(svc)
    opts = TraceSpec(log_file=str(tmp_path / "t.json"), iterations=2)
    with pytest.raises(InvalidArgument) as e:
        svc.start_trace(TraceRequest(options=opts, **kw))  # type: ignore[arg-type]
    assert e.value.rule == rule and words in str(e.value)
    assert svc.tracker.traces() == []  # nothing stored


def test_a_memory_snapshot_gets_no_tracks(svc: TracingService, tmp_path: Path) -> None:
    poll(svc)
    opts = TraceSpec(log_file=str(tmp_path / "m.json"), profile_memory=True)
    res = svc.start_trace(TraceRequest(options=opts))
    [p] = svc.get_trace(res.trace_id).processes
    assert p.kernel_tracks == KernelTrackStatus()
    assert NO_TRACKS.tracks == frozenset()
