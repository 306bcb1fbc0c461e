"""`RecordedDataSource`: replays a recording of an agent, for demos and tests.

A recording is one JSON object (written by `bpfdyno.tui.recorder` from a live agent, or by
hand) holding the API's own records as their messages' JSON (``.proto`` field names)::

    {"format": "bpfdyno-top-recording", "version": 3, "interval_s": 1.0,
     "status": {...Status...}, "specs": [...MetricSpec...], "history": [...Series...],
     "frames": [{"ts": 1700000000.0,
                 "rounds": [...MetricsSnapshot...],
                 "status": {...}, "processes": {...ListProcessesResponse...},
                 "trainers": [...Trainer...], "events": [...KernelEvent...]}],
     "unavailable": {"processes": "why", "trainers": "why", "events": "why"},
     "trace_start": {...StartTraceResponse...}, "trace": [...TraceStatus...]}

Frames play one per ``interval_s / speed`` seconds, driven by the metrics stream; a frame
without ``status``/``processes``/``trainers`` keeps the previous one. With ``loop`` the
frames start over with their timestamps shifted forward, so time keeps increasing. The next
trace request is answered with ``trace_start``, and ``trace`` is the sequence of states it
goes through. Recordings of version 2 (before the UI took the API's records) are upgraded
on reading (`bpfdyno.tui.recording_v2`); older ones are refused with what to do.

`disconnect` and `reconnect` make the replay behave like an agent going away and coming back.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import importlib.resources
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.rpc.agent import AgentStatus, MetricSpec, MetricsSnapshot, Point, Series
from bpfdyno.rpc.detection import DetectionEvent
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import ProcessList
from bpfdyno.rpc.traces import TraceSpec, TraceStart, TraceStatus, Trainer
from bpfdyno.tui import recording_v2
from bpfdyno.tui.codec import RecordingError, decode

FORMAT = "bpfdyno-top-recording"
VERSION = 3

__all__ = ["FORMAT", "VERSION", "Frame", "RecordedDataSource", "Recording", "RecordingError"]


@dataclass(frozen=True, slots=True)
class Frame:
    """What the agent said during one interval of the recording."""

    ts: float
    rounds: tuple[MetricsSnapshot, ...] = ()
    status: AgentStatus | None = None
    processes: ProcessList | None = None
    trainers: tuple[Trainer, ...] | None = None
    events: tuple[KernelEvent, ...] = ()


@dataclass(frozen=True, slots=True)
class Recording:
    """A decoded recording."""

    status: AgentStatus
    specs: tuple[MetricSpec, ...]
    frames: tuple[Frame, ...]
    history: tuple[Series, ...] = ()
    interval_s: float = 1.0
    unavailable: dict[str, str] = field(default_factory=dict)
    trace_start: TraceStart | None = None
    trace: tuple[TraceStatus, ...] = ()


def parse_recording(obj: Any) -> Recording:
    """Decode a recording object (see the module docstring for its shape).

    Raises:
        RecordingError: not a recording, an unknown version, or a malformed field.
    """
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise RecordingError(f'not a bpfdyno top recording: expected "format": "{FORMAT}"')
    if obj.get("version") == recording_v2.VERSION:
        obj = recording_v2.upgrade(obj, VERSION)
    if obj.get("version") != VERSION:
        raise RecordingError(
            f"recording version {obj.get('version')!r} is not supported; this build reads "
            f"versions {recording_v2.VERSION} and {VERSION} (record it again with this bpfdyno)"
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


#: The demo shipped with the package (`bpfdyno top --demo`): 15 s of a real node with one
#: NVIDIA H200 under a training load, recorded by bpfdyno itself (a version-2 recording).
DEMO_RECORDING = "demo/h200_node.json.gz"


def demo_recording() -> Path:
    """Where the shipped demo recording is."""
    return Path(str(importlib.resources.files("bpfdyno.tui").joinpath(DEMO_RECORDING)))


def load_recording(path: Path) -> Recording:
    """Read and decode a recording file (gzip-compressed or not).

    Raises:
        RecordingError: unreadable, not JSON, or not a valid recording (message names it).
    """
    try:
        data = path.read_bytes()
        if data[:2] == b"\x1f\x8b":  # gzip's magic number
            data = gzip.decompress(data)
        obj = json.loads(data)
    except (gzip.BadGzipFile, EOFError) as e:
        raise RecordingError(f"{path} is not a complete gzip file: {e}") from None
    except UnicodeDecodeError as e:
        raise RecordingError(f"{path} is not UTF-8 JSON: {e}") from None
    except OSError as e:
        raise RecordingError(f"cannot read recording {path}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise RecordingError(f"{path} is not JSON: {e}") from None
    try:
        return parse_recording(obj)
    except RecordingError as e:
        raise RecordingError(f"{path}: {e}") from None


def _shifted(snap: MetricsSnapshot, shift: float) -> MetricsSnapshot:
    """A round as it replays ``shift`` seconds later."""
    series = tuple(
        replace(s, points=tuple(Point(ts + shift, v) for ts, v in s.points)) for s in snap.series
    )
    return replace(snap, unix_seconds=snap.unix_seconds + shift, series=series)


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
            started = self._status.started_unix_seconds + 1000.0 * self._restarts
            self._status = replace(self._status, started_unix_seconds=started)
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _check(self) -> None:
        if self._down is not None:
            raise AgentError(
                ErrorKind.UNREACHABLE, f"cannot reach the agent ({self._name}): {self._down}"
            )

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
        reason = self.recording.unavailable.get(part)
        if reason is not None:
            raise AgentError(ErrorKind.UNAVAILABLE, reason)

    # -- DataSource ------------------------------------------------------------------------

    async def status(self) -> AgentStatus:
        """The recorded status (newest at or before the current frame)."""
        self._check()
        st: AgentStatus | None = self._latest("status")
        base = st if st is not None else self._status
        return replace(base, started_unix_seconds=self._status.started_unix_seconds)

    async def metric_specs(self) -> list[MetricSpec]:
        """The recorded specs."""
        self._check()
        return list(self.recording.specs)

    async def metrics_window(self, names: Sequence[str], seconds: float) -> list[Series]:
        """The recorded history of the matching series (names, or prefixes ending in ``*``)."""
        self._check()
        return [s for s in self.recording.history if _matches(s.name, names)]

    async def stream_metrics(self) -> AsyncIterator[MetricsSnapshot]:
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
                yield _shifted(rnd, shift)
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), period)
            self._check()

    async def processes(self, limit: int, job_id: str = "") -> ProcessList:
        """The current frame's process table, optionally one job's processes."""
        self._check()
        self._unavailable("processes")
        table: ProcessList | None = self._latest("processes")
        if table is None:
            raise AgentError(ErrorKind.UNAVAILABLE, "this recording holds no process table")
        rows = [r for r in table.processes if not job_id or r.slurm_job_id == job_id]
        ts = table.unix_seconds + self._shift()
        return replace(table, unix_seconds=ts, processes=tuple(rows[:limit]))

    async def trainers(self) -> list[Trainer]:
        """The current frame's trainers."""
        self._check()
        self._unavailable("trainers")
        trainers: tuple[Trainer, ...] | None = self._latest("trainers")
        shift = self._shift()
        return [
            replace(
                t,
                first_poll_unix_seconds=t.first_poll_unix_seconds + shift,
                last_poll_unix_seconds=t.last_poll_unix_seconds + shift,
            )
            for t in trainers or ()
        ]

    async def start_trace(self, request: TraceSpec) -> TraceStart:
        """Record the request and answer with the recording's trace start."""
        self._check()
        self._unavailable("trainers")
        self.trace_requests.append(request)
        if self.recording.trace_start is None:
            raise AgentError(ErrorKind.FAILED, "this recording holds no trace to replay")
        return self.recording.trace_start

    async def watch_trace(self, trace_id: str) -> AsyncIterator[TraceStatus]:
        """The recording's trace states, one per interval."""
        period = self.recording.interval_s / self.speed if self.speed > 0 else 0.0
        for st in self.recording.trace:
            await asyncio.sleep(period)
            self._check()
            yield replace(st, trace_id=trace_id)

    async def detection_events(self, job_id: str = "") -> list[DetectionEvent]:
        """A recording holds the agent's metrics, processes, trainers and kernel events, not
        its detection events: said as a part the recording does not have."""
        self._check()
        raise AgentError(ErrorKind.UNAVAILABLE, "a recording holds no detection events")

    async def stream_events(self) -> AsyncIterator[KernelEvent]:
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
                        yield replace(ev, unix_ns=ev.unix_ns + shift_ns)
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
