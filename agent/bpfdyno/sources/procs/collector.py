"""The collector that refreshes the process table on the daemon's schedule.

`ProcessTable.update` reads /proc and the sched/net/GPU snapshots, which is blocking work:
running it as a collector puts it on its own worker thread at the configured interval. Its
samples describe the table itself; the rows are served by `bpfdyno.services.kernel`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.procs.metrics import (
    CACHE_ENTRIES,
    REFRESH_SECONDS,
    TABLE_ROWS,
)
from bpfdyno.sources.procs.table import ProcessTable


class ProcsCollector(Collector):
    """Refreshes a `ProcessTable` every interval."""

    name = "procs"

    def __init__(self, table: ProcessTable) -> None:
        self.table = table

    def start(self) -> None:
        """Check that procfs is readable.

        Raises:
            CollectorUnavailable: the proc root is missing.
        """
        if not (self.table.proc_root / "self").exists():
            raise CollectorUnavailable(
                f"{self.table.proc_root} is not a mounted procfs; mount it "
                f"(mount -t proc proc {self.table.proc_root}) or fix the path"
            )

    def collect(self) -> Sequence[Sample]:
        """Refresh the table; report its size, cost and cache sizes."""
        t0 = time.monotonic()
        rows = self.table.update()
        out = [
            sample(TABLE_ROWS, rows),
            sample(REFRESH_SECONDS, time.monotonic() - t0),
        ]
        for cache, size in self.table.cache_sizes().items():
            out.append(sample(CACHE_ENTRIES, size, {"cache": cache}))
        return out
