"""The agent's own footprint: CPU, resident memory, threads and open file descriptors.

CPU comes from ``time.process_time()`` (CLOCK_PROCESS_CPUTIME_ID: user + system time of all
the agent's threads, in nanoseconds) rather than from /proc/self/stat, whose 10 ms ticks
would make a 1 s ratio of a nearly idle agent jump between 0 and 0.01. The rest comes from
psutil. Like every rate, the CPU ratio needs two readings, so the first collect has none.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import psutil

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.sources.base import Collector
from bpfdyno.sources.host.metrics import AGENT_CPU, AGENT_OPEN_FDS, AGENT_RSS, AGENT_THREADS


class SelfCollector(Collector):
    """Reports the agent process's own resource use, to keep its overhead visible."""

    name = "self"

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
    ) -> None:
        """Create the collector in the process it is to measure.

        Args:
            clock: monotonic seconds, the denominator of the CPU ratio.
            cpu_clock: CPU seconds used so far by this process.
        """
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._process = psutil.Process()
        self._prev: tuple[float, float] | None = None  # (clock, cpu seconds)

    def collect(self) -> Sequence[Sample]:
        """Read the agent's CPU time, RSS, thread and fd counts."""
        now, cpu = self._clock(), self._cpu_clock()
        with self._process.oneshot():
            out = [
                sample(AGENT_RSS, self._process.memory_info().rss),
                sample(AGENT_THREADS, self._process.num_threads()),
                sample(AGENT_OPEN_FDS, self._process.num_fds()),
            ]
        prev, self._prev = self._prev, (now, cpu)
        if prev is not None and now > prev[0]:
            out.append(sample(AGENT_CPU, max(0.0, cpu - prev[1]) / (now - prev[0])))
        return out
