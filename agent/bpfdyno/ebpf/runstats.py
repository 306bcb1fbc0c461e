"""What bpfdyno's BPF programs cost: kernel run-time statistics in short windows.

The kernel counts runs and run time per program only while BPF stats are enabled, which
costs ~20 ns per run, so `BpfRunStats` enables them through a ``BPF_ENABLE_STATS`` fd (never
the global sysctl) for ``on_s`` seconds every ``period_s`` seconds and reports ns per event.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.ebpf.btfprog import bpf
from bpfdyno.ebpf.introspect import fdinfo
from bpfdyno.ebpf.metrics import BPF_RUN_NS_PER_EVENT, BPF_RUNS_PER_SECOND

log = logging.getLogger(__name__)

#: Default duty cycle: measure for this long...
DEFAULT_ON_S = 1.0
#: ...once per this period (so stats cost ~20 ns per run 10 % of the time).
DEFAULT_PERIOD_S = 10.0

_BPF_ENABLE_STATS = 32  # enum bpf_cmd
_BPF_STATS_RUN_TIME = 0  # enum bpf_stats_type


def enable_bpf_stats() -> int:
    """Turn on kernel BPF run-time stats; they stay on until the returned fd is closed.

    Raises:
        OSError: the kernel refused (EINVAL before 5.8, EPERM without CAP_SYS_ADMIN).
    """
    attr = (ctypes.c_uint8 * 128)()  # union bpf_attr, zeroed; enable_stats.type is at 0
    ctypes.c_uint32.from_buffer(attr, 0).value = _BPF_STATS_RUN_TIME
    return bpf(_BPF_ENABLE_STATS, attr)


@dataclass(frozen=True, slots=True)
class ProgramRunStats:
    """Cost of one program over one stats window."""

    program: str
    runs: int
    run_time_ns: int
    window_s: float

    @property
    def ns_per_event(self) -> float:
        """Mean run time of one invocation (NaN when it never ran)."""
        return self.run_time_ns / self.runs if self.runs else float("nan")

    @property
    def runs_per_second(self) -> float:
        """Invocations per second of the window."""
        return self.runs / self.window_s if self.window_s > 0 else float("nan")


class BpfRunStats:
    """Duty-cycled BPF run-time statistics for a set of loaded programs.

    Stats are switched on for ``on_s`` seconds every ``period_s`` seconds by a small thread;
    `last_window` returns the per-program cost measured in the latest completed window.
    `stop` closes the stats fd, which restores the kernel's previous state.

    Args:
        program_fds: program name -> fd of each program to measure
            (``BpfProgram.program_fds()``).
        on_s: length of a measuring window.
        period_s: one window starts every this many seconds.

    Raises:
        ValueError: not 0 < on_s <= period_s.
    """

    def __init__(
        self,
        program_fds: Mapping[str, int],
        on_s: float = DEFAULT_ON_S,
        period_s: float = DEFAULT_PERIOD_S,
    ) -> None:
        if not 0 < on_s <= period_s:
            raise ValueError(f"need 0 < on_s <= period_s, got on_s={on_s} period_s={period_s}")
        self._fds = dict(program_fds)
        self._on_s = on_s
        self._period_s = period_s
        self._lock = threading.Lock()
        self._last: dict[str, ProgramRunStats] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unavailable_reason = ""

    def start(self) -> None:
        """Start the duty cycle; if the kernel refuses stats, record why and do nothing."""
        try:
            os.close(enable_bpf_stats())
        except OSError as e:
            self.unavailable_reason = (
                f"BPF run statistics refused ({e.strerror}); they need Linux >= 5.8 and "
                "CAP_SYS_ADMIN"
            )
            log.warning("%s", self.unavailable_reason)
            return
        self._thread = threading.Thread(target=self._run, name="bpf-run-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the duty cycle and close the stats fd (restoring the global state)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def measure(self, seconds: float) -> dict[str, ProgramRunStats]:
        """Measure one window of ``seconds`` now, on the calling thread (for benchmarks).

        Raises:
            OSError: the kernel refused BPF stats.
        """
        return self._measure(seconds, threading.Event())

    def _measure(self, seconds: float, interrupt: threading.Event) -> dict[str, ProgramRunStats]:
        fd = enable_bpf_stats()
        try:
            before, t0 = self.read_counters(), time.monotonic()
            interrupt.wait(seconds)
            after, t1 = self.read_counters(), time.monotonic()
        finally:
            os.close(fd)
        return _window(before, after, t1 - t0)

    def read_counters(self) -> dict[str, tuple[int, int]]:
        """Cumulative (run_cnt, run_time_ns) per program, from ``/proc/self/fdinfo``."""
        out: dict[str, tuple[int, int]] = {}
        for name, fd in self._fds.items():
            info = fdinfo(fd)
            out[name] = (int(info.get("run_cnt", 0)), int(info.get("run_time_ns", 0)))
        return out

    def last_window(self) -> dict[str, ProgramRunStats]:
        """Per-program cost in the latest completed window ({} before the first one)."""
        with self._lock:
            return dict(self._last)

    def samples(self) -> list[Sample]:
        """The ``bpf_program_*`` samples of the latest window (nothing before it)."""
        return run_stats_samples(self.last_window())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                result = self._measure(self._on_s, self._stop)
            except OSError as e:
                log.warning("BPF run statistics stopped: %s", e)
                return
            if self._stop.is_set():
                return
            with self._lock:
                self._last = result
            self._stop.wait(self._period_s - self._on_s)


def _window(
    before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]], window_s: float
) -> dict[str, ProgramRunStats]:
    out: dict[str, ProgramRunStats] = {}
    for name, (cnt1, ns1) in after.items():
        cnt0, ns0 = before.get(name, (cnt1, ns1))
        out[name] = ProgramRunStats(name, max(cnt1 - cnt0, 0), max(ns1 - ns0, 0), window_s)
    return out


def run_stats_samples(stats: Mapping[str, ProgramRunStats]) -> list[Sample]:
    """Turn per-program window stats into ``bpf_program_*`` samples."""
    out: list[Sample] = []
    for name, st in sorted(stats.items()):
        labels = {"program": name}
        out.append(sample(BPF_RUN_NS_PER_EVENT, st.ns_per_event, labels))
        out.append(sample(BPF_RUNS_PER_SECOND, st.runs_per_second, labels))
    return out
