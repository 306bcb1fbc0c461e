"""DCGM-class profiling metrics from NVML GPM (GPU Performance Monitoring), and their pausing.

GPM metrics are defined over an interval: NVML computes them from two samples of the GPU's
performance counters. Every collection takes a new sample and asks ``nvmlGpmMetricsGet`` for
the metrics between the previous sample and this one, so the values cover the whole
collection interval. The first round after start, a pause or an error only takes the
baseline sample.

One metric is expensive for NVML to compute: the graphics engine's activity costs ~1.8 ms
of CPU per call on an H200 (every other metric ~15 µs; measured with the driver there), more
than half of a GPU round. While someone reads the agent's data it is computed every round
like the others; while nobody does, over `SLOW_METRICS_S` (between a sample kept that long
and the newest: an exact average over its longer interval), its latest value reported in
between. A reader's first round computes it at once (over the interval since its last
computation). Three sample buffers: the newest, the previous one and the one the slow
metrics start from (often the same as the previous).

The counters are shared with CUPTI: while a Kineto trace runs in a process on a GPU (or while
an operator's ``dcgm-pause`` is in force) the collector must not sample them, or the trace's
profiler fails. Pausing therefore stops all GPM calls on that GPU and drops the baseline.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import pynvml

from bpfdyno.core.metrics import MetricSpec
from bpfdyno.core.rules import pause_duration_s
from bpfdyno.sources.gpu.metrics import GPM_METRICS, GpmMetric
from bpfdyno.sources.gpu.nvml import DeviceRef, Nvml

_SUCCESS = pynvml.NVML_SUCCESS
#: The metrics computed over `SLOW_METRICS_S` (NVML_GPM_METRIC_GRAPHICS_UTIL: see above).
SLOW_METRIC_IDS = frozenset({1})
#: How long the slow metrics' interval is.
SLOW_METRICS_S = 10.0


class GpmSampler:
    """GPM for one GPU: support check, two samples, metrics per interval.

    Args:
        nv: the NVML wrapper.
        dev: the GPU (its handle must stay valid until `close`).
    """

    def __init__(
        self, nv: Nvml, dev: DeviceRef, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nv = nv
        self._dev = dev
        self._clock = clock
        self._samples: list[object] = []
        self._previous: object | None = None  # None: no baseline
        self._slow_from: object | None = None  # the sample the slow metrics start from
        self._slow_at = -math.inf  # when it was taken
        self._slow_values: dict[MetricSpec, float] = {}
        self._request = pynvml.c_nvmlGpmMetricsGet_t()  # ~19 KB, reused every round
        self._fast = [m for m in GPM_METRICS if m.metric_id not in SLOW_METRIC_IDS]
        self._slow = [m for m in GPM_METRICS if m.metric_id in SLOW_METRIC_IDS]
        #: Why GPM cannot be used on this GPU; "" when it can.
        self.unavailable = self._probe()

    def _probe(self) -> str:
        nv, dev = self._nv, self._dev
        support = nv.get(
            "nvmlGpmQueryDeviceSupport",
            dev.index,
            lambda: pynvml.nvmlGpmQueryDeviceSupport(dev.handle),
        )
        if support is None:
            if "nvmlGpmQueryDeviceSupport" in nv.missing:
                return "the NVIDIA driver is too old for GPM (needs R520 or newer)"
            return "the GPM support query failed (see the log)"
        if not support.isSupportedDevice:
            return f"{dev.name or 'this GPU'} has no GPM (it needs a Hopper-class or newer GPU)"
        for _ in range(3):
            sample = nv.get("nvmlGpmSampleAlloc", dev.index, pynvml.nvmlGpmSampleAlloc)
            if sample is None:
                self.close()
                return "nvmlGpmSampleAlloc failed (see the log)"
            self._samples.append(sample)
        return ""

    def reset(self) -> None:
        """Forget the baseline sample (after a pause: the interval would span it)."""
        self._previous = self._slow_from = None
        self._slow_at = -math.inf
        self._slow_values = {}

    def read(self, slow_now: bool = True) -> dict[MetricSpec, float] | None:
        """Take a sample; return the metrics since the previous one (None: baseline only).

        A metric NVML cannot compute is NaN. The slow ones are computed when ``slow_now``
        (someone reads) or their interval is over, else their latest value.

        Raises:
            DeviceLost: the device is gone.
            DriverGone: NVML lost the driver.
        """
        if self.unavailable:
            return None
        nv, dev = self._nv, self._dev
        current = next(
            s for s in self._samples if s is not self._previous and s is not self._slow_from
        )
        if not nv.do(
            "nvmlGpmSampleGet", dev.index, lambda: pynvml.nvmlGpmSampleGet(dev.handle, current)
        ):
            self.reset()
            return None
        now = self._clock()
        previous, self._previous = self._previous, current  # the next round's baseline
        if previous is None:
            self._slow_from, self._slow_at = current, now
            return None
        values = self._metrics(self._fast, previous, current)
        if slow_now or now - self._slow_at >= SLOW_METRICS_S or not self._slow_values:
            slow_from = self._slow_from if self._slow_from is not None else previous
            self._slow_values = self._metrics(self._slow, slow_from, current)
            self._slow_from, self._slow_at = current, now
        return values | self._slow_values

    def _metrics(
        self, metrics: list[GpmMetric], first: object, second: object
    ) -> dict[MetricSpec, float]:
        """``metrics`` over the interval between two samples (NaN where NVML has none)."""
        if not metrics:
            return {}
        nv, dev, req = self._nv, self._dev, self._request
        req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(metrics)
        req.sample1 = first
        req.sample2 = second
        for i, metric in enumerate(metrics):
            req.metrics[i].metricId = metric.metric_id
        if not nv.do("nvmlGpmMetricsGet", dev.index, lambda: pynvml.nvmlGpmMetricsGet(req)):
            return {m.spec: math.nan for m in metrics}
        values: dict[MetricSpec, float] = {}
        for i, metric in enumerate(metrics):
            entry = req.metrics[i]
            if entry.nvmlReturn != _SUCCESS:
                nv.failed("nvmlGpmMetricsGet", dev.index, entry.nvmlReturn, str(metric.metric_id))
                values[metric.spec] = math.nan
            else:
                values[metric.spec] = float(entry.value) * metric.factor / metric.divisor
        return values

    def close(self) -> None:
        """Free the sample buffers (errors ignored: the driver may be gone)."""
        for sample in self._samples:
            self._nv.release("nvmlGpmSampleFree", partial(pynvml.nvmlGpmSampleFree, sample))
        self._samples = []
        self.reset()


@dataclass(frozen=True, slots=True)
class ManualPause:
    """An operator's dcgm-pause in force."""

    until_monotonic: float
    until_wall: float  # epoch seconds, for status


class ProfilingPause:
    """The dcgm-pause / dcgm-resume state; thread-safe (RPC threads set, the collector reads).

    Args:
        clock: monotonic seconds (injectable for tests).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._pause: ManualPause | None = None

    def pause(self, duration_s: float) -> ManualPause:
        """Pause profiling for ``duration_s`` seconds from now (replacing any earlier pause).

        Raises:
            InvalidArgument: ``duration_s`` breaks `bpfdyno.core.rules.pause_duration_s`.
        """
        duration_s = pause_duration_s(duration_s)
        pause = ManualPause(self._clock() + duration_s, time.time() + duration_s)
        with self._lock:
            self._pause = pause
        return pause

    def resume(self) -> bool:
        """End a pause early; True if one was in force."""
        with self._lock:
            active = self._pause is not None and self._clock() < self._pause.until_monotonic
            self._pause = None
        return active

    def current(self) -> ManualPause | None:
        """The pause in force now, if any (an expired one is cleared)."""
        with self._lock:
            if self._pause is not None and self._clock() >= self._pause.until_monotonic:
                self._pause = None
            return self._pause
