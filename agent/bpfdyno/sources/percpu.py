"""How often per-CPU series are reported: every round on a node of up to
``[daemon] per_cpu_series_max`` CPUs, every few rounds on a bigger one.

A round costs per CPU (each CPU's counters read and decoded, a handful of series each
stored and exported): ~80 µs per CPU here, 1.8 % of a core on a 224-CPU node at one round a
second (docs/performance.md, "The idle agent's cost model"). Reporting the per-CPU series of
an N-CPU node every ceil(N / max) rounds keeps that part of the cost at what ``max`` CPUs cost,
whatever the node. The values stay exact: each rate covers the longer interval (the counters
are cumulative); host-wide totals are still reported every round.

While someone reads per-CPU series (`PER_CPU_READS`, noted by the metric API), they are
reported every round: the slow cadence is for when nobody looks.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

#: Per-CPU series are reported every round for this long after someone read one.
READ_DEMAND_S = 10.0


class PerCpuReads:
    """When per-CPU series were last read (the metric API notes each read that returned
    one); thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None

    def note(self) -> None:
        with self._lock:
            self._at = self._clock()

    def wanted(self) -> bool:
        """Whether someone read per-CPU series in the last `READ_DEMAND_S` seconds."""
        with self._lock:
            return self._at is not None and self._clock() - self._at < READ_DEMAND_S


#: The process-wide record of per-CPU reads.
PER_CPU_READS = PerCpuReads()


def rounds_between(cpus: int, most: int) -> int:
    """Rounds between two reports of per-CPU series on ``cpus`` CPUs (1: every round).

    Args:
        cpus: CPUs of the node.
        most: ``[daemon] per_cpu_series_max``; 0 reports every round whatever the node.
    """
    return 1 if most <= 0 or cpus <= most else math.ceil(cpus / most)


class PerCpuCadence:
    """Says which rounds report per-CPU series: the first, then every ``every``-th, and every
    one while someone reads them (``reads``)."""

    def __init__(self, every: int = 1, reads: PerCpuReads | None = None) -> None:
        self.every = max(1, every)
        self._reads = reads if reads is not None else PER_CPU_READS
        self._round = -1

    def due(self) -> bool:
        """Whether this round (one call per round) reports them."""
        self._round += 1
        return self._round % self.every == 0 or self._reads.wanted()
