"""The process table's rows as samples of the per-process metric families, for exporters.

One set of series per row, so an export holds at most as many processes as the table: its
``top_n`` most active plus the registered trainers, however many processes come and go.
Unknown values (a collector not running) are left out, never exported as 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from bpfdyno.core.metrics import MetricSpec, Sample
from bpfdyno.rpc.processes import ProcessRow
from bpfdyno.sources.procs.metrics import (
    PROCESS_CPU,
    PROCESS_OFFCPU_BLOCKED,
    PROCESS_ONCPU,
    PROCESS_RSS,
    PROCESS_RUNQ_WAIT,
    PROCESS_TCP_RECEIVED,
    PROCESS_TCP_RETRANSMITS,
    PROCESS_TCP_SENT,
    PROCESS_THREADS,
    PROCESS_UDP_RECEIVED,
    PROCESS_UDP_SENT,
)

_NS = 1e-9

#: Each family with the value it takes from a row (None or NaN: unknown, left out).
_FIELDS: tuple[tuple[MetricSpec, Callable[[ProcessRow], float | int | None]], ...] = (
    (PROCESS_CPU, lambda r: r.cpu_ratio),
    (PROCESS_RSS, lambda r: r.rss_bytes),
    (PROCESS_THREADS, lambda r: r.num_threads),
    (PROCESS_ONCPU, lambda r: None if r.oncpu_ns is None else r.oncpu_ns * _NS),
    (PROCESS_RUNQ_WAIT, lambda r: None if r.runq_wait_ns is None else r.runq_wait_ns * _NS),
    (
        PROCESS_OFFCPU_BLOCKED,
        lambda r: None if r.offcpu_blocked_ns is None else r.offcpu_blocked_ns * _NS,
    ),
    (PROCESS_TCP_SENT, lambda r: r.tcp_tx_bytes),
    (PROCESS_TCP_RECEIVED, lambda r: r.tcp_rx_bytes),
    (PROCESS_UDP_SENT, lambda r: r.udp_tx_bytes),
    (PROCESS_UDP_RECEIVED, lambda r: r.udp_rx_bytes),
    (PROCESS_TCP_RETRANSMITS, lambda r: r.tcp_retransmits),
)


def row_samples(rows: Iterable[ProcessRow]) -> list[Sample]:
    """Samples of every per-process family for ``rows`` (unknown values left out)."""
    out: list[Sample] = []
    for row in rows:
        labels = (
            ("pid", str(row.pid)),
            ("comm", row.comm),
            ("user", row.user),
            ("slurm_job_id", row.slurm_job_id),
            ("k8s_pod_uid", row.k8s_pod_uid),
        )
        for spec, get in _FIELDS:
            value = get(row)
            if value is None or math.isnan(value):
                continue
            out.append(Sample(spec, float(value), labels))
    return out
