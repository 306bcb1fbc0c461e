"""The collector that refreshes the process table on the daemon's schedule.

`ProcessTable.update` reads /proc and the sched/net/GPU snapshots, which is blocking work:
running it as a collector puts it on its own worker thread at the configured interval. Its
samples describe the table itself; the rows are served by `bpfdyno.services.kernel`.

The table has readers only now and then (`ps`, the TUI, a scrape): while nobody read it in
the last few seconds it is refreshed every `IDLE_REFRESH_S` instead of every round (its
rates then cover that longer interval), and every round again as soon as someone reads it.
On an idle node that was the largest share of the agent's own cost. A read never gets that
idle table: `ProcessTable.fresh_snapshot` updates it first when it is older than a round
(`bpfdyno.services.kernel`), so the idle cadence only sets the interval the first read's
rates cover; it matches the thread walk's idle cadence (`SchedCollector`), which each
update of the table brings up to date.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bpfdyno.core.budget import REQUESTED
from bpfdyno.core.metrics import Sample, sample
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.procs.metrics import (
    CACHE_ENTRIES,
    REFRESH_SECONDS,
    TABLE_ROWS,
)
from bpfdyno.sources.procs.table import ProcessTable

#: How often the table is refreshed while nobody reads it.
IDLE_REFRESH_S = 10.0


class ProcsCollector(Collector):
    """Refreshes a `ProcessTable` every interval while it is read, less often otherwise.

    Args:
        table: the table.
        clock: monotonic seconds.
    """

    name = "procs"

    def __init__(self, table: ProcessTable, clock: Callable[[], float] = time.monotonic) -> None:
        self.table = table
        self._clock = clock
        self._refreshed_at: float | None = None
        self._last: list[Sample] = []

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
        """Refresh the table (see the module docstring); report its size, cost, caches."""
        now = self._clock()
        if (
            self._refreshed_at is not None
            and now - self._refreshed_at < IDLE_REFRESH_S
            and not self.table.in_demand()
        ):
            return self._last  # nobody reads it: the last refresh stands
        idle_due = self._refreshed_at is None or now - self._refreshed_at >= IDLE_REFRESH_S
        self._refreshed_at = now
        t0 = time.monotonic()
        # Refreshed every round only because someone reads: that work is the readers'.
        with REQUESTED.work(() if idle_due else self.table.readers(), bounded=False):
            rows = self.table.update()
        out = [
            sample(TABLE_ROWS, rows),
            sample(REFRESH_SECONDS, time.monotonic() - t0),
        ]
        for cache, size in self.table.cache_sizes().items():
            out.append(sample(CACHE_ENTRIES, size, {"cache": cache}))
        self._last = out
        return out
