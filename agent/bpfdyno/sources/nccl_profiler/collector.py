"""The daemon's part for the NCCL profiler plugin: polls the receiver every round.

It reports no series of its own (yet): what it gathers is read through `receiver.snapshot()`
by whoever compares ranks (the job-wide straggler test), and its state, shown by `status`,
says whether any trainer on the node uses the plugin and which files it refused. While a
trainer's file is read, it keeps the normal cadence whoever reads (the plugin's ring is
sized for it, and detection compares ranks from it); while no trainer uses the plugin,
nothing fills between two rounds and it looks for files at the daemon's slow cadence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from bpfdyno.core.metrics import Sample
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import Collector
from bpfdyno.sources.nccl_profiler.receiver import DEFAULT_SHM_DIR, NcclProfilerReceiver


class NcclProfilerCollector(Collector):
    """Reads the plugin files of this node's trainers each round."""

    name = "nccl_profiler"
    # Reading /proc/<pid>/status and stat may wait on a trainer's memory-map lock.
    may_block = True

    def __init__(
        self,
        shm_dir: Path = DEFAULT_SHM_DIR,
        trainer_pids: Callable[[], Iterable[int]] = lambda: (),
        proc_root: Path = Path("/proc"),
    ) -> None:
        self.receiver = NcclProfilerReceiver(shm_dir=shm_dir, proc_root=proc_root)
        self._trainer_pids = trainer_pids

    def collect(self) -> Sequence[Sample]:
        self.receiver.poll(self._trainer_pids())
        return ()

    def longest_interval_s(self) -> float:
        """The normal cadence while some trainer's file is read (0: no longer interval keeps
        up with its ring); any while none is (nothing fills)."""
        return 0.0 if self.receiver.in_use() else math.inf

    def health(self) -> tuple[PartState, str] | None:
        status = self.receiver.status()
        return status.state, status.reason
