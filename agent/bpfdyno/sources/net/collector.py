"""Network telemetry from BPF: per-process TCP/UDP bytes, connections, retransmits, RTT,
resets and packet drops by reason (``bpf/net.bpf.c``).

The kernel program aggregates into maps; every ``collect`` reads them cumulatively, turns
the deltas into host-wide rates, snapshots the per-process counters and the connection table
(for the process table and ``ListConnections``), and drains the ring buffer of rare events
into the flight recorder through ``sink``. Event latency is therefore at most one collection
interval. Snapshots are swapped in whole, so other threads read them without locks.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bpfdyno.core.events import KernelEvent, MonotonicClock
from bpfdyno.core.metrics import Sample, sample
from bpfdyno.ebpf.program import BpfLoadError, BpfRunStats, load_bpf, unload
from bpfdyno.ebpf.tracefs import ensure_tracefs
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.net.decode import (
    ProcNet,
    TcpConnection,
    connection_from_leaf,
    event_from_record,
    net_header_enums,
    proc_from_leaf,
)
from bpfdyno.sources.net.metrics import (
    CLOSED,
    DROPS,
    ESTABLISHED,
    EVENTS_LOST,
    OPENED,
    OTHER_RECEIVED,
    OTHER_SENT,
    PROC_MAP_FULL,
    RESETS,
    RETRANSMITS,
    SRTT,
    TCP_RECEIVED,
    TCP_SENT,
    UDP_RECEIVED,
    UDP_SENT,
)
from bpfdyno.sources.net.plan import BYTES_SOCK, Plan, PlanError, enum_names, make_plan

log = logging.getLogger(__name__)

EventSink = Callable[[Sequence[KernelEvent]], None]


_BYTE_METRICS = (
    ("NET_C_TCP_TX_BYTES", TCP_SENT, True),
    ("NET_C_TCP_RX_BYTES", TCP_RECEIVED, True),
    ("NET_C_UDP_TX_BYTES", UDP_SENT, True),
    ("NET_C_UDP_RX_BYTES", UDP_RECEIVED, True),
    ("NET_C_OTHER_TX_BYTES", OTHER_SENT, False),
    ("NET_C_OTHER_RX_BYTES", OTHER_RECEIVED, False),
)


class NetUnavailable(RuntimeError):
    """Asked for data while the collector is not running; the message says why."""


class NetCollector(Collector):
    """Loads net.bpf.c, reads its maps each interval and streams its events to ``sink``.

    Args:
        sink: receives the decoded events of each collection (e.g. ``FlightRecorder.add``).
        byte_source: ``auto`` (the sock tracepoints when present), ``sock`` or ``syscalls``.
        ringbuf_pages: event ring buffer size in pages (a power of two).
        probe_sample_every: sample 1 in N ``tcp:tcp_probe`` events per CPU for RTT/cwnd.
        max_socks: connections tracked at once (least recently used evicted beyond).
        max_procs: processes with per-process counters at once.
        stats_on_s: BPF run statistics are measured for this long...
        stats_period_s: ...every this many seconds (see `bpfdyno.ebpf.program.BpfRunStats`).
        tracefs: the tracefs mount (found or mounted if None).
        header_cache: where `bpfdyno.ebpf.kheaders` caches generated headers.
    """

    name = "net"

    def __init__(
        self,
        sink: EventSink | None = None,
        *,
        byte_source: str = "auto",
        ringbuf_pages: int = 64,
        probe_sample_every: int = 16,
        max_socks: int = 16384,
        max_procs: int = 16384,
        stats_on_s: float = 1.0,
        stats_period_s: float = 10.0,
        tracefs: Path | None = None,
        header_cache: Path | None = None,
    ) -> None:
        if ringbuf_pages < 1 or ringbuf_pages & (ringbuf_pages - 1):
            raise ValueError(f"ringbuf_pages must be a power of two, got {ringbuf_pages}")
        for label, value in (
            ("probe_sample_every", probe_sample_every),
            ("max_socks", max_socks),
            ("max_procs", max_procs),
        ):
            if value < 1:
                raise ValueError(f"{label} must be at least 1, got {value}")
        self._sink = sink
        self._byte_source = byte_source
        self._cflags = (
            f"-DNET_RINGBUF_PAGES={ringbuf_pages}",
            f"-DNET_PROBE_SAMPLE_EVERY={probe_sample_every}",
            f"-DNET_MAX_SOCKS={max_socks}",
            f"-DNET_MAX_PROCS={max_procs}",
        )
        self._stats_args = (stats_on_s, stats_period_s)
        self._stats: BpfRunStats | None = None
        self._tracefs = tracefs
        self._header_cache = header_cache
        self._bpf: Any = None
        self._clock = MonotonicClock()
        self._counters, self._kinds = net_header_enums()
        self._drop_names: dict[int, str] = {}
        self._reset_names: dict[int, str] = {}
        self._pending: list[KernelEvent] = []
        self._prev_totals: list[int] | None = None
        self._prev_drops: dict[int, int] = {}
        self._prev_t = 0.0
        self._procs: dict[int, ProcNet] = {}
        self._conns: list[TcpConnection] = []
        self.plan: Plan | None = None
        #: Why the collector is not running ("" while it runs).
        self.unavailable_reason = "not started"
        #: Optional parts left out on this kernel: part name -> reason.
        self.unavailable_parts: dict[str, str] = {}
        #: Events decoded so far (for self-monitoring).
        self.events_received = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Plan for this kernel, compile, attach, open the ring buffer.

        Raises:
            CollectorUnavailable: no tracefs, no byte-count source, compile or attach failure.
        """
        try:
            tracefs = self._tracefs or ensure_tracefs()
            plan = make_plan(tracefs, self._byte_source)
            bpf = load_bpf(
                "net.bpf.c", (*plan.cflags, *self._cflags), header_cache=self._header_cache
            )
        except (BpfLoadError, PlanError) as e:
            self.unavailable_reason = str(e)
            raise CollectorUnavailable(str(e)) from e
        self.unavailable_parts = dict(plan.unavailable)
        try:
            for part in plan.parts:
                try:
                    for a in part.attachments:
                        bpf.attach_tracepoint(tp=a.tracepoint.encode(), fn_name=a.fn.encode())
                except Exception as e:
                    if part.name in ("bytes", "cleanup"):
                        raise CollectorUnavailable(
                            f"attaching {part.name} tracepoints failed ({e}); run as root "
                            "with tracefs mounted"
                        ) from e
                    self.unavailable_parts[part.name] = f"attach failed: {e}"
            bpf[b"net_events"].open_ring_buffer(self._on_event)
        except BaseException:
            unload(bpf)
            raise
        self._drop_names = enum_names(tracefs, "skb:kfree_skb", "reason")
        self._reset_names = enum_names(tracefs, "tcp:tcp_send_reset", "reason")
        for missing, reason in self.unavailable_parts.items():
            log.warning("net collector: %s unavailable: %s", missing, reason)
        self._bpf = bpf
        self._stats = BpfRunStats(bpf, *self._stats_args)
        self._stats.start()
        self.plan = plan
        self.unavailable_reason = ""

    def close(self) -> None:
        """Detach and unload everything (also drops the maps); idempotent."""
        if self._stats is not None:
            self._stats.stop()
            self._stats = None
        if self._bpf is not None:
            unload(self._bpf)
            self._bpf = None
        self._procs, self._conns = {}, []
        self.unavailable_reason = "stopped"

    # -- reading -----------------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """Read the maps, publish snapshots and events, return this interval's samples."""
        bpf = self._require()
        now = time.monotonic()
        totals = self._read_totals(bpf)
        drops = {_key(k): sum(v) for k, v in _items(bpf[b"net_drops"]) if sum(v)}
        self._procs = {_key(k): proc_from_leaf(v) for k, v in _items(bpf[b"net_procs"])}
        conns = []
        for _, v in _items(bpf[b"net_socks"]):
            c = connection_from_leaf(v, self._clock)
            if c is not None:
                conns.append(c)
        self._conns = conns
        self.drain_events()

        dt = now - self._prev_t if self._prev_totals is not None else 0.0
        out = self._rate_samples(totals, drops, dt)
        self._prev_totals, self._prev_drops, self._prev_t = totals, drops, now
        established = [c for c in conns if c.state == "ESTABLISHED"]
        out.append(sample(ESTABLISHED, len(established)))
        rtts = [c.srtt_s for c in conns if not math.isnan(c.srtt_s)]
        out.append(sample(SRTT, statistics.median(rtts) if rtts else math.nan, {"stat": "p50"}))
        out.append(sample(SRTT, max(rtts) if rtts else math.nan, {"stat": "max"}))
        out.append(sample(EVENTS_LOST, totals[self._counters["NET_C_RINGBUF_DROPS"]]))
        out.append(sample(PROC_MAP_FULL, totals[self._counters["NET_C_PROC_MAP_FULL"]]))
        if self._stats is not None:
            out += self._stats.samples()
        return out

    def drain_events(self) -> list[KernelEvent]:
        """Consume the ring buffer now; hand the events to the sink and return them.

        ``collect`` calls this; call it directly only from the thread that collects.
        """
        bpf = self._require()
        bpf.ring_buffer_consume()
        events, self._pending = self._pending, []
        self.events_received += len(events)
        if events and self._sink is not None:
            try:
                self._sink(events)
            except Exception:  # the sink's failure must not cost this interval's metrics
                log.exception("the kernel event sink failed; %d events lost", len(events))
        return events

    def per_process(self) -> dict[int, ProcNet]:
        """Cumulative counters per tgid, as of the last collection.

        Raises:
            NetUnavailable: the collector is not running (the message says why).
        """
        self._require()
        return dict(self._procs)

    def connections(self) -> list[TcpConnection]:
        """Tracked TCP connections, as of the last collection.

        Raises:
            NetUnavailable: the collector is not running (the message says why).
        """
        self._require()
        return list(self._conns)

    def counter(self, name: str) -> int:
        """Current host-wide value of one ``enum net_counter`` slot (e.g. for tests)."""
        return self._read_totals(self._require())[self._counters[name]]

    def drop_reason_name(self, reason: int) -> str:
        """The kernel's name for a drop reason number."""
        return self._drop_names.get(reason, f"reason_{reason}")

    # -- internals ---------------------------------------------------------------------------

    def _require(self) -> Any:
        if self._bpf is None:
            raise NetUnavailable(f"the net collector is not running: {self.unavailable_reason}")
        return self._bpf

    def _on_event(self, ctx: Any, data: Any, size: int) -> int:
        record = self._bpf[b"net_events"].event(data)
        self._pending.append(event_from_record(record, self._clock, self._kinds, self._reset_names))
        return 0

    def _read_totals(self, bpf: Any) -> list[int]:
        out = [0] * self._counters["NET_C_MAX"]
        for k, v in _items(bpf[b"net_totals"]):
            idx = _key(k)
            if idx < len(out):
                out[idx] = int(sum(v))
        return out

    def _rate_samples(self, totals: list[int], drops: dict[int, int], dt: float) -> list[Sample]:
        prev = self._prev_totals

        def rate(slot: str) -> float:
            if prev is None or dt <= 0:
                return math.nan  # no baseline yet: unknown, not zero
            i = self._counters[slot]
            return max(0, totals[i] - prev[i]) / dt

        exact = self.plan is not None and self.plan.byte_source == BYTES_SOCK
        out = []
        for slot, spec, per_protocol in _BYTE_METRICS:
            measured = exact == per_protocol
            out.append(sample(spec, rate(slot) if measured else math.nan))
        out.append(sample(RETRANSMITS, rate("NET_C_TCP_RETRANSMITS")))
        out.append(sample(RESETS, rate("NET_C_TCP_RESETS_SENT"), {"direction": "sent"}))
        out.append(sample(RESETS, rate("NET_C_TCP_RESETS_RECEIVED"), {"direction": "received"}))
        out.append(sample(OPENED, rate("NET_C_TCP_OPENS_ACTIVE"), {"direction": "active"}))
        out.append(sample(OPENED, rate("NET_C_TCP_OPENS_PASSIVE"), {"direction": "passive"}))
        out.append(sample(CLOSED, rate("NET_C_TCP_CLOSES")))
        for reason, count in sorted(drops.items()):
            before = self._prev_drops.get(reason, 0)
            value = math.nan if prev is None or dt <= 0 else max(0, count - before) / dt
            out.append(sample(DROPS, value, {"reason": self.drop_reason_name(reason)}))
        return out


def _key(k: Any) -> int:
    """A map key as an int (batch reads give ints, per-key reads give ctypes values)."""
    return int(k) if isinstance(k, int) else int(k.value)


def _items(table: Any) -> Iterator[tuple[Any, Any]]:
    """All (key, value) pairs of a map: one batched syscall where the kernel allows it."""
    try:
        return iter(list(table.items_lookup_batch()))
    except Exception:
        # Older kernels (< 5.6) or map types without batch ops: one lookup per key.
        return iter(list(table.items()))
