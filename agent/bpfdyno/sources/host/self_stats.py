"""The agent's own footprint: CPU, resident memory, threads and open file descriptors.

CPU comes from ``time.process_time()`` (CLOCK_PROCESS_CPUTIME_ID: user + system time of all
the agent's threads, in nanoseconds) rather than from /proc/self/stat, whose 10 ms ticks
would make a 1 s ratio of a nearly idle agent jump between 0 and 0.01. Threads and resident
memory come from one read of ``/proc/self/stat`` (the process table's parser), open fds from
listing ``/proc/self/fd``: what psutil would read, without its per-call machinery, since
this runs every second for the life of the agent. Like every rate, the CPU ratio needs two
readings, so the first collect has none.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.core.pidfs import read_stat
from bpfdyno.sources.base import Collector
from bpfdyno.sources.host.metrics import AGENT_CPU, AGENT_OPEN_FDS, AGENT_RSS, AGENT_THREADS

_PROC = Path("/proc")


class SelfCollector(Collector):
    """Reports the agent process's own resource use, to keep its overhead visible."""

    name = "self"
    may_block = False  # this process's own /proc files

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
        self._pid = os.getpid()
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._prev: tuple[float, float] | None = None  # (clock, cpu seconds)

    def collect(self) -> Sequence[Sample]:
        """Read the agent's CPU time, RSS, thread and fd counts."""
        now, cpu = self._clock(), self._cpu_clock()
        st = read_stat(_PROC, self._pid)
        if st is None:
            raise OSError(f"cannot read /proc/{self._pid}/stat; is procfs mounted?")
        out = [
            sample(AGENT_RSS, st.rss_pages * self._page_size),
            sample(AGENT_THREADS, st.num_threads),
            sample(AGENT_OPEN_FDS, len(os.listdir("/proc/self/fd"))),
        ]
        prev, self._prev = self._prev, (now, cpu)
        if prev is not None and now > prev[0]:
            out.append(sample(AGENT_CPU, max(0.0, cpu - prev[1]) / (now - prev[0])))
        return out
