"""`RecordedDataSource`: replays a recording of an agent, for demos and tests.

A recording is one JSON object (written by `bpfdyno.tui.recorder` from a live agent, or by
hand)::

    {"format": "bpfdyno-top-recording", "version": 2, "interval_s": 1.0,
     "status": {...AgentStatus...}, "specs": [...MetricSpecInfo...],
     "history": [...SeriesPoints...],
     "frames": [{"ts": 1700000000.0,
                 "rounds": [...MetricsRound...],
                 "status": {...}, "processes": {...ProcessTable...},
                 "trainers": [...], "events": [...]}],
     "unavailable": {"processes": "why", "trainers": "why", "events": "why"},
     "trace": [...TraceStatus...]}

Frames play one per ``interval_s / speed`` seconds, driven by the metrics stream; a frame
without ``status``/``processes``/``trainers`` keeps the previous one. With ``loop`` the
frames start over with their timestamps shifted forward, so time keeps increasing. A
``trace`` list is the sequence of states the next trace request goes through.

Process rows are the API's `bpfdyno.rpc.processes.ProcessRow`. Version 1 recordings, made
before the UI took that record, are read too: three of their row fields had other names.

`disconnect` and `reconnect` make the replay behave like an agent going away and coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tui.codec import RecordingError, decode
from bpfdyno.tui.errors import Disconnected, RequestFailed, ServiceUnavailable
from bpfdyno.tui.records import (
    AgentStatus,
    KernelEventInfo,
    MetricSpecInfo,
    MetricsRound,
    ProcessTable,
    SeriesPoints,
    TraceStatus,
    TrainerInfo,
)

FORMAT = "bpfdyno-top-recording"
VERSION = 2
#: Process row fields of version 1 recordings, by their version 2 names.
_V1_PROCESS_FIELDS = {
    "num_threads": "threads",
    "start_unix_seconds": "start_ts",
    "slurm_job_id": "job_id",
}


@dataclass(frozen=True, slots=True)
class Frame:
    """What the agent said during one interval of the recording."""

    ts: float
    rounds: tuple[MetricsRound, ...] = ()
    status: AgentStatus | None = None
    processes: ProcessTable | None = None
    trainers: tuple[TrainerInfo, ...] | None = None
    events: tuple[KernelEventInfo, ...] = ()


@dataclass(frozen=True, slots=True)
class Recording:
    """A decoded recording."""

    status: AgentStatus
    specs: tuple[MetricSpecInfo, ...]
    frames: tuple[Frame, ...]
    history: tuple[SeriesPoints, ...] = ()
    interval_s: float = 1.0
    unavailable: tuple[tuple[str, str], ...] = ()
    trace: tuple[TraceStatus, ...] = ()


def parse_recording(obj: Any) -> Recording:
    """Decode a recording object (see the module docstring for its shape).

    Raises:
        RecordingError: not a recording, an unknown version, or a malformed field.
    """
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise RecordingError(f'not a bpfdyno top recording: expected "format": "{FORMAT}"')
    if obj.get("version") == 1:
        obj = _from_version_1(obj)
    elif obj.get("version") != VERSION:
        raise RecordingError(
            f"recording version {obj.get('version')!r} is not supported; this build reads "
            f"versions 1 and {VERSION} (record it again with this bpfdyno)"
        )
    for key in ("status", "frames"):
        if key not in obj:
            raise RecordingError(f"recording has no {key!r}")
    rec = decode(Recording, obj, "recording")
    if not rec.frames:
        raise RecordingError("recording has no frames; record at least one interval")
    if rec.interval_s <= 0:
        raise RecordingError(f"interval_s must be positive, got {rec.interval_s}")
    return rec


def _from_version_1(obj: dict[str, Any]) -> dict[str, Any]:
    """A version 1 recording in version 2's shape: its process rows' fields renamed.

    Version 1 rows could leave the thread count and RSS unknown (null); version 2 rows
    always have them, as the agent always sends them, so a null becomes the default.
    """
    frames = []
    for frame in obj.get("frames", []):
        table = frame.get("processes") if isinstance(frame, dict) else None
        if isinstance(table, dict) and isinstance(table.get("rows"), list):
            rows = [_row_from_version_1(r) if isinstance(r, dict) else r for r in table["rows"]]
            frame = {**frame, "processes": {**table, "rows": rows}}
        frames.append(frame)
    return {**obj, "frames": frames}


def _row_from_version_1(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not (k in ("threads", "rss_bytes") and v is None)}
    for new, old in _V1_PROCESS_FIELDS.items():
        if old in out:
            out[new] = out.pop(old)
    return out


def load_recording(path: Path) -> Recording:
    """Read and decode a recording file.

    Raises:
        RecordingError: unreadable, not JSON, or not a valid recording (message names it).
    """
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise RecordingError(f"cannot read recording {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise RecordingError(f"{path} is not JSON: {e}") from None
    try:
        return parse_recording(obj)
    except RecordingError as e:
        raise RecordingError(f"{path}: {e}") from None


class RecordedDataSource:
    """A `DataSource` replaying a `Recording`.

    Args:
        recording: what to replay.
        speed: playback speed; frames advance every ``interval_s / speed`` seconds.
        loop: start over after the last frame (else the last frame stays).
        name: how the source describes itself (shown in the status bar).
    """

    def __init__(
        self, recording: Recording, speed: float = 1.0, loop: bool = True, name: str = ""
    ) -> None:
        self.recording = recording
        self.speed = speed
        self.loop = loop
        self._name = name or "recording"
        self._index = -1  # no frame played yet
        self._laps = 0
        self._down: str | None = None
        self._changed = asyncio.Event()
        self._status = recording.status
        self._restarts = 0
        #: Every trace request received, in order (what a test or demo asked for).
        self.trace_requests: list[TraceSpec] = []

    @classmethod
    def from_file(cls, path: Path, speed: float = 1.0, loop: bool = True) -> RecordedDataSource:
        """Replay the recording in ``path``.

        Raises:
            RecordingError: the file is not a valid recording.
        """
        return cls(load_recording(path), speed=speed, loop=loop, name=f"recording {path.name}")

    @property
    def target(self) -> str:
        """The recording's name."""
        return self._name

    # -- replay control ------------------------------------------------------------------

    def disconnect(self, reason: str = "the agent stopped") -> None:
        """Behave like an unreachable agent until `reconnect`."""
        self._down = reason
        self._wake()

    def reconnect(self, restarted: bool = True) -> None:
        """Come back; with ``restarted`` the agent reports a new start time."""
        self._down = None
        if restarted:
            self._restarts += 1
            self._status = replace(
                self._status, started_ts=self._status.started_ts + 1000.0 * self._restarts
            )
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _check(self) -> None:
        if self._down is not None:
            raise Disconnected(f"cannot reach the agent ({self._name}): {self._down}")

    def _shift(self) -> float:
        frames = self.recording.frames
        span = frames[-1].ts - frames[0].ts + self.recording.interval_s
        return self._laps * span

    def _frame(self) -> Frame:
        return self.recording.frames[max(self._index, 0)]

    def _latest(self, attr: str) -> Any:
        """The newest value of a frame attribute at or before the current frame."""
        for f in reversed(self.recording.frames[: max(self._index, 0) + 1]):
            value = getattr(f, attr)
            if value is not None:
                return value
        return None

    def _unavailable(self, part: str) -> None:
        for key, reason in self.recording.unavailable:
            if key == part:
                raise ServiceUnavailable(reason)

    # -- DataSource ------------------------------------------------------------------------

    async def status(self) -> AgentStatus:
        """The recorded status (newest at or before the current frame)."""
        self._check()
        st: AgentStatus | None = self._latest("status")
        base = st if st is not None else self._status
        return replace(base, started_ts=self._status.started_ts)

    async def metric_specs(self) -> list[MetricSpecInfo]:
        """The recorded specs."""
        self._check()
        return list(self.recording.specs)

    async def metrics_window(self, names: Sequence[str], seconds: float) -> list[SeriesPoints]:
        """The recorded history of the matching series (names, or prefixes ending in ``*``)."""
        self._check()
        return [s for s in self.recording.history if _matches(s.name, names)]

    async def stream_metrics(self) -> AsyncIterator[MetricsRound]:
        """Play the frames' rounds, one frame per interval."""
        self._check()
        frames = self.recording.frames
        period = self.recording.interval_s / self.speed if self.speed > 0 else 0.0
        while True:
            if self._index + 1 < len(frames):
                self._index += 1
            elif self.loop:
                self._index = 0
                self._laps += 1
            else:
                await self._changed.wait()  # the last frame stays; wake only to disconnect
                self._check()
                continue
            shift = self._shift()
            self._wake()
            for rnd in self._frame().rounds:
                yield replace(rnd, ts=rnd.ts + shift)
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), period)
            self._check()

    async def processes(self, limit: int, job_id: str = "") -> ProcessTable:
        """The current frame's process table, optionally one job's processes."""
        self._check()
        self._unavailable("processes")
        table: ProcessTable | None = self._latest("processes")
        if table is None:
            raise ServiceUnavailable("this recording holds no process table")
        rows = [r for r in table.rows if not job_id or r.slurm_job_id == job_id]
        return replace(table, ts=table.ts + self._shift(), rows=tuple(rows[:limit]))

    async def trainers(self) -> list[TrainerInfo]:
        """The current frame's trainers."""
        self._check()
        self._unavailable("trainers")
        trainers: tuple[TrainerInfo, ...] | None = self._latest("trainers")
        shift = self._shift()
        return [
            replace(t, first_seen_ts=t.first_seen_ts + shift, last_poll_ts=t.last_poll_ts + shift)
            for t in trainers or ()
        ]

    async def start_trace(self, request: TraceSpec) -> TraceStatus:
        """Record the request and answer with the recording's first trace state."""
        self._check()
        self._unavailable("trainers")
        self.trace_requests.append(request)
        if not self.recording.trace:
            raise RequestFailed("this recording holds no trace to replay")
        return self.recording.trace[0]

    async def watch_trace(self, trace_id: str) -> AsyncIterator[TraceStatus]:
        """The recording's trace states after the first, one per interval."""
        period = self.recording.interval_s / self.speed if self.speed > 0 else 0.0
        for st in self.recording.trace[1:]:
            await asyncio.sleep(period)
            self._check()
            yield replace(st, trace_id=trace_id)

    async def stream_events(self) -> AsyncIterator[KernelEventInfo]:
        """Events of the frames played so far (the agent's recent events), then new ones."""
        self._check()
        self._unavailable("events")
        seen = -1
        seen_lap = self._laps
        while True:
            if self._index >= 0 and (self._index != seen or self._laps != seen_lap):
                first = seen + 1 if self._laps == seen_lap else 0
                seen, seen_lap = self._index, self._laps
                shift_ns = int(self._shift() * 1e9)
                for frame in self.recording.frames[first : seen + 1]:
                    for ev in frame.events:
                        yield replace(ev, ts_ns=ev.ts_ns + shift_ns)
                continue  # frames may have played while the consumer held an event
            await self._changed.wait()
            self._check()

    async def close(self) -> None:
        """Nothing to release."""


def _matches(name: str, patterns: Sequence[str]) -> bool:
    """The agent's name filter: exact names or ``prefix*``; no patterns match everything."""
    return not patterns or any(
        name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns
    )
