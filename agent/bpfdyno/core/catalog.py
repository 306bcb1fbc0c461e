"""The metric catalog: every metric bpfdyno emits, assembled from each source's table.

Each source declares its metrics in its own ``metrics`` module (pure data: importing one
loads no BPF, NVML or psutil). This module lists those tables explicitly, so the catalog is
complete as soon as anything imports it, before any collector is imported or started. The
gRPC API (``ListMetricSpecs``), ``docs/metrics.md`` and every exporter read `CATALOG`; a test
fails when a metric is declared outside the tables listed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from bpfdyno.core.metrics import MetricSpec, MetricTable
from bpfdyno.ebpf import metrics as bpf_metrics
from bpfdyno.sources.gpu import dcgm_metrics
from bpfdyno.sources.gpu import metrics as gpu_metrics
from bpfdyno.sources.host import metrics as host_metrics
from bpfdyno.sources.net import metrics as net_metrics
from bpfdyno.sources.perf import metrics as perf_metrics
from bpfdyno.sources.procs import metrics as procs_metrics
from bpfdyno.sources.sched import metrics as sched_metrics


class Catalog:
    """Declared metrics by name; a name declared by two tables is a programming error."""

    def __init__(self, tables: Iterable[MetricTable]) -> None:
        self.tables = tuple(tables)
        self._specs: dict[str, MetricSpec] = {}
        for table in self.tables:
            for spec in table:
                other = self._specs.get(spec.name)
                if other is not None:
                    raise ValueError(
                        f"metric {spec.name!r} is declared by both {other.source!r} and "
                        f"{spec.source!r}; declare each metric once"
                    )
                self._specs[spec.name] = spec

    def get(self, name: str) -> MetricSpec | None:
        return self._specs.get(name)

    def __iter__(self) -> Iterator[MetricSpec]:
        return iter(sorted(self._specs.values(), key=lambda s: s.name))

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs


#: Every source's table, in the order the docs list them.
TABLES: tuple[MetricTable, ...] = (
    host_metrics.TABLE,
    host_metrics.SELF_TABLE,
    sched_metrics.TABLE,
    net_metrics.TABLE,
    perf_metrics.PMU_TABLE,
    perf_metrics.PERF_SW_TABLE,
    gpu_metrics.TABLE,
    dcgm_metrics.TABLE,
    procs_metrics.TABLE,
    bpf_metrics.TABLE,
)

CATALOG = Catalog(TABLES)
"""The catalog of everything the daemon can emit."""
