"""What the machine took from every process at once: interrupts and the hypervisor.

Tests that time a process against the wall clock allow for it: on a shared VM the hypervisor
can hold a CPU for milliseconds (steal), delaying a timer's wakeup or leaving a spinning
process neither running nor waiting for its CPU (the scheduler's task clock leaves both out).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def host_taken() -> Iterator[list[float]]:
    """Seconds the CPUs spent, over the block, on interrupts and in the hypervisor's hands
    (``/proc/stat``'s irq, softirq and steal, summed over every CPU): a spinning process is
    neither running nor waiting for the CPU meanwhile (the scheduler's task clock leaves both
    out), so a busy share may fall short of its wall time by up to this. The list holds the
    figure once the block is done."""

    def ticks() -> int:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return sum(int(fields[i]) for i in (6, 7, 8))  # irq, softirq, steal

    before = ticks()
    taken: list[float] = []
    yield taken
    # A tick counter: one more tick per CPU at most is a part-tick before or after the block.
    taken.append((ticks() - before + (os.cpu_count() or 1)) / os.sysconf("SC_CLK_TCK"))
