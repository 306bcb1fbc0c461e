"""Every trace followed to the end: one trace id per request, one state per process.

The tracker is the one owner of trace state: the config waiting for a process, whether it
was delivered, how its trace is going. The trainer registry knows only who polls.

A process moves ``pending -> delivered -> tracing -> written``, or ends ``failed`` or
``timed_out``. With kernel tracks requested, the final file first makes it ``merging``: the
file is complete as Kineto wrote it and the agent is adding its tracks (see
`bpfdyno.tracing.kernel_tracks`); ``written`` then means the merge finished, or failed with
the original file left intact, and the part's `KernelTracks` says which. Their
recording starts when the trace is opened, and the config stays ``pending`` until the
listener says the recording is in place (`TraceListener.armed`). The evidence
comes from two places:

* the process's polls: a poll with the ACTIVITIES bit clear means its profiler is busy
  (tracing); the bit set again afterwards means it is done;
* the file system: Kineto writes ``<name>.tmp`` and renames it to the final name when the
  trace is complete, so only the final name counts as written.

Kineto reports nothing when it drops a config (a start time too close for its warm-up,
a parse error), so "failed" is inferred: a duration trace that never turned busy within
`NEVER_STARTED_POLLS` polls after delivery (after its warm-up began, for a trace with a start
time: Kineto stays idle until then), or a trace that went busy and then idle
`MISSING_FILE_POLLS` times with no final file. A duration trace that starts on delivery is
handed out again first, up to `MAX_DELIVERIES` times in all (see there). The files are only
looked at while some trace is open (`FILE_POLL_S`).
"""

from __future__ import annotations

import asyncio
import enum
import os
import stat
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from bpfdyno.rpc.traces import (
    KINETO_POLL_INTERVAL_S,
    KINETO_WARMUP_S,
    KernelTracks,
    ProcessTrace,
    ProcessTraceState,
    TrainerState,
)
from bpfdyno.tracing.capture.records import NO_TRACKS, KernelTrackRequest
from bpfdyno.tracing.paths import TMP_SUFFIX

#: How often open traces' files are checked.
FILE_POLL_S = 0.5
#: Idle polls after delivery with no sign of tracing before a duration trace is "failed".
#: (A healthy client turns busy one or two polls after delivery; one more when it reads
#: its replies one poll late.)
NEVER_STARTED_POLLS = 4
#: How many times in all a duration trace that starts on delivery (no PROFILE_START_TIME) is
#: handed out while the process never starts it. Kineto starts such a trace 7 s after it
#: reads the config and begins the 5 s warm-up at a tick of its profiler thread that must
#: come within 1 s of when it is due; a later tick drops the config ("insufficient time for
#: warmup"), as it does whenever the trainer is stalled or starved across that tick. The
#: request still means "now", so it is handed out again; a trace with a start time is not
#: (its time has passed by then), nor an iteration trace (it never counts as not started).
MAX_DELIVERIES = 3
#: Idle polls after tracing ended, with no final file, before the trace is "failed".
MISSING_FILE_POLLS = 2
#: Most traces remembered; the oldest finished ones are forgotten first.
MAX_TRACES = 256
#: A trace with a start time is kept back for its recording only while its start is further
#: ahead than this: Kineto's warm-up (5 s), the 1 s within which its profiler thread must
#: begin it, a poll at PyTorch's default interval (5 s) and 1 s to spare. Kept back longer,
#: its config would reach the process too late, and Kineto would drop it; handed out now, the
#: window may begin before the recording (attaching the probes, compiling them on a fresh
#: agent: 6 s seen with three agents on two CPUs) — its kernel tracks start late, the trace is
#: written.
TIMED_HOLD_S = KINETO_WARMUP_S + 1.0 + KINETO_POLL_INTERVAL_S + 1.0
#: A pending part's reason while its config is kept back for its recording.
WAITING_FOR_RECORDING = (
    "waiting for its kernel-track recording to start (attaching the probes); the config goes "
    "out at the process's next poll after that"
)


#: The tracker keeps its state in the API's own words and records (`bpfdyno.rpc.traces`):
#: what it reports needs no translation.
ProcState = ProcessTraceState
KernelTrackStatus = KernelTracks
__all__ = ["KernelTrackStatus", "ProcState", "ProcessTrace", "TrainerState"]


class KernelTrackState(enum.StrEnum):
    """Where a process's kernel tracks stand."""

    OFF = "off"  # none requested (or the capture is disabled)
    RECORDING = "recording"  # being recorded since its config was stored
    MERGING = "merging"  # being added to the finished file
    MERGED = "merged"  # in the file
    NOT_MERGED = "not merged"  # the file is as Kineto wrote it; ``reason`` says why


@dataclass(frozen=True, slots=True)
class TraceView:
    """A trace as reported to clients (``requester_uid``: who asked for it, None when that
    was not known; it decides who may see the trace)."""

    trace_id: str
    created_unix_seconds: float
    deadline_unix_seconds: float  # after which open processes time out
    iteration_mode: bool
    processes: tuple[ProcessTrace, ...]
    version: int
    requester_uid: int | None = None

    @property
    def done(self) -> bool:
        return all(p.state.terminal for p in self.processes)


@dataclass(slots=True)
class _Proc:
    view: ProcessTrace
    address: bytes
    config_text: str  # what the process is handed at its next free poll
    tracks: KernelTrackRequest = NO_TRACKS
    owner_uid: int | None = None  # the traced process's owner: its file must be theirs
    fs_root: str = ""  # see `NewProcess.fs_root`
    host_pid: int = 0  # see `NewProcess.host_pid`
    waits_for_recording: bool = False  # it polled for its config before its recording began
    idle_polls: int = 0  # idle polls since delivery, before any sign of tracing
    deliveries: int = 0  # times its config was handed out
    #: The .tmp a dropped config left behind, as (inode, mtime ns) when it was handed out
    #: again: it is no sign that the next delivery is being traced.
    stale_tmp: tuple[int, int] | None = None
    idle_after_busy: int = 0
    seen_busy: bool = False


@dataclass(slots=True)
class _Trace:
    trace_id: str
    created: float
    deadline_mono: float
    deadline_wall: float
    iteration_mode: bool
    procs: dict[bytes, _Proc]
    #: PROFILE_START_TIME in epoch seconds; 0: the trace starts when the process gets it.
    start_time_s: float = 0.0
    requester_uid: int | None = None
    version: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> TraceView:
        return TraceView(
            trace_id=self.trace_id,
            created_unix_seconds=self.created,
            deadline_unix_seconds=self.deadline_wall,
            iteration_mode=self.iteration_mode,
            processes=tuple(p.view for p in self.procs.values()),
            version=self.version,
            requester_uid=self.requester_uid,
        )

    @property
    def open(self) -> bool:
        return any(not p.view.state.terminal for p in self.procs.values())

    def touch(self) -> None:
        """A part changed: a new version, and whoever waits for one is woken."""
        self.version += 1
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass(frozen=True, slots=True)
class NewProcess:
    """A process a new trace is for, the config text it will be handed, its kernel tracks."""

    address: bytes
    pid: int
    job_id: int
    output_path: str
    config_text: str
    tracks: KernelTrackRequest = NO_TRACKS
    owner_uid: int | None = None
    #: Where the agent reaches the process's file system (`bpfdyno.tracing.safety.mount_root`):
    #: "" for its own, ``/proc/<pid>/root`` for a process in a container of its own.
    fs_root: str = ""
    #: Its pid in the agent's pid namespace, from the kernel's credentials of its polls
    #: (``pid`` is the one it reports, its own namespace's); 0 when unknown (in-process
    #: callers), then ``pid`` is taken as it.
    host_pid: int = 0


@dataclass(frozen=True, slots=True)
class PartRef:
    """A process's part of a trace, as handed to a `TraceListener`."""

    trace_id: str
    address: bytes
    pid: int
    output_path: str
    tracks: KernelTrackRequest
    owner_uid: int | None = None  # the traced process's owner (None: unknown, treat as root)
    fs_root: str = ""  # see `NewProcess.fs_root`
    host_pid: int = 0  # see `NewProcess.host_pid`
    deadline_mono: float = 0.0  # when the trace times out (time.monotonic)
    requester_uid: int | None = None  # who asked for the trace (its recording is their work)

    @property
    def kernel_pid(self) -> int:
        """The process as the kernel and /proc here know it: what its recording follows."""
        return self.host_pid or self.pid

    @property
    def local_path(self) -> str:
        """The file as this agent reaches it (``output_path`` is as the process names it)."""
        return self.fs_root + self.output_path


class TraceListener(Protocol):
    """Told about the parts that asked for kernel tracks (see `bpfdyno.tracing.kernel_tracks`).

    Called on the event loop; none may block.
    """

    def requested(self, part: PartRef) -> None:
        """A config is stored for the process: start recording it."""

    def armed(self, part: PartRef) -> bool:
        """Whether its recording is in place: its config is handed out only then, so that
        the trace's window never begins before the recording does."""

    def written(self, part: PartRef) -> None:
        """Its final file exists: stop recording and merge; then call
        `TraceTracker.merge_done`."""

    def ended(self, part: PartRef) -> None:
        """Its trace failed or timed out: stop recording, merge nothing."""


@dataclass(frozen=True, slots=True)
class OpenPart:
    """A process's part of a trace that has not ended (and who asked for that trace)."""

    trace_id: str
    state: ProcState
    requester_uid: int | None = None


class TraceTracker:
    """Per-trace, per-process states; fed by the service (polls) and by file checks.

    Args:
        wall: wall-clock time source (epoch seconds).
        mono: monotonic time source.
        stat_file: ``os.lstat`` (replaceable to test without a file system race). Links are
            not followed: a link at the final name is not a written trace.
    """

    def __init__(
        self,
        wall: Callable[[], float],
        mono: Callable[[], float],
        stat_file: Callable[[str], os.stat_result] = os.lstat,
    ) -> None:
        self._wall = wall
        self._mono = mono
        self._stat = stat_file
        self._traces: OrderedDict[str, _Trace] = OrderedDict()
        self._by_address: dict[bytes, str] = {}  # address -> trace id of its open part
        self.opened = asyncio.Event()  # set while some trace is open
        self._listener: TraceListener | None = None
        #: Why kernel tracks cannot be recorded at all ("" when they can).
        self.tracks_off_reason = (
            "kernel tracks are disabled in this agent ([capture] enabled = false)"
        )

    def set_listener(self, listener: TraceListener | None) -> None:
        """Who records and merges kernel tracks (None: nobody; requests for them are noted)."""
        self._listener = listener
        if listener is not None:
            self.tracks_off_reason = ""

    # -- creation and queries -------------------------------------------------------------

    def open_trace(
        self,
        trace_id: str,
        processes: list[NewProcess],
        timeout_s: float,
        iteration_mode: bool,
        start_time_s: float = 0.0,
        requester_uid: int | None = None,
    ) -> TraceView:
        """Start tracking a trace whose configs were just stored for ``processes``.

        ``start_time_s`` is the trace's PROFILE_START_TIME (epoch seconds), 0 for none;
        ``requester_uid`` who asked for it (it decides who may see the trace).
        """
        now = self._wall()
        procs = {
            p.address: _Proc(
                view=ProcessTrace(
                    pid=p.pid,
                    job_id=p.job_id,
                    output_path=p.output_path,
                    state=ProcState.PENDING,
                    reason="config stored; waiting for the process's next poll",
                    updated_unix_seconds=now,
                ),
                address=p.address,
                config_text=p.config_text,
                tracks=p.tracks,
                owner_uid=p.owner_uid,
                fs_root=p.fs_root,
                host_pid=p.host_pid,
            )
            for p in processes
        }
        for p in procs.values():
            p.view = replace(p.view, kernel_tracks=self._initial_tracks(p.tracks))
        tr = _Trace(
            trace_id=trace_id,
            created=now,
            deadline_mono=self._mono() + timeout_s,
            deadline_wall=now + timeout_s,
            iteration_mode=iteration_mode,
            procs=procs,
            start_time_s=start_time_s,
            requester_uid=requester_uid,
        )
        self._traces[trace_id] = tr
        for address in procs:
            self._by_address[address] = trace_id
        listener = self._listener
        if listener is not None:
            for p in procs.values():
                if p.tracks.enabled:
                    listener.requested(self._ref(tr, p))
        self._forget_old()
        if tr.open:
            self.opened.set()
        return tr.view()

    def _initial_tracks(self, tracks: KernelTrackRequest) -> KernelTracks:
        if not tracks.enabled:
            return KernelTracks(state=KernelTrackState.OFF)
        if self._listener is None:
            return KernelTracks(
                tracks.names(), KernelTrackState.NOT_MERGED, reason=self.tracks_off_reason
            )
        return KernelTracks(tracks.names(), KernelTrackState.RECORDING)

    def _recording(self, p: _Proc) -> bool:
        return self._listener is not None and p.tracks.enabled

    def _ref(self, tr: _Trace, p: _Proc) -> PartRef:
        return PartRef(
            tr.trace_id,
            p.address,
            p.view.pid,
            p.view.output_path,
            p.tracks,
            p.owner_uid,
            p.fs_root,
            p.host_pid,
            tr.deadline_mono,
            tr.requester_uid,
        )

    def _forget_old(self) -> None:
        while len(self._traces) > MAX_TRACES:
            victim = next((t for t in self._traces.values() if not t.open), None)
            if victim is None:
                victim = next(iter(self._traces.values()))
            del self._traces[victim.trace_id]
            for address in victim.procs:
                if self._by_address.get(address) == victim.trace_id:
                    del self._by_address[address]

    def get(self, trace_id: str) -> TraceView | None:
        tr = self._traces.get(trace_id)
        return tr.view() if tr else None

    def traces(self) -> list[TraceView]:
        return [t.view() for t in self._traces.values()]

    def files(self, trace_id: str) -> dict[str, tuple[str, int | None]]:
        """Each part's file: where the agent reads it (through the process's root when it
        is in a mount namespace of its own) and its traced process's owner (None: unknown),
        whose rights the agent reads it with."""
        tr = self._traces.get(trace_id)
        procs = tr.procs.values() if tr else ()
        return {p.view.output_path: (p.fs_root + p.view.output_path, p.owner_uid) for p in procs}

    def open_part(self, address: bytes) -> OpenPart | None:
        """The process's part of a trace that has not ended (None: it is free of ours)."""
        part = self._part(address)
        if part is None:
            return None
        return OpenPart(part[0].trace_id, part[1].view.state, part[0].requester_uid)

    def trainer_state(self, address: bytes, profiler_busy: bool) -> TrainerState:
        """What the process at ``address`` is doing, given whether its profiler is busy."""
        if profiler_busy:
            return TrainerState.TRACING
        if self._part(address) is not None:
            return TrainerState.CONFIG_PENDING
        return TrainerState.IDLE

    def has_open(self) -> bool:
        return any(t.open for t in self._traces.values())

    def tracing_pids(self) -> set[int]:
        """Pids whose process is tracing right now for one of our traces."""
        return {
            p.view.pid
            for t in self._traces.values()
            for p in t.procs.values()
            if p.view.state is ProcState.TRACING
        }

    async def wait_change(self, trace_id: str, version: int) -> TraceView | None:
        """Wait until the trace's version differs from ``version``; None if it is unknown."""
        while True:
            tr = self._traces.get(trace_id)
            if tr is None:
                return None
            if tr.version != version:
                return tr.view()
            await tr.changed.wait()

    # -- evidence ---------------------------------------------------------------------------

    def _set(
        self,
        tr: _Trace,
        p: _Proc,
        state: ProcState,
        reason: str,
        size: int = -1,
        kernel_tracks: KernelTracks | None = None,
    ) -> None:
        before = p.view.state
        tracks = p.view.kernel_tracks if kernel_tracks is None else kernel_tracks
        if state in (ProcState.FAILED, ProcState.TIMED_OUT) and self._recording(p):
            tracks = replace(
                tracks, state=KernelTrackState.NOT_MERGED, reason="no trace file to merge into"
            )
        p.view = replace(
            p.view,
            state=state,
            reason=reason,
            size_bytes=size,
            updated_unix_seconds=self._wall(),
            kernel_tracks=tracks,
        )
        if state.terminal and self._by_address.get(p.address) == tr.trace_id:
            del self._by_address[p.address]
        listener = self._listener
        if listener is not None and p.tracks.enabled:
            if state is ProcState.MERGING:
                listener.written(self._ref(tr, p))
            elif state in (ProcState.FAILED, ProcState.TIMED_OUT) and before in (
                ProcState.PENDING,
                ProcState.DELIVERED,
                ProcState.TRACING,
            ):
                listener.ended(self._ref(tr, p))
        tr.touch()

    def _part(self, address: bytes) -> tuple[_Trace, _Proc] | None:
        trace_id = self._by_address.get(address)
        tr = self._traces.get(trace_id) if trace_id else None
        p = tr.procs.get(address) if tr else None
        return (tr, p) if tr and p else None

    def take_config(self, address: bytes) -> tuple[str, str] | None:
        """Hand out the process's pending config, once: (trace id, config text), or None.

        Call only when the process's profiler is free (a busy client drops a config).
        """
        part = self._part(address)
        if part is None or part[1].view.state is not ProcState.PENDING:
            return None
        tr, p = part
        listener = self._listener
        early = ""
        if self._recording(p) and listener is not None and not listener.armed(self._ref(tr, p)):
            if not tr.start_time_s or tr.start_time_s - self._wall() > TIMED_HOLD_S:
                if not p.waits_for_recording:
                    p.waits_for_recording = True
                    p.view = replace(p.view, reason=WAITING_FOR_RECORDING)
                    tr.touch()
                return None
            early = (
                " before its kernel-track recording was in place (its start is too close to "
                "wait: Kineto would drop a later config; the tracks begin when the probes are "
                "attached)"
            )
        p.deliveries += 1
        again = f" again ({p.deliveries} of {MAX_DELIVERIES})" if p.deliveries > 1 else ""
        self._set(
            tr,
            p,
            ProcState.DELIVERED,
            f"config delivered{again}{early}; waiting for tracing to start",
        )
        return tr.trace_id, p.config_text

    def on_poll(self, address: bytes, busy: bool) -> bool:
        """Account a poll of a process with an open part; True when that part just ended.

        Args:
            address: the process.
            busy: its activity profiler is busy (ACTIVITIES bit clear).
        """
        part = self._part(address)
        if part is None:
            return False
        tr, p = part
        state = p.view.state
        if state in (ProcState.PENDING, ProcState.MERGING):
            return False
        if self._check_file(tr, p):
            return True
        if busy:
            p.seen_busy = True
            p.idle_after_busy = 0
            if state is ProcState.DELIVERED:
                self._set(tr, p, ProcState.TRACING, "the process's profiler is tracing")
            return False
        if p.seen_busy:
            p.idle_after_busy += 1
            if p.idle_after_busy >= MISSING_FILE_POLLS:
                self._set(
                    tr,
                    p,
                    ProcState.FAILED,
                    f"the process finished tracing but {p.view.output_path} never appeared "
                    "(check free space and permissions in that directory, and the trainer's "
                    "log)",
                )
                return True
            return False
        if tr.start_time_s and self._wall() < tr.start_time_s - KINETO_WARMUP_S:
            return False  # Kineto waits, idle, until its warm-up before the start time
        p.idle_polls += 1
        # Never busy since delivery: Kineto did not start, even if it left an empty .tmp
        # behind (it does when it drops a config for want of warm-up time).
        if not tr.iteration_mode and p.idle_polls >= NEVER_STARTED_POLLS:
            tmp = self._tmp_identity(p)
            left = " (it left an unfinished .tmp)" if tmp is not None else ""
            if not tr.start_time_s and p.deliveries < MAX_DELIVERIES:
                p.idle_polls = 0
                p.stale_tmp = tmp
                self._set(
                    tr,
                    p,
                    ProcState.PENDING,
                    f"the process did not start tracing ({NEVER_STARTED_POLLS} polls after "
                    f"delivery){left}: Kineto dropped the config, most likely because the "
                    "trainer was too busy or stalled to begin its warm-up on time; handing it "
                    "out again at its next free poll",
                )
                return False
            times = f", handed out {p.deliveries} times" if p.deliveries > 1 else ""
            p.view = replace(p.view, config_dropped=True)  # a job may trace again (jobtrace)
            self._set(
                tr,
                p,
                ProcState.FAILED,
                f"the process never started tracing ({p.idle_polls} polls after delivery"
                f"{times}){left}; Kineto dropped the config — see the trainer's log (e.g. "
                "'insufficient time for warmup' when PROFILE_START_TIME is too close or the "
                "trainer is stalled, or 'profiler busy')",
            )
            return True
        return False

    def _tmp_identity(self, p: _Proc) -> tuple[int, int] | None:
        """The process's .tmp as (inode, mtime ns), None when there is none."""
        try:
            st = self._stat(p.fs_root + p.view.output_path + TMP_SUFFIX)
        except OSError:
            return None
        return st.st_ino, st.st_mtime_ns

    def on_gone(self, address: bytes) -> None:
        """The process stopped polling (it expired from the registry)."""
        part = self._part(address)
        if part and part[1].view.state is ProcState.MERGING:
            return  # the file is complete; the merge does not need the process
        if part and not self._check_file(*part):
            self._set(
                *part,
                ProcState.FAILED,
                "the process stopped polling (it exited?) before its trace was written",
            )

    def pending_output(self, address: bytes) -> tuple[str, str, tuple[int, int] | None] | None:
        """(trace id, output path, the .tmp its dropped delivery left as (inode, mtime ns) or
        None) of the config waiting for this process, if any."""
        part = self._part(address)
        if part is None or part[1].view.state is not ProcState.PENDING:
            return None
        return part[0].trace_id, part[1].view.output_path, part[1].stale_tmp

    def fail_open(self, address: bytes, reason: str) -> None:
        """End the process's open part of a trace as failed, saying why."""
        part = self._part(address)
        if part is not None:
            self._set(*part, ProcState.FAILED, reason)

    def _check_file(self, tr: _Trace, p: _Proc) -> bool:
        """Look for the final file (→ written) and the .tmp (→ tracing); True when written."""
        path = p.view.output_path
        try:
            st = self._stat(p.fs_root + path)
        except OSError:
            st = None
        if st is not None and stat.S_ISREG(st.st_mode):
            if p.owner_uid is not None and st.st_uid != p.owner_uid:
                # Someone else put a file there: it is not this trace, whatever it holds.
                self._set(
                    tr,
                    p,
                    ProcState.FAILED,
                    f"{path} appeared owned by uid {st.st_uid}, not by the traced process's "
                    f"owner (uid {p.owner_uid}): it is not this trace (rule 'foreign_file')",
                )
                return True
            if self._recording(p):
                self._set(
                    tr,
                    p,
                    ProcState.MERGING,
                    f"Kineto wrote the trace file; adding the kernel tracks "
                    f"({', '.join(p.tracks.names())})",
                    st.st_size,
                    replace(p.view.kernel_tracks, state=KernelTrackState.MERGING),
                )
                return False
            self._set(tr, p, ProcState.WRITTEN, "trace file written", st.st_size)
            return True
        if p.view.state is ProcState.DELIVERED:
            tmp = self._tmp_identity(p)
            if tmp is None or tmp == p.stale_tmp:
                return False
            self._set(tr, p, ProcState.TRACING, f"Kineto is writing {path}{TMP_SUFFIX}")
        return False

    def merge_done(self, trace_id: str, address: bytes, tracks: KernelTracks, size: int) -> None:
        """The kernel tracks' merge of a part ended (merged, or not with the file intact)."""
        tr = self._traces.get(trace_id)
        p = tr.procs.get(address) if tr else None
        if tr is None or p is None or p.view.state is not ProcState.MERGING:
            return
        if tracks.state is KernelTrackState.MERGED:
            reason = f"trace file written with the kernel tracks {', '.join(tracks.merged)}"
        else:
            reason = f"trace file written; kernel tracks not merged: {tracks.reason}"
        self._set(tr, p, ProcState.WRITTEN, reason, size, tracks)
        if not self.has_open():
            self.opened.clear()

    def check(self) -> None:
        """Check every open part's files and deadline (called every `FILE_POLL_S`)."""
        now = self._mono()
        for tr in list(self._traces.values()):
            for p in tr.procs.values():
                if p.view.state.terminal or p.view.state is ProcState.MERGING:
                    continue  # a merge always ends (merged, or the file left as it was)
                if self._check_file(tr, p):
                    continue
                if now >= tr.deadline_mono:
                    self._set(tr, p, ProcState.TIMED_OUT, _timeout_reason(p, tr))
        if not self.has_open():
            self.opened.clear()

    async def run_file_checks(self) -> None:
        """Check files every `FILE_POLL_S` while a trace is open; sleep otherwise."""
        while True:
            await self.opened.wait()
            await asyncio.sleep(FILE_POLL_S)
            self.check()


def _timeout_reason(p: _Proc, tr: _Trace) -> str:
    state = p.view.state
    if state is ProcState.PENDING and p.waits_for_recording:
        return (
            "timed out: the kernel-track recording never started, so the config was kept "
            "back (see the capture in `bpfdyno status` and the agent's log)"
        )
    if state is ProcState.PENDING:
        return "timed out: the process never polled again to take its config"
    if state is ProcState.DELIVERED and tr.iteration_mode:
        return (
            "timed out waiting for tracing to start: an iteration trace needs optimizer "
            "steps (and waits for the start-iteration round-up)"
        )
    if state is ProcState.DELIVERED:
        return "timed out: the process took the config but never started tracing"
    return "timed out while the process was tracing; the file may still appear later"
