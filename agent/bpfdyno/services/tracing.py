"""`TracingService`: the transport-free façade over trainers and traces.

The gRPC servicer, the legacy dyno RPC and the CLI all go through it. It is built on the
trainers' side, `bpfdyno.tracing.polls.KinetoPolls`, which the Kineto IPC endpoint feeds
every poll. It runs on the daemon's event loop and never blocks: a poll is answered from
memory, a trace request only stats a few files.

Matching (`bpfdyno.tracing.requests.match_trainers`) follows dynolog, with the fixes its
users ask for:

* pids ``[]`` or ``[0]`` mean "every process of the job"; other pids match a process whose
  own pid *or any ancestor* is listed. With explicit pids and job id 0 the job id is not
  compared (dynolog requires it to match, so ``--pids`` never found a SLURM process).
* Under a process limit, workers are triggered before launchers (a process whose pid is in
  another registered process's ancestry) and DataLoader workers (see `roles`), so torchrun
  agents and data loaders do not take the ranks' slots.
* A process that holds a config or is tracing is "busy" and gets nothing; only processes
  that were really handed a config are reported with a file name — the real one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.tracefile import DEFAULT_LIMITS, ReadLimits
from bpfdyno.analysis.verdict import compare
from bpfdyno.core.budget import REQUESTED, reader
from bpfdyno.core.errors import InvalidArgument, NotFound, PermissionDenied, Unavailable
from bpfdyno.core.identity import (
    FileIdentityError,
    Requester,
    file_owner,
    files_as,
    in_process,
    owner_or_root,
)
from bpfdyno.core.rootfs import within_root
from bpfdyno.core.rules import pause_duration_s
from bpfdyno.core.text import shown_bytes
from bpfdyno.core.workers import StoppedError, UserLanes
from bpfdyno.rpc.audit import AuditedProcess
from bpfdyno.rpc.traces import (
    ProcessSummary,
    ProcessTrace,
    SkippedProcess,
    TraceSummary,
    TrainerState,
    TriggeredProcess,
)
from bpfdyno.tracing.audit import AuditLog, config_for_record
from bpfdyno.tracing.capture.records import NO_TRACKS, KernelTrackRequest
from bpfdyno.tracing.config_text import (
    CheckedConfig,
    build_config,
    check_config,
    with_trace_id,
)
from bpfdyno.tracing.paths import check_log_file, inserts_pid
from bpfdyno.tracing.policy import (
    TraceLimits,
    check_limits,
    describe_uid,
    refuse_not_owner,
    require_attributed,
    sees,
)
from bpfdyno.tracing.polls import KinetoPolls
from bpfdyno.tracing.requests import (
    TraceRequest,
    TraceStartResult,
    check_request_shape,
    kernel_track_request,
    match_trainers,
    output_path,
)
from bpfdyno.tracing.roles import Role, classify
from bpfdyno.tracing.safety import (
    PlacementChecker,
    Writer,
    ensure_user_trace_dir,
    home_directory,
    mount_root,
    user_trace_dir_path,
    visible_to,
)
from bpfdyno.tracing.traces import NewProcess, ProcState, TraceTracker, TraceView
from bpfdyno.tracing.trainers import Trainer, TrainerRegistry

log = logging.getLogger(__name__)

MAX_TIMEOUT_S = 24 * 3600.0
#: How long after a duration trace's end its file may take to appear.
WRITE_SLACK_S = 30.0
#: A "busy" poll older than this no longer counts as tracing (the process may have exited).
TRACING_FRESH_S = 15.0

DcgmPause = Callable[[int], bool]
DcgmResume = Callable[[], bool]


@dataclass(frozen=True, slots=True)
class TrainerView:
    """A registered trainer as reported to clients (sent as the API's `Trainer` by field
    name: the two poll times under the API's names below, the role by its member name)."""

    pid: int
    ancestors: tuple[int, ...]
    job_id: int
    first_poll: float
    last_poll: float
    polls: int
    state: TrainerState
    role: Role
    endpoint: str
    trace_id: str
    uid: int | None = None
    host_pid: int = 0
    job_name: str = ""

    @property
    def first_poll_unix_seconds(self) -> float:
        """``first_poll`` by its name in the API."""
        return self.first_poll

    @property
    def last_poll_unix_seconds(self) -> float:
        """``last_poll`` by its name in the API."""
        return self.last_poll


def describe_address(address: bytes) -> str:
    """An endpoint address for humans: ``@name`` for abstract names, else the path; `shown`
    (the trainer chose it)."""
    if address.startswith(b"\0"):
        return "@" + shown_bytes(address[1:].rstrip(b"\0"))
    return shown_bytes(address)


class TracingService(KinetoPolls):
    """Trainers, trace requests and trace tracking, shared by every front end.

    Args:
        allowed_dirs: directories log files may be written under.
        default_timeout_s: how long a trace is followed when the request names no timeout.
        registry: the trainer registry (its size and expiry come from the config).
        trace_dir: where traces go when a request names no log file ("" = the requester's
            own directory under ``user_dirs``, else the first allowed directory).
        user_dirs: parent of the per-user trace directories the agent makes ("" = none;
            `bpfdyno.tracing.safety.ensure_user_trace_dir`); log files may go anywhere under it.
        allow_home: whether a user may name log files under its own home directory.
        dcgm_pause, dcgm_resume: the GPU monitor's profiling pause/resume, if there is one.
        version: reported by the legacy ``getVersion``.
        wall, mono: time sources (epoch seconds, monotonic seconds).
        proc_root: where /proc is (to recognise DataLoader workers, check senders).
        default_tracks: the kernel tracks of a request that names none (and of every dyno
            RPC request).
        limits: the most a request may ask (`bpfdyno.tracing.policy`).
        audit: where every trace request is recorded (default: in memory and the log).
        placement: the trace-file placement rules (`bpfdyno.tracing.safety`).
        user_files: where work on users' files runs, one lane per uid (default: lanes of
            its own); the kernel-track merges share them.
    """

    def __init__(
        self,
        allowed_dirs: Sequence[str],
        default_timeout_s: float,
        registry: TrainerRegistry,
        trace_dir: str = "",
        user_dirs: str = "",
        allow_home: bool = False,
        dcgm_pause: DcgmPause | None = None,
        dcgm_resume: DcgmResume | None = None,
        version: str = "",
        wall: Callable[[], float] = time.time,
        mono: Callable[[], float] = time.monotonic,
        proc_root: Path = Path("/proc"),
        default_tracks: KernelTrackRequest = NO_TRACKS,
        limits: TraceLimits | None = None,
        audit: AuditLog | None = None,
        placement: PlacementChecker | None = None,
        read_limits: ReadLimits = DEFAULT_LIMITS,
        user_files: UserLanes | None = None,
    ) -> None:
        super().__init__(
            registry,
            TraceTracker(wall, mono),
            audit or AuditLog(wall=wall),
            placement or PlacementChecker(proc_root),
            proc_root,
            wall,
            mono,
            user_files,
        )
        self.allowed_dirs = list(allowed_dirs)
        self.default_tracks = default_tracks
        self.trace_dir = trace_dir
        self.user_dirs = user_dirs
        self.allow_home = allow_home
        self.default_timeout_s = default_timeout_s
        self.version = version
        self._dcgm_pause = dcgm_pause
        self._dcgm_resume = dcgm_resume
        #: Live GPU-profiling pauses: the pauser's uid -> when its pause ends (monotonic).
        self._pauses: dict[int, float] = {}
        self._proc_root = proc_root
        #: Set by the component while the IPC endpoint is down: why no trainer can poll.
        self.unavailable_reason = ""
        #: Bounds on reading a trace file for a summary.
        self.read_limits = read_limits
        self.limits = limits or TraceLimits()

    # -- queries ------------------------------------------------------------------------------

    def list_trainers(
        self, job_id: int | None = None, requester: Requester | None = None
    ) -> list[TrainerView]:
        """Registered trainers (of one job when ``job_id`` is given), by job id then pid.

        A trainer's ``trace_id`` is shown only to those who may see that trace (`sees`),
        its ``endpoint`` (the socket its Kineto client takes configs from: one datagram
        there configures it, bypassing the agent) only to its owner and root.
        """
        who = requester or in_process()
        trainers = self.registry.trainers()
        roles = classify(trainers, self._proc_root)
        out = []
        for t in trainers:
            if job_id is not None and t.job_id != job_id:
                continue
            part = self.tracker.open_part(t.address)
            out.append(
                TrainerView(
                    pid=t.pid,
                    ancestors=t.ancestors,
                    job_id=t.job_id,
                    first_poll=t.first_poll,
                    last_poll=t.last_poll,
                    polls=t.polls,
                    state=self.tracker.trainer_state(t.address, t.profiler_busy),
                    role=roles[t.address],
                    endpoint=describe_address(t.address) if sees(who, t.uid) else "",
                    trace_id=part.trace_id if part and sees(who, part.requester_uid) else "",
                    uid=t.uid,
                    host_pid=t.host_pid,
                    job_name=t.job_name,
                )
            )
        return out

    def get_trace(self, trace_id: str, requester: Requester | None = None) -> TraceView:
        """The trace's current state.

        Args:
            requester: who asks (None: the daemon itself). A trace another user asked for is
                not found for a user other than root, exactly like an unknown one.

        Raises:
            NotFound: unknown id (never issued, or forgotten after many newer traces), or
                not the requester's to see.
        """
        view = self.tracker.get(trace_id)
        if view is None or not sees(requester or in_process(), view.requester_uid):
            raise NotFound(
                f"no trace with id {trace_id!r}; it was never started here or was forgotten "
                "after many newer traces"
            )
        return view

    async def watch_trace(
        self, trace_id: str, requester: Requester | None = None
    ) -> AsyncIterator[TraceView]:
        """Yield the trace now and after every change, until every process has ended.

        Raises:
            NotFound: unknown id, or not the requester's (see `get_trace`).
        """
        view = self.get_trace(trace_id, requester)
        yield view
        while not view.done:
            nxt = await self.tracker.wait_change(trace_id, view.version)
            if nxt is None:
                return
            view = nxt
            yield view

    async def trace_summary(
        self, trace_id: str, requester: Requester | None = None
    ) -> TraceSummary:
        """Each triggered process's file summarised (`bpfdyno.analysis.summary`), in order,
        and the verdict across them (`bpfdyno.analysis.verdict`).

        Each file is read in its owner's lane (`user_files`) with its owner's rights (a link
        or a FIFO the owner put at its name reads nothing of anyone else's: see
        `summarize_file`), so one user's file cannot hold up another user's summary. A
        process whose file is not written yet (or never was) gets an entry with ``error``
        saying so.

        Raises:
            NotFound: unknown id, or not the requester's (see `get_trace`).
        """
        view = self.get_trace(trace_id, requester)
        files = self.tracker.files(trace_id)
        limits = self.read_limits

        def owner(p: ProcessTrace) -> int | None:
            return files.get(p.output_path, (p.output_path, None))[1]

        def read(p: ProcessTrace) -> ProcessSummary:
            if p.state is ProcState.WRITTEN:
                local = files.get(p.output_path, (p.output_path, None))[0]
                try:
                    # As the owner, and inside the process's own root when it is in a
                    # container: its absolute links must not lead to the host's files.
                    with (
                        files_as(*file_owner(owner(p), local)),
                        within_root(local, p.output_path) as path,
                    ):
                        summary = summarize_file(path, limits, p.output_path)
                except FileIdentityError as e:
                    summary = ProcessSummary(p.output_path, error=str(e))
                except OSError as e:  # its directory cannot be resolved in its root
                    summary = ProcessSummary(p.output_path, error=f"{p.output_path}: {e.strerror}")
                pid, tid = summary.pid or p.pid, summary.trace_id or trace_id
                return replace(summary, pid=pid, trace_id=tid)
            return ProcessSummary(
                p.output_path,
                pid=p.pid,
                trace_id=trace_id,
                error=f"no trace file yet: {p.state.value} ({p.reason})",
            )

        lanes = self.user_files
        try:
            summaries = await asyncio.gather(
                *(lanes.run(owner_or_root(owner(p)), read, p) for p in view.processes)
            )
        except StoppedError:
            raise Unavailable("the agent is stopping; ask again when it is back") from None
        verdict = compare([s.evidence for s in summaries if s.evidence is not None])
        return TraceSummary(trace_id, tuple(summaries), verdict)

    def tracing_pids(self) -> set[int]:
        """Pids of registered trainers whose profiler is tracing now (ours or their own)."""
        now = self._mono()
        busy = {
            t.pid
            for t in self.registry.trainers()
            if t.profiler_busy and now - t.last_poll_mono < TRACING_FRESH_S
        }
        return busy | self.tracker.tracing_pids()

    # -- dcgm pause / resume ----------------------------------------------------------------

    @property
    def has_gpu_monitor(self) -> bool:
        return self._dcgm_pause is not None

    def dcgm_pause(self, duration_s: int, requester: Requester | None = None) -> bool:
        """Pause GPU profiling metrics for ``duration_s``; False without a GPU monitor.

        Each pause is its pauser's: the monitor stays paused until the last live pause
        ends, so a shorter pause by another user never cuts one short.

        Raises:
            InvalidArgument: the duration breaks `bpfdyno.core.rules.pause_duration_s`.
            PermissionDenied: the requester's uid is unknown.
        """
        who = requester or in_process()
        with self.audit.refusals("dcgm_pause", who, request={"duration_s": duration_s}):
            require_attributed(who)
        seconds = pause_duration_s(duration_s)
        ok = False
        if self._dcgm_pause:
            assert who.uid is not None  # attributed
            self._live_pauses()[who.uid] = self._mono() + seconds
            ok = bool(self._dcgm_pause(self._pause_left_s()))
        self.audit.record(
            "dcgm_pause", who, message=f"{seconds} s: {ok}", request={"duration_s": seconds}
        )
        return ok

    def dcgm_resume(self, requester: Requester | None = None) -> bool:
        """End the requester's GPU-profiling pause (root: every pause); False without a GPU
        monitor. The monitor resumes when no other user's pause is left.

        Raises:
            PermissionDenied: the requester's uid is unknown, or the live pause is another
                user's (rule ``not_pauser``: only its pauser or root may end it).
        """
        who = requester or in_process()
        with self.audit.refusals("dcgm_resume", who):
            require_attributed(who)
            pauses = self._live_pauses()
            if pauses and not who.privileged and who.uid not in pauses:
                raise PermissionDenied(
                    "the GPU profiling pause is another user's: only the user who paused or "
                    f"root may end it; it ends by itself in {round(self._pause_left_s())} s",
                    rule="not_pauser",
                )
        ok = False
        if self._dcgm_resume:
            if who.privileged:
                self._pauses.clear()
            elif who.uid is not None:
                self._pauses.pop(who.uid, None)
            left = self._pause_left_s()
            ok = (
                bool(self._dcgm_pause(left))
                if left and self._dcgm_pause
                else bool(self._dcgm_resume())
            )
        self.audit.record("dcgm_resume", who, message=str(ok))
        return ok

    def _live_pauses(self) -> dict[int, float]:
        now = self._mono()
        for uid in [u for u, until in self._pauses.items() if until <= now]:
            del self._pauses[uid]
        return self._pauses

    def _pause_left_s(self) -> int:
        """Whole seconds until the last live pause ends (0: none)."""
        pauses = self._live_pauses()
        return max(1, math.ceil(max(pauses.values()) - self._mono())) if pauses else 0

    # -- trace requests -------------------------------------------------------------------

    def start_trace(
        self, req: TraceRequest, requester: Requester | None = None
    ) -> TraceStartResult:
        """Match processes, hand the config to those that can take it, and track them.

        Every call is audited, accepted or refused.

        Args:
            req: the request.
            requester: who asks (each entry point passes its peer's identity); None for
                code inside the daemon, which acts with the daemon's uid.

        Raises:
            InvalidArgument: bad pids/limit/options/config, a limit exceeded, or a file
                that would be overwritten; nothing is stored then.
            PermissionDenied: the requester may not trace the matched processes, or the
                file's directory is not safe for them (the rule says which).
            Unavailable: the Kineto IPC endpoint is not running.
        """
        who = requester or in_process()
        with self.audit.refusals("start_trace", who, request=_audited_request(req)):
            res, audited = self._start_trace(req, who)
        self.audit.record(
            "start_trace",
            who,
            message=f"triggered {len(res.triggered)} of {len(res.matched)} matched",
            trace_id=res.trace_id,
            request=_audited_request(req, res.config_text),
            processes=audited,
            matched=res.matched,
        )
        return res

    def _start_trace(
        self, req: TraceRequest, requester: Requester
    ) -> tuple[TraceStartResult, list[AuditedProcess]]:
        """`start_trace` without the audit; also returns the triggered processes to audit."""
        if self.unavailable_reason:
            raise Unavailable(self.unavailable_reason)
        check_request_shape(req)
        require_attributed(requester)
        tracks = kernel_track_request(req, self.default_tracks)
        if tracks.enabled:  # recording them is the requester's work: bounded per user
            REQUESTED.check(reader(requester.uid))
        trace_id = secrets.token_hex(8)
        named_file = req.options is None or bool(req.options.log_file)
        if req.options is not None and not named_file:
            req = self._with_default_file(req, requester.uid)
        checked = self._checked_config(req, requester)
        span_s = check_limits(checked, self.limits, self._wall())
        trainers = self.registry.trainers()
        open_parts = {
            t.address: part for t in trainers if (part := self.tracker.open_part(t.address))
        }
        m = match_trainers(
            req, requester, trainers, classify(trainers, self._proc_root), open_parts
        )
        if m.not_theirs and not m.matched:
            refuse_not_owner(requester, m.not_theirs)
        if not named_file and self._per_user_default() and m.triggered:
            req, checked = self._place_in_user_dir(req, requester, m.triggered, checked)
        triggered = [(t, output_path(checked, t.pid)) for t in m.triggered]
        self._check_outputs(checked, triggered)
        if checked.log_file and not checked.memory_snapshot:
            self.kineto_builds.check(checked.log_file, [(t.pid, t.address) for t, _ in triggered])
        for t, path in triggered:
            self._placement.check(path, Writer(t.uid, t.host_pid))
        self._check_not_existing(triggered)
        audited = [AuditedProcess(t.pid, t.host_pid, t.uid, path) for t, path in triggered]
        text = with_trace_id(checked.text, trace_id)
        timeout = req.timeout_s if req.timeout_s > 0 else self.default_timeout_s
        if checked.memory_snapshot:
            tracks = NO_TRACKS  # a memory snapshot is a pickle, not a trace to add tracks to
        if span_s:  # follow a duration trace at least until it must be over and written
            timeout = max(timeout, span_s + WRITE_SLACK_S)
        # Opened even when nothing was triggered: every request's id can be looked up.
        self.tracker.open_trace(
            trace_id,
            [
                NewProcess(
                    t.address,
                    t.pid,
                    t.job_id,
                    path,
                    text,
                    tracks=tracks,
                    owner_uid=t.uid,
                    fs_root=mount_root(t.host_pid, self._proc_root),
                    host_pid=t.host_pid,
                )
                for t, path in triggered
            ],
            min(timeout, MAX_TIMEOUT_S),
            checked.iteration_mode,
            start_time_s=checked.start_time_ms / 1000.0,
            requester_uid=requester.uid,
        )
        log.info(
            "trace %s: job %d pids %s: matched %d, triggered %s, busy %d",
            trace_id,
            req.job_id,
            list(req.pids) or "all",
            len(m.matched),
            [t.pid for t, _ in triggered],
            len(m.busy),
        )
        result = TraceStartResult(
            trace_id=trace_id,
            matched=tuple(t.pid for t in m.matched),
            triggered=tuple(TriggeredProcess(t.pid, t.job_id, p) for t, p in triggered),
            busy=m.busy,
            over_limit=m.over_limit,
            not_matched=m.not_matched,
            config_text=checked.text,
        )
        return result, audited

    def _checked_config(self, req: TraceRequest, requester: Requester) -> CheckedConfig:
        allowed = self.allowed_for(requester)
        # Probe the file system for a user only where she could look herself.
        sees = None if requester.privileged or requester.uid is None else visible_to(requester.uid)
        if req.options is not None:
            check_log_file(req.options.log_file, allowed, sees)
            return check_config(build_config(req.options), allowed, self._wall(), sees)
        return check_config(req.config or "", allowed, self._wall(), sees)

    def allowed_for(self, requester: Requester) -> list[str]:
        """Where ``requester`` may name log files: the configured directories, the per-user
        directories' parent (each user's own passes the placement rules; another's does not)
        and, with ``allow_home``, its own home directory."""
        allowed = list(self.allowed_dirs)
        for extra in (self.trace_dir, self.user_dirs):
            if extra and extra not in allowed:
                allowed.append(extra)
        if self.allow_home and requester.uid is not None:
            home = home_directory(requester.uid)
            if home and home not in allowed:
                allowed.append(home)
        return allowed

    def _per_user_default(self) -> bool:
        return not self.trace_dir and bool(self.user_dirs)

    def _with_default_file(self, req: TraceRequest, uid: int | None) -> TraceRequest:
        """``req`` with a fresh, timestamped log file (the request named none), in
        ``trace_dir``, else the per-user directory of ``uid``, else the first allowed one."""
        name = time.strftime("trace_%Y%m%d_%H%M%S.pt.trace.json", time.localtime(self._wall()))
        if self.trace_dir:
            directory = self.trace_dir
        elif self.user_dirs:
            directory = user_trace_dir_path(self.user_dirs, owner_or_root(uid))
        else:
            directory = self.allowed_dirs[0] if self.allowed_dirs else "/tmp"
        assert req.options is not None
        return replace(req, options=replace(req.options, log_file=os.path.join(directory, name)))

    def _place_in_user_dir(
        self,
        req: TraceRequest,
        requester: Requester,
        triggered: Sequence[Trainer],
        checked: CheckedConfig,
    ) -> tuple[TraceRequest, CheckedConfig]:
        """Put a request without a log file into its processes' owner's own directory
        (made now if needed): root tracing a user's processes writes where that user can.

        Raises:
            InvalidArgument: rule ``several_owners`` (root matched processes of several
                users: no one directory is theirs).
            PermissionDenied: the directory is not safe (`ensure_user_trace_dir`).
        """
        owners = sorted({owner_or_root(t.uid) for t in triggered})
        if len(owners) > 1:
            raise InvalidArgument(
                rule="several_owners",
                message="the matched processes belong to "
                + ", ".join(describe_uid(u) for u in owners)
                + "; without --log-file each user's traces go to that user's own directory, "
                "and one request writes one name. Trace each user's processes separately "
                "(--pids), or name a --log-file in a directory all of them can write",
            )
        owner = owners[0]
        if owner != owner_or_root(requester.uid):
            req = self._with_default_file(req, owner)
            checked = self._checked_config(req, requester)
        ensure_user_trace_dir(self.user_dirs, owner)
        return req, checked

    def _check_outputs(self, checked: CheckedConfig, triggered: list[tuple[Trainer, str]]) -> None:
        paths = [p for _, p in triggered]
        log_file = checked.log_file
        if (
            len(paths) > 1
            and log_file
            and not checked.memory_snapshot
            and not inserts_pid(log_file)
        ):
            raise InvalidArgument(
                rule="no_pid_in_name",
                message=f"{log_file} has no '.json', so Kineto cannot add _<pid> and the "
                f"{len(paths)} processes would overwrite one file; name it *.json or "
                "*.pt.trace.json",
            )
        if len(set(paths)) != len(paths):
            raise InvalidArgument(
                rule="duplicate_output",
                message="two matched processes would write the same file (same pid in different "
                "containers?); narrow the request with --pids or --job-id",
            )

    def _check_not_existing(self, triggered: list[tuple[Trainer, str]]) -> None:
        """Refuse names that exist already. Only after the placement rules passed: each
        directory is then one its writer (the requester, unless root) may enter, so this
        tells her nothing she could not see."""
        existing = [
            p for t, p in triggered if os.path.lexists(mount_root(t.host_pid, self._proc_root) + p)
        ]
        if existing:
            raise InvalidArgument(
                rule="would_overwrite",
                message=f"{', '.join(existing)} already exist(s); a new trace would overwrite it. "
                "Choose another log file name or move the old trace away",
            )


def _audited_request(req: TraceRequest, config_text: str = "") -> dict[str, object]:
    """What a request asked, for its audit record."""
    shown: dict[str, object] = {
        "job_id": req.job_id,
        "pids": list(req.pids),
        "process_limit": req.process_limit,
    }
    if config_text:
        shown["config"] = config_for_record(config_text)
    elif req.config is not None:
        shown["config"] = config_for_record(req.config)
    elif req.options is not None:
        shown["log_file"] = req.options.log_file
        shown["duration_ms"] = req.options.duration_ms
        shown["iterations"] = req.options.iterations
        shown["start_time_ms"] = req.options.profile_start_time_ms
    return shown


__all__ = [
    "ProcState",
    "SkippedProcess",
    "TraceRequest",
    "TraceStartResult",
    "TraceView",
    "TracingService",
    "TrainerState",
    "TrainerView",
    "TriggeredProcess",
]
