"""`KernelTracks`: the trace tracker's listener that records and merges the kernel tracks.

For every process whose trace asked for kernel tracks:

1. when its config is stored (``requested``), the `CaptureManager` starts recording it; the
   config is handed out only once that recording is in place (``armed``), so the trace's
   window — which begins when the process takes its config, at the earliest — is recorded
   from its first moment;
2. when its final file exists (the tracker turns it ``merging``), recording stops and, on
   a merge thread, the recorded events inside the trace's window (the profiler's own span,
   read from the file's tail) are written into the file (`bpfdyno.tracing.merge`), together
   with the flight recorder's rare network events of the pre-window;
3. the tracker is told the outcome (``merge_done``) and the part becomes ``written``: with
   its tracks, or — if anything failed — with the file exactly as Kineto wrote it and the
   reason in the part's kernel-track status.

Merges run in the file owner's lane of the agent's `UserLanes` (`bpfdyno.core.workers`):
one user's merges one after another, users taking turns for the threads, so a user whose
file blocks or takes long (a slow file system, a huge trace) delays only its own traces.

If its trace fails or times out instead (``ended``), the recording is dropped.

With the ``nccl`` track asked for and NCCL's profiler plugin loaded in the process
(`bpfdyno.tracing.nccl_track`), the plugin is asked for full mode at (1), and its records
inside the window are merged at (2) as rows of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import time
from concurrent.futures import Future

import orjson

from bpfdyno.analysis.tracefile import DEFAULT_LIMITS, ReadLimits
from bpfdyno.core.budget import excluded_work, reader
from bpfdyno.core.events import FlightRecorder, KernelEvent
from bpfdyno.core.identity import FileIdentityError, file_owner, files_as, owner_or_root
from bpfdyno.core.rootfs import within_root
from bpfdyno.core.workers import StoppedError, UserLanes, wait_bounded
from bpfdyno.rpc.traces import KernelTracks as TrackStatus
from bpfdyno.sources.net.decode import NET_EVENT_KINDS
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import ALL_TRACKS, TRACK_OF, ProcessCapture, Track
from bpfdyno.tracing.capture.tracks import INFO_NAME, Sink, Window, late_start_ns, write_tracks
from bpfdyno.tracing.merge import Insertion, MergeError, TraceLayout, merge_into_trace
from bpfdyno.tracing.nccl_track import NcclRecords, NcclTrack
from bpfdyno.tracing.traces import KernelTrackState, PartRef, TraceTracker

log = logging.getLogger(__name__)

#: Longest wait for the capture's records once a file is complete (they come in
#: milliseconds; this only keeps a part from staying "merging" if the capture is stuck).
END_TIMEOUT_S = 60.0
#: At shutdown, merges in progress get this long to finish; the agent stops without the
#: others (a merge writes a copy and renames it: the trace stays as Kineto wrote it).
STOP_GRACE_S = 1.0


class KernelTracks:
    """Records the kernel tracks of traced processes and merges them into their files.

    Args:
        manager: records the tracks.
        tracker: told when a merge is done.
        recorder: the flight recorder (rare events of the pre-window), if the daemon has one.
        limits: bounds on reading a trace file.
        lanes: where merges run, in the file owner's lane (default: lanes of its own).
    """

    def __init__(
        self,
        manager: CaptureManager,
        tracker: TraceTracker,
        recorder: FlightRecorder | None = None,
        limits: ReadLimits = DEFAULT_LIMITS,
        lanes: UserLanes | None = None,
    ) -> None:
        self._manager = manager
        self._tracker = tracker
        self._recorder = recorder
        self._limits = limits
        self._lanes = lanes or UserLanes("trace-merge")
        self._tasks: set[asyncio.Task[None]] = set()
        #: Recordings asked for whose process has not been handed its config yet.
        self._arming: dict[CaptureKey, Future[None]] = {}
        #: Merges done and failed (for status).
        self.merged = 0
        self.failed = 0
        #: NCCL's profiler plugin in full mode for traced processes (set by the assembly when
        #: the nccl_profiler collector runs).
        self.nccl: NcclTrack | None = None

    # -- TraceListener -------------------------------------------------------------------

    def requested(self, part: PartRef) -> None:
        """Start recording the process."""
        key = _capture_key(part)
        self._arming[key] = self._manager.begin(key, part.tracks)
        if self.nccl is not None and Track.NCCL in part.tracks.tracks:
            try:
                self.nccl.begin(part.kernel_pid, part.deadline_mono - time.monotonic())
            except OSError as e:  # its file cannot be read now: the trace goes on without
                log.warning("NCCL profiler full mode not asked of pid %d: %s", part.kernel_pid, e)

    def armed(self, part: PartRef) -> bool:
        """Whether the process's recording is in place (or known not to be possible)."""
        key = _capture_key(part)
        fut = self._arming.get(key)
        if fut is not None and not fut.done():
            return False
        self._arming.pop(key, None)
        return True

    def ended(self, part: PartRef) -> None:
        """Its trace failed or timed out: drop what was recorded."""
        key = _capture_key(part)
        self._arming.pop(key, None)
        self._manager.discard(key)

    def written(self, part: PartRef) -> None:
        """Its file is complete: stop recording and merge (in the background)."""
        self._arming.pop(_capture_key(part), None)
        task = asyncio.get_running_loop().create_task(
            self._finish(part), name=f"merge-{part.trace_id}-{part.pid}"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self) -> None:
        """Give merges in progress `STOP_GRACE_S` to finish, then stop without them."""
        await wait_bounded("kernel-track merges", list(self._tasks), STOP_GRACE_S)
        self._lanes.stop()

    # -- merging --------------------------------------------------------------------------

    async def _finish(self, part: PartRef) -> None:
        outcome = await self._recorded(part)
        nccl = await self._nccl_records(part)
        try:
            status, size = await self._lanes.run(
                owner_or_root(part.owner_uid), self._write, part, outcome, nccl
            )
        except StoppedError:
            return  # the agent is stopping
        if status.state is KernelTrackState.MERGED:
            self.merged += 1
        else:
            self.failed += 1
        self._tracker.merge_done(part.trace_id, part.address, status, size)

    async def _nccl_records(self, part: PartRef) -> NcclRecords | None:
        """What the process's NCCL profiler plugin recorded in full mode, if it was asked."""
        if self.nccl is None or Track.NCCL not in part.tracks.tracks:
            return None
        try:
            return await asyncio.to_thread(self.nccl.end, part.kernel_pid)
        except OSError as e:
            log.warning("NCCL profiler records of pid %d not read: %s", part.kernel_pid, e)
            return None

    async def _recorded(self, part: PartRef) -> ProcessCapture | TrackStatus:
        """What the capture recorded of ``part``'s process, or why there is nothing."""
        requested = part.tracks.names()
        try:
            capture: ProcessCapture = await asyncio.wait_for(
                asyncio.wrap_future(self._manager.end(_capture_key(part))),
                END_TIMEOUT_S,
            )
        except TimeoutError:
            return TrackStatus(
                requested,
                KernelTrackState.NOT_MERGED,
                reason=f"the capture did not hand over its records within {END_TIMEOUT_S:g} s "
                "(see the agent's log)",
            )
        except Exception as e:
            return TrackStatus(
                requested, KernelTrackState.NOT_MERGED, reason=f"nothing was recorded ({e})"
            )
        return capture

    def _write(
        self, part: PartRef, outcome: ProcessCapture | TrackStatus, nccl: NcclRecords | None
    ) -> tuple[TrackStatus, int]:
        """In the owner's lane: merge what was recorded; the outcome and the file's size."""
        if isinstance(outcome, TrackStatus):
            return outcome, _size(part.local_path)
        try:
            status = self.merge(part, outcome, nccl)
        except Exception as e:  # a bug: the file is intact (the merge writes a copy)
            log.exception("merging the kernel tracks into %s failed", part.output_path)
            status = TrackStatus(
                part.tracks.names(), KernelTrackState.NOT_MERGED, reason=f"internal error: {e}"
            )
        return status, _size(part.local_path)

    def merge(
        self, part: PartRef, capture: ProcessCapture, nccl: NcclRecords | None = None
    ) -> TrackStatus:
        """Write ``capture`` into ``part``'s file (blocking); the outcome as a status.

        Work a trace request asked for: not counted against the overhead budget.
        """
        with excluded_work():
            return merge_capture(part, capture, self._recorder, self._limits, nccl)


def merge_capture(
    part: PartRef,
    capture: ProcessCapture,
    recorder: FlightRecorder | None = None,
    limits: ReadLimits = DEFAULT_LIMITS,
    nccl: NcclRecords | None = None,
) -> TrackStatus:
    """Write ``capture`` into ``part``'s file (blocking); the outcome as a status.

    Args:
    part: the process's part of the trace (its file, the tracks asked for).
    capture: what was recorded for it.
    recorder: the flight recorder, for the rare network events of the pre-window.
    limits: how much JSON the file may inflate to (a gzip file).
    nccl: the NCCL profiler plugin's full-mode records of the process, if any.
    """
    requested = part.tracks.names()
    kept = {t: 0 for t in ALL_TRACKS}
    for r in capture.records:
        kept[TRACK_OF[type(r)]] += 1
    merged: list[Track] = []
    notes: list[str] = []
    for track in ALL_TRACKS:
        if track not in part.tracks.tracks:
            continue
        st = capture.stats.get(track)
        note = st.note if st is not None else ""
        if note and not kept[track]:
            notes.append(f"{track.value}: {note}")
        else:
            merged.append(track)
            if note:
                notes.append(f"{track.value}: {note}")
    lost = capture.dropped_over_cap + sum(st.lost_kernel for st in capture.stats.values())
    if lost:
        notes.append(f"{lost} records lost (see the file's '{INFO_NAME}' slice)")
    # NCCL's profiler plugin stands for the nccl track where the uprobes saw nothing (a
    # libnccl they could not attach to): its rows are merged on their own.
    profiler = nccl is not None and Track.NCCL in part.tracks.tracks and bool(nccl.records)
    if not merged and not profiler:
        return TrackStatus(
            requested,
            KernelTrackState.NOT_MERGED,
            lost=lost,
            reason="; ".join(notes) or "no track could be recorded",
        )
    pre = pre_window(capture, recorder)  # the recorder knows the process by its pid here
    if capture.pid != part.pid:
        # The file's own events carry the pid the process knows itself by (its container's):
        # the kernel tracks go into the same process's rows.
        capture = dataclasses.replace(capture, pid=part.pid, host_pid=capture.pid)
    counted: list[int] = []
    profiler_events: list[int] = []

    def build(layout: TraceLayout) -> Insertion:
        if layout.window_ns is not None:
            window = Window(*layout.window_ns, "kineto")
        else:
            shift = capture.offset_ns - layout.base_ns
            window = Window(capture.begin_ns + shift, capture.end_ns + shift, "capture")
        began = late_start_ns(capture, layout.base_ns, window)
        if began:  # (build is called once per merge)
            notes.append(
                f"recording began {began / 1e9:.2f} s into the trace's "
                f"{(window.end_ns - window.start_ns) / 1e9:.2f} s window (its config went out "
                "before the probes were attached): the tracks cover only the rest"
            )

        def write(sink: Sink) -> None:  # streamed into the file, row by row
            counts, _ = write_tracks(capture, layout.base_ns, window, merged, sink, pre)
            extra = (
                nccl.events(part.pid, layout.base_ns, (window.start_ns, window.end_ns))
                if nccl is not None and profiler
                else []
            )
            for event in extra:
                sink(orjson.dumps(event))
            profiler_events.append(sum(e["ph"] == "X" for e in extra))
            counted.append(sum(counts.values()) + profiler_events[0])

        # Without a rank, HTA and co. cannot tell the files of a job apart (see
        # capture.manager.distributed_info); Kineto's own distributedInfo always wins.
        members = {"distributedInfo": capture.distributed} if capture.distributed else {}
        return Insertion(write, members)

    try:
        # As the file's owner: its directory is theirs, so every lookup there must be too.
        # Inside the process's own root when it is in a container (its absolute links
        # must not lead to the host's files).
        with (
            files_as(*file_owner(part.owner_uid, part.local_path)),
            within_root(part.local_path, part.output_path) as path,
        ):
            _, result = merge_into_trace(path, build, limits)
    except OSError as e:  # FileIdentityError, or the directory cannot be resolved in its root
        log.warning("kernel tracks of pid %d not merged: %s", part.pid, e)
        reason = str(e) if isinstance(e, FileIdentityError) else f"{part.output_path}: {e.strerror}"
        return TrackStatus(requested, KernelTrackState.NOT_MERGED, lost=lost, reason=reason)
    except MergeError as e:
        # A path inside a container's root reads /proc/self/fd/N/...: say it as the user does.
        reason = _IN_ROOT.sub(os.path.dirname(part.output_path) + "/", str(e))
        log.warning("kernel tracks of pid %d not merged: %s", part.pid, reason)
        return TrackStatus(requested, KernelTrackState.NOT_MERGED, lost=lost, reason=reason)
    log.info(
        "trace %s: %d kernel-track events merged into %s in %.2f s",
        part.trace_id,
        counted[0] if counted else 0,
        part.output_path,
        result.seconds,
    )
    if profiler_events and profiler_events[0]:
        merged.append(Track.NCCL)
    return TrackStatus(
        requested,
        KernelTrackState.MERGED,
        tuple(t.value for t in ALL_TRACKS if t in merged),
        events=counted[0] if counted else 0,
        lost=lost,
        reason="; ".join(notes),
    )


def _capture_key(part: PartRef) -> CaptureKey:
    """What the capture records ``part``'s process under: its pid here (the kernel's),
    with the pid it knows itself by beside it, and who asked (the recording is their work)."""
    return CaptureKey(part.trace_id, part.kernel_pid, part.pid, reader(part.requester_uid))


_IN_ROOT = re.compile(r"/proc/self/fd/\d+/")


def pre_window(capture: ProcessCapture, recorder: FlightRecorder | None) -> list[KernelEvent]:
    """The flight recorder's rare network events of the process before recording began."""
    if recorder is None or capture.request.pre_window_s <= 0:
        return []
    since = capture.begin_wall_ns - int(capture.request.pre_window_s * 1e9)
    return [
        e
        for e in recorder.since(since, NET_EVENT_KINDS)
        if e.pid == capture.pid and e.ts_ns < capture.begin_wall_ns
    ]


def _size(path: str) -> int:
    with contextlib.suppress(OSError):
        return os.stat(path).st_size
    return -1
