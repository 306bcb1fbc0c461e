"""NCCL's profiler plugin in full mode during a trace, its records a track of the trace file.

A traced process that loads bpfdyno's NCCL profiler plugin (docs/nccl.md) and whose trace
asks for the ``nccl`` track is asked for full mode when its recording begins, until the
trace's deadline (`NcclTrack.begin`); when its file is complete, the receiver reads the
plugin's file once more and hands over what it recorded since (`NcclTrack.end`): one record
per collective (sequence number, operation, bytes, CPU arrival to completion, GPU span,
network wait) and per kernel channel and proxy step. The merge writes those inside the
profiler's window as rows of the process (`trace_events`): ``NCCL collectives``, ``NCCL
kernel channels``, ``NCCL proxy steps``, beside the kernel's rows.

The receiver is the ``nccl_profiler`` collector's: one reader of the plugin files, so its
cursors stay right; reads here take its lock like the collector's polls.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bpfdyno.sources.nccl_profiler.layout import Record
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver
from bpfdyno.sources.nccl_profiler.track import trace_events

log = logging.getLogger(__name__)

#: Full mode is asked for at least this long (a trace whose deadline is nearer, or past).
MIN_DETAIL_S = 1.0


@dataclass(frozen=True, slots=True)
class NcclRecords:
    """What a process's plugin recorded during its trace, and its clock's real-time offset
    (CLOCK_REALTIME - CLOCK_MONOTONIC ns, as the plugin measured it)."""

    records: tuple[Record, ...]
    realtime_offset_ns: int

    def events(self, pid: int, base_ns: int, window_ns: tuple[int, int]) -> list[dict[str, Any]]:
        """The records as trace events of ``pid`` that overlap ``window_ns`` (ns relative to
        the file's ``base_ns``); the rows' names come last, only for rows with events."""
        start, end = window_ns
        inside = [
            r
            for r in self.records
            if r.start_ns + self.realtime_offset_ns - base_ns <= end
            and r.start_ns + r.duration_ns + self.realtime_offset_ns - base_ns >= start
        ]
        return trace_events(inside, pid, self.realtime_offset_ns, base_ns)


class NcclTrack:
    """Asks a traced process's plugin for full mode, and collects what it recorded.

    Args:
        receiver: the ``nccl_profiler`` collector's receiver.
        trainer_pids: the registered trainers' pids here (the receiver looks for their files
            inside their own roots too: a poll without them would forget those).
    """

    def __init__(
        self, receiver: NcclProfilerReceiver, trainer_pids: Callable[[], Iterable[int]]
    ) -> None:
        self._receiver = receiver
        self._trainer_pids = trainer_pids

    def begin(self, pid: int, seconds: float) -> bool:
        """Full mode for process ``pid`` (as /proc here knows it) for ``seconds``; whether
        its plugin was asked (False: it loads none, or its file was refused)."""
        self._receiver.poll(self._trainer_pids())  # a file made since the collector's poll
        asked = self._receiver.request_detail(max(seconds, MIN_DETAIL_S), [pid])
        return pid in asked

    def end(self, pid: int) -> NcclRecords | None:
        """What process ``pid``'s plugin recorded since the last drain (None: nothing)."""
        self._receiver.poll(self._trainer_pids())
        records = self._receiver.drain_records(pid)
        if not records:
            return None
        return NcclRecords(tuple(records), self._receiver.realtime_offset_ns(pid))
