"""GPU counters of the traced processes' GPUs, read faster than the metrics interval.

The GPU collector owns NVML; it offers two calls (`GpuCounterSource`): which GPUs a process
has a context on, and a fresh read of a few counters of given GPUs (utilization, memory used,
power, SM clock, plus the GPM profiling metrics of its latest round where GPM runs).
`GpuSampler` calls them every ``1 / [capture] gpu_sample_hz`` seconds on its own thread,
only while some traced process uses a GPU, and keeps the samples per traced process.

GPM is not sampled faster: its counters are shared with CUPTI, and the GPU collector pauses
them on a GPU while a Kineto trace runs there (the GPM values of the track then read as
paused, and the track says so).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Hashable
from dataclasses import dataclass, field
from typing import Protocol

from bpfdyno.tracing.capture.records import GpuSample, TrackStats
from bpfdyno.tracing.capture.ticker import Ticker

log = logging.getLogger(__name__)

#: How often a traced process's GPUs are looked up again (it may open a context later).
GPU_LOOKUP_S = 1.0


class GpuCounterSource(Protocol):
    """What the GPU collector offers to the trace capture."""

    def trace_gpus(self, pid: int) -> tuple[int, ...] | None:
        """The GPU indices process ``pid`` has a context on; None while NVML is not running."""

    def trace_counters(self, gpus: Collection[int]) -> dict[int, dict[str, float]]:
        """Read the counters of ``gpus`` now: index -> counter name (with unit) -> value."""


@dataclass(slots=True)
class _Traced:
    pid: int
    samples: deque[GpuSample]
    gpus: tuple[int, ...] = ()
    looked_up: float = 0.0
    dropped: int = 0
    note: str = ""
    seen_gpus: set[int] = field(default_factory=set)


class GpuSampler:
    """Samples the GPUs of traced processes on a thread of its own while any is traced.

    Args:
        source: the GPU collector (None: no GPU collector in this agent).
        hz: samples per second.
        max_samples: most samples kept per traced process (the oldest go first).
        clock: CLOCK_MONOTONIC ns (the capture's clock).
    """

    def __init__(
        self,
        source: GpuCounterSource | None,
        hz: float,
        max_samples: int,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._source = source
        self._max = max_samples
        self._clock = clock
        self._lock = threading.Lock()
        self._traced: dict[Hashable, _Traced] = {}
        #: The sampling thread (its rounds and busy time: for status and benchmarks).
        self.ticker = Ticker(
            "trace-gpu-sampler", 1.0 / hz, self._busy, lambda: self._sample_once(time.monotonic())
        )

    @property
    def available(self) -> str:
        """ "" when GPUs can be sampled, else why not."""
        if self._source is None:
            return "no GPU collector in this agent (no NVML, or [collectors.gpu] is disabled)"
        return ""

    def start(self) -> None:
        """Start the sampling thread (it sleeps while nothing is traced)."""
        if self._source is not None:
            self.ticker.start()

    def stop(self) -> None:
        """Stop the thread (samples of processes still traced are kept)."""
        self.ticker.stop()

    def add(self, key: Hashable, pid: int) -> str:
        """Sample the GPUs of ``pid`` from now on under ``key``; "" or why it cannot be."""
        reason = self.available
        if reason:
            return reason
        with self._lock:
            self._traced[key] = _Traced(pid, deque(maxlen=self._max))
        self.ticker.wake()
        return ""

    def remove(self, key: Hashable) -> tuple[list[GpuSample], TrackStats]:
        """Stop sampling for ``key``; its samples and what to say about them."""
        with self._lock:
            t = self._traced.pop(key, None)
        if t is None:
            return [], TrackStats(note=self.available or "not sampled")
        note = t.note
        if not t.seen_gpus and not note:
            note = (
                f"process {t.pid} had no context on any GPU during the trace (NVML lists no "
                "compute process with its pid)"
            )
        return list(t.samples), TrackStats(events=len(t.samples), note=note)

    # -- the thread ---------------------------------------------------------------------------

    def _busy(self) -> bool:
        with self._lock:
            return bool(self._traced)

    def _sample_once(self, now: float) -> None:
        source = self._source
        assert source is not None
        with self._lock:
            traced = list(self._traced.values())
        for t in traced:
            if now - t.looked_up >= GPU_LOOKUP_S:
                t.looked_up = now
                gpus = source.trace_gpus(t.pid)
                if gpus is None:
                    t.note = "the GPU collector is not running (see `bpfdyno status`)"
                    t.gpus = ()
                else:
                    t.gpus = gpus
                    t.seen_gpus.update(gpus)
                    if gpus:
                        t.note = ""
        wanted = sorted({g for t in traced for g in t.gpus})
        if not wanted:
            return
        ts = self._clock()
        values = source.trace_counters(wanted)
        for t in traced:
            for gpu in t.gpus:
                counters = values.get(gpu)
                if counters is None:
                    continue
                if len(t.samples) == t.samples.maxlen:
                    t.dropped += 1
                t.samples.append(GpuSample(ts, gpu, counters))
