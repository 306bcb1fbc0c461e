"""DCGM-class profiling metrics from NVML GPM (GPU Performance Monitoring), and their pausing.

GPM metrics are defined over an interval: NVML computes them from two samples of the GPU's
performance counters. Each GPU keeps two sample buffers; every collection takes a new sample
and asks ``nvmlGpmMetricsGet`` for the metrics between the previous sample and this one, so
the values cover the whole collection interval. The first round after start, a pause or an
error only takes the baseline sample.

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
from bpfdyno.sources.gpu.metrics import GPM_METRICS
from bpfdyno.sources.gpu.nvml import DeviceRef, Nvml

_SUCCESS = pynvml.NVML_SUCCESS


class GpmSampler:
    """GPM for one GPU: support check, two samples, metrics per interval.

    Args:
        nv: the NVML wrapper.
        dev: the GPU (its handle must stay valid until `close`).
    """

    def __init__(self, nv: Nvml, dev: DeviceRef) -> None:
        self._nv = nv
        self._dev = dev
        self._samples: list[object] = []
        self._have_baseline = False
        self._request = pynvml.c_nvmlGpmMetricsGet_t()  # ~19 KB, reused every round
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
        for _ in range(2):
            sample = nv.get("nvmlGpmSampleAlloc", dev.index, pynvml.nvmlGpmSampleAlloc)
            if sample is None:
                self.close()
                return "nvmlGpmSampleAlloc failed (see the log)"
            self._samples.append(sample)
        return ""

    def reset(self) -> None:
        """Forget the baseline sample (after a pause: the interval would span it)."""
        self._have_baseline = False

    def read(self) -> dict[MetricSpec, float] | None:
        """Take a sample; return the metrics since the previous one (None: baseline only).

        A metric NVML cannot compute is NaN.

        Raises:
            DeviceLost: the device is gone.
            DriverGone: NVML lost the driver.
        """
        if self.unavailable:
            return None
        nv, dev = self._nv, self._dev
        previous, current = self._samples
        if not nv.do(
            "nvmlGpmSampleGet", dev.index, lambda: pynvml.nvmlGpmSampleGet(dev.handle, current)
        ):
            self._have_baseline = False
            return None
        # The new sample becomes the next round's baseline whatever happens below.
        self._samples.reverse()
        if not self._have_baseline:
            self._have_baseline = True
            return None
        req = self._request
        req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_METRICS)
        req.sample1 = previous
        req.sample2 = current
        for i, metric in enumerate(GPM_METRICS):
            req.metrics[i].metricId = metric.metric_id
        if not nv.do("nvmlGpmMetricsGet", dev.index, lambda: pynvml.nvmlGpmMetricsGet(req)):
            return {m.spec: math.nan for m in GPM_METRICS}
        values: dict[MetricSpec, float] = {}
        for i, metric in enumerate(GPM_METRICS):
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
        self._have_baseline = False


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
