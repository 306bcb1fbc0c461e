"""The daemon's metric catalog: every source's table, listed explicitly.

The list lives with the assembly, the one place that knows every part: the catalog is
complete as soon as anything imports it, before any collector is imported or started, and
`bpfdyno.core` imports no source. A test fails when a metric is declared outside these
tables, or a table is missing here.
"""

from __future__ import annotations

from bpfdyno.core.catalog import Catalog
from bpfdyno.core.metrics import MetricTable
from bpfdyno.detection import metrics as detection_metrics
from bpfdyno.ebpf import metrics as bpf_metrics
from bpfdyno.sources.budget import metrics as budget_metrics
from bpfdyno.sources.fabric import metrics as fabric_metrics
from bpfdyno.sources.gpu import dcgm_metrics
from bpfdyno.sources.gpu import metrics as gpu_metrics
from bpfdyno.sources.host import metrics as host_metrics
from bpfdyno.sources.irq import metrics as irq_metrics
from bpfdyno.sources.kubelet import metrics as kubelet_metrics
from bpfdyno.sources.net import metrics as net_metrics
from bpfdyno.sources.perf import metrics as perf_metrics
from bpfdyno.sources.procs import metrics as procs_metrics
from bpfdyno.sources.sched import metrics as sched_metrics

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
    kubelet_metrics.TABLE,
    fabric_metrics.TABLE,
    irq_metrics.TABLE,
    bpf_metrics.TABLE,
    budget_metrics.TABLE,
    detection_metrics.TABLE,
)

CATALOG = Catalog(TABLES)
"""The catalog of everything the daemon can emit."""
