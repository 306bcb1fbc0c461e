"""Network telemetry from BPF: per-process TCP/UDP bytes, connections, retransmits, RTT,
resets and packet drops by reason (``bpf/net.bpf.c``).

The kernel program aggregates into maps; every ``collect`` reads them cumulatively, turns
the deltas into host-wide rates, snapshots the per-process counters and the connection table
(for the process table and ``ListConnections``), and drains the ring buffer of rare events
into the flight recorder through ``sink``. Event latency is therefore at most one collection
interval. Snapshots are swapped in whole, so other threads read them without locks.

A process's byte counters are in the slot of its tgid in a slot table (``bpfdyno_nslots``:
no hash lookup on the per-call path) while it holds that slot, else in the hash
``bpfdyno_nprocs``; a process's counts are the sum of the two (bytes never move between
them, so the two reads need no ordering).

Under the overhead budget (`reductions`): the per-call byte programs may do their
per-process and per-socket accounting only part of the time (each process's byte counts are
then scaled up by the share of the interval it was done: estimates; the host-wide byte rates
stay exact, counted at every call); if that is not enough, BTF-typed byte programs are also
detached in that off phase (the kernel's entry into them at every call is most of what a
datagram flood costs; the host-wide byte rates are then scaled up too and labelled
``estimate="sampled"``); and rare-event programs that a storm made frequent may be detached
(what they count is then not known: NaN, never 0).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from array import array
from collections.abc import Collection, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bpfdyno.core.budget import SAMPLED, Reduction, degraded_by, sampled_share
from bpfdyno.core.config import NetSection
from bpfdyno.core.events import EventSink, KernelEvent, MonotonicClock
from bpfdyno.core.metrics import Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.maps import map_items, percpu_sums
from bpfdyno.ebpf.program import BpfProgram, RingBuffer
from bpfdyno.ebpf.reductions import DetachedFunctions, SampledFunctions
from bpfdyno.ebpf.runstats import DEFAULT_ON_S, DEFAULT_PERIOD_S
from bpfdyno.ebpf.tracefs import ensure_tracefs
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.net.decode import (
    NET_SOCK_TUPLE,
    TCP_ESTABLISHED,
    ProcNet,
    TcpConnection,
    connection_from_leaf,
    event_from_record,
    net_control_slots,
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
from bpfdyno.sources.net.plan import (
    BYTES_SOCK,
    KERNEL_BTF,
    Plan,
    PlanError,
    enum_names,
    make_plan,
)

log = logging.getLogger(__name__)


# The program's maps (bpf/net.bpf.c).
_TOTALS = "bpfdyno_ntotals"
_CTL = "bpfdyno_nctl"
_DROPS = "bpfdyno_ndrops"
_PROCS = "bpfdyno_nprocs"
_SOCKS = "bpfdyno_nsocks"
_SLOTS = "bpfdyno_nslots"
_EVENTS = "bpfdyno_nevents"

_BYTE_METRICS = (
    ("NET_C_TCP_TX_BYTES", TCP_SENT, True),
    ("NET_C_TCP_RX_BYTES", TCP_RECEIVED, True),
    ("NET_C_UDP_TX_BYTES", UDP_SENT, True),
    ("NET_C_UDP_RX_BYTES", UDP_RECEIVED, True),
    ("NET_C_OTHER_TX_BYTES", OTHER_SENT, False),
    ("NET_C_OTHER_RX_BYTES", OTHER_RECEIVED, False),
)


#: Slots of the per-process slot table (``struct net_slots``); a power of two.
PROC_SLOTS = 1024
#: A slot's 64-bit words (``struct net_slot``): the holder's tgid, then the six byte counters.
_SLOT_WORDS = 8
_SLOT_FREE, _SLOT_BUSY = 0, 0xFFFF_FFFF_FFFF_FFFF

#: The share of the time the byte programs stay attached while the budget samples them.
BYTES_SAMPLE_SHARE = 1 / 8
#: Rare-event parts the budget may detach in a storm: (part, functions, what is lost).
_DETACHABLE = (
    ("drops", ("bpfdyno_ndrop",), "packet drops by reason are not counted (net_drops: NaN)"),
    ("rtt", ("bpfdyno_nprobe",), "RTT and congestion window are not updated (net_tcp_srtt: NaN)"),
    (
        "tcp_events",
        ("bpfdyno_nretx", "bpfdyno_nrstsnd", "bpfdyno_nrstrcv"),
        "retransmits and resets are not counted or streamed (their rates: NaN)",
    ),
    (
        "connections",
        ("bpfdyno_nstate",),
        "connection opens, closes and their events are missing; new connections are not tracked",
    ),
)
#: Which metrics each detachable part feeds (reported as NaN while it is detached).
_FED_BY = {
    "drops": (DROPS,),
    "rtt": (SRTT,),
    "tcp_events": (RETRANSMITS, RESETS),
    "connections": (OPENED, CLOSED, ESTABLISHED),
}


def detached_step(part: str) -> str:
    """The name of the budget step that detaches one of `_DETACHABLE`'s parts."""
    return f"net.{part}_detached"


class NetUnavailable(RuntimeError):
    """Asked for data while the collector is not running; the message says why."""


class NetCollector(Collector):
    """Loads net.bpf.c, reads its maps each interval and streams its events to ``sink``.

    The defaults of the sizes and settings are the ``[net]`` config section's.

    Args:
        sink: receives the decoded events of each collection (e.g. ``FlightRecorder.add``).
        byte_source: ``auto`` (the sock tracepoints when present), ``sock`` or ``syscalls``
            (``[net] byte_source``).
        ringbuf_pages: event ring buffer size in pages, a power of two
            (``[net] ringbuf_pages``).
        probe_sample_every: sample 1 in N ``tcp:tcp_probe`` events per CPU for RTT/cwnd
            (``[net] probe_sample_every``).
        max_socks: TCP sockets tracked at once, least recently used evicted beyond
            (``[net] max_socks``).
        max_procs: processes with per-process counters at once (``[net] max_procs``).
        proc_slots: slots of the per-process slot table, a power of two (0: none): a
            process holding one counts its bytes without a hash lookup; the others (and
            every process's retransmits) are in the hash of ``max_procs``.
        stats_on_s: BPF run statistics are measured for this long...
        stats_period_s: ...every this many seconds (see `bpfdyno.ebpf.runstats.BpfRunStats`).
        tracefs: the tracefs mount (found or mounted if None).
        header_cache: where `bpfdyno.ebpf.kheaders` caches generated headers.
        btf_programs: make the programs on hot paths BTF-typed where the kernel has BTF
            (`bpfdyno.sources.net.plan`; False: classic tracepoints everywhere, as on a
            kernel without BTF; the benchmarks compare the two).

    Raises:
        ValueError: a size the kernel would refuse.
    """

    name = "net"
    may_block = False  # BPF maps

    def __init__(
        self,
        sink: EventSink | None = None,
        *,
        byte_source: str = NetSection.byte_source,
        ringbuf_pages: int = NetSection.ringbuf_pages,
        probe_sample_every: int = NetSection.probe_sample_every,
        max_socks: int = NetSection.max_socks,
        max_procs: int = NetSection.max_procs,
        proc_slots: int = PROC_SLOTS,
        stats_on_s: float = DEFAULT_ON_S,
        stats_period_s: float = DEFAULT_PERIOD_S,
        tracefs: Path | None = None,
        header_cache: Path | None = None,
        btf_programs: bool = True,
    ) -> None:
        if ringbuf_pages < 1 or ringbuf_pages & (ringbuf_pages - 1):
            raise ValueError(f"[net] ringbuf_pages must be a power of two, got {ringbuf_pages}")
        for label, value in (
            ("probe_sample_every", probe_sample_every),
            ("max_socks", max_socks),
            ("max_procs", max_procs),
        ):
            if value < 1:
                raise ValueError(f"[net] {label} must be at least 1, got {value}")
        if proc_slots < 0 or proc_slots & (proc_slots - 1):
            raise ValueError(f"proc_slots must be 0 or a power of two, got {proc_slots}")
        self._sink = sink
        self._byte_source = byte_source
        self._defines = {
            "NET_RINGBUF_PAGES": ringbuf_pages,
            "NET_PROBE_SAMPLE_EVERY": probe_sample_every,
            "NET_MAX_SOCKS": max_socks,
            "NET_MAX_PROCS": max_procs,
            "NET_PROC_SLOTS": proc_slots,
        }
        self._stats_args = (stats_on_s, stats_period_s)
        self._tracefs = tracefs
        self._header_cache = header_cache
        self._btf_programs = btf_programs
        self._program: BpfProgram | None = None
        self._events: RingBuffer[KernelEvent] | None = None
        self._clock = MonotonicClock()
        self._counters, self._kinds = net_header_enums()
        self._drop_names: dict[int, str] = {}
        self._reset_names: dict[int, str] = {}
        self._prev_totals: list[int] | None = None
        self._prev_drops: dict[int, int] = {}
        self._prev_t = 0.0
        self._procs: dict[int, ProcNet] = {}
        self._socks: list[Any] = []  # struct net_sock values of the last collection
        #: (when the last collection read the socket map, monotonic; its sockets): swapped
        #: whole, so a reader on another thread gets one collection's pair.
        self._socks_read: tuple[float, list[Any]] = (0.0, [])
        self.plan: Plan | None = None
        #: Why the collector is not running ("" while it runs).
        self.unavailable_reason = "not started"
        #: Optional parts left out on this kernel: part name -> reason.
        self.unavailable_parts: dict[str, str] = {}
        #: Events decoded so far (for self-monitoring).
        self.events_received = 0
        # The overhead budget's steps (made at start) and what scaling needs between rounds.
        self._bytes_sampled: SampledFunctions | None = None
        self._bytes_detached: SampledFunctions | None = None
        self._bytes_detached_off_ns = 0
        self._detachable: dict[str, DetachedFunctions] = {}
        self._bytes_held_off_ns = 0
        self._byte_fns: tuple[str, ...] = ()
        self._raw_procs: dict[int, ProcNet] = {}
        #: tgid -> bytes added by scaling sampled intervals up (ProcNet's six byte fields).
        self._extra: dict[int, list[float]] = {}

    @classmethod
    def from_config(cls, section: NetSection, *, sink: EventSink | None = None) -> NetCollector:
        """Build the collector from the ``[net]`` config section."""
        return cls(
            sink,
            byte_source=section.byte_source,
            ringbuf_pages=section.ringbuf_pages,
            probe_sample_every=section.probe_sample_every,
            max_socks=section.max_socks,
            max_procs=section.max_procs,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Plan for this kernel, compile, attach, open the ring buffer.

        Raises:
            CollectorUnavailable: no tracefs, no byte-count source, compile or attach failure.
        """
        try:
            tracefs = self._tracefs or ensure_tracefs()
            plan = make_plan(
                tracefs, self._byte_source, btf=self._btf_programs and KERNEL_BTF.is_file()
            )
            program = BpfProgram.load(
                "net.bpf.c",
                defines=self._defines,
                cflags=plan.cflags,
                flavour=plan.header_flavour,
                header_cache=self._header_cache,
            )
        except (BpfLoadError, PlanError) as e:
            self.unavailable_reason = str(e)
            raise CollectorUnavailable(str(e)) from e
        self.unavailable_parts = dict(plan.unavailable)
        try:
            for part in plan.parts:
                try:
                    for a in part.attachments:
                        if plan.btf and a.btf:
                            program.attach_btf_tracepoint(a.event, a.fn)
                        else:
                            program.attach_tracepoint(a.tracepoint, a.fn)
                except BpfLoadError as e:
                    if part.name in ("bytes", "cleanup"):
                        raise CollectorUnavailable(
                            f"{e} (the net collector cannot work without its {part.name} "
                            "tracepoints)"
                        ) from e
                    self.unavailable_parts[part.name] = f"attach failed: {e}"
            self._events = program.open_ring_buffer(_EVENTS, self._decode_event)
        except BaseException:
            program.close()
            raise
        self._drop_names = enum_names(tracefs, "skb:kfree_skb", "reason")
        self._reset_names = enum_names(tracefs, "tcp:tcp_send_reset", "reason")
        for missing, reason in self.unavailable_parts.items():
            log.warning("net collector: %s unavailable: %s", missing, reason)
        self._program = program
        program.start_run_stats(*self._stats_args)
        self.plan = plan
        self._make_reductions(program, plan)
        self.unavailable_reason = ""

    def _make_reductions(self, program: BpfProgram, plan: Plan) -> None:
        bytes_part = next(p for p in plan.parts if p.name == "bytes")
        self._byte_fns = tuple(dict.fromkeys(a.fn for a in bytes_part.attachments))
        self._bytes_sampled = SampledFunctions(
            program,
            self._byte_fns,
            BYTES_SAMPLE_SHARE,
            flag=(_CTL, net_control_slots()["NET_CTL_BYTES_OFF"]),
            name="net.bytes_sampled",
            part=self.name,
            what=(
                f"per-process and per-socket byte accounting done {BYTES_SAMPLE_SHARE:.1%} of "
                "the time (sampled in time; every call is still counted host-wide)"
            ),
            lost=(
                "each process's byte counts are estimates scaled from the sampled time, and "
                "connections' byte counts hold the sampled calls only; host-wide byte rates "
                "stay exact"
            ),
        )
        self._bytes_detached = None
        if plan.btf and all(a.btf for a in bytes_part.attachments):
            # BTF-typed, they detach and attach again in well under a millisecond, so the
            # budget may take them off in the off phase too (a classic tracepoint's detach
            # waits for the kernel: ~70 ms).
            self._bytes_detached = SampledFunctions(
                program,
                self._byte_fns,
                BYTES_SAMPLE_SHARE,
                after=self._bytes_sampled,
                name="net.bytes_detached",
                part=self.name,
                what=(
                    "the per-call byte programs detached in their off phase too (attached "
                    f"{BYTES_SAMPLE_SHARE:.1%} of the time)"
                ),
                lost=(
                    "host-wide TCP and UDP byte rates are estimates scaled from the sampled "
                    'time too (estimate="sampled"), besides each process\'s byte counts'
                ),
            )
        self._bytes_held_off_ns = self._bytes_sampled.held_off_ns()
        self._bytes_detached_off_ns = (
            self._bytes_detached.held_off_ns() if self._bytes_detached else 0
        )
        attached = {
            a.fn for p in plan.parts if p.name not in self.unavailable_parts for a in p.attachments
        }
        self._detachable = {
            part: DetachedFunctions(
                program,
                fns,
                name=detached_step(part),
                part=self.name,
                what=f"the {', '.join(fns)} program(s) detached",
                lost=lost,
            )
            for part, fns, lost in _DETACHABLE
            if set(fns) & attached
        }

    def reductions(self) -> Sequence[Reduction]:
        """The budget's steps: sample the byte programs, detach rare-event programs."""
        first = [s for s in (self._bytes_sampled, self._bytes_detached) if s is not None]
        return [*first, *self._detachable.values()]

    def health(self) -> tuple[PartState, str] | None:
        """Degraded while the budget holds one of this collector's steps."""
        return degraded_by(self.reductions())

    def close(self) -> None:
        """Detach and unload everything (also drops the maps); idempotent."""
        if self._program is not None:
            self._program.close()
            self._program = None
            self._events = None
        self._procs, self._socks, self._socks_read = {}, [], (0.0, [])
        self.unavailable_reason = "stopped"

    # -- reading -----------------------------------------------------------------------------

    def collect(self) -> Sequence[Sample]:
        """Read the maps, publish snapshots and events, return this interval's samples."""
        program = self._require()
        now = time.monotonic()
        totals = self._read_totals(program)
        held_off = self._bytes_sampled.held_off_ns() if self._bytes_sampled else 0
        detached_off = self._bytes_detached.held_off_ns() if self._bytes_detached else 0
        dt_s = now - self._prev_t if self._prev_totals is not None else 0.0
        # The host-wide counts missed the calls of the time the programs were detached; the
        # per-process ones also those of the time they were told off (one phase for both:
        # the longer off time is the share they did not see).
        host_share = sampled_share(detached_off - self._bytes_detached_off_ns, dt_s)
        share = min(sampled_share(held_off - self._bytes_held_off_ns, dt_s), host_share)
        self._bytes_held_off_ns, self._bytes_detached_off_ns = held_off, detached_off
        drops = self._read_drops(program, totals)
        raw = self._read_procs(program)
        self._procs = self._scaled_procs(raw, share)
        # Decoded into TcpConnections only when asked for (connections()): most rounds need
        # just the state and RTT of each socket.
        socks = [v for _, v in map_items(program.table(_SOCKS)) if v.flags & NET_SOCK_TUPLE]
        self._socks = socks
        self._socks_read = (now, socks)
        self.drain_events()

        out = self._rate_samples(totals, drops, dt_s, host_share)
        self._prev_totals, self._prev_drops, self._prev_t = totals, drops, now
        out.append(sample(ESTABLISHED, sum(1 for v in socks if v.state == TCP_ESTABLISHED)))
        rtts = [v.srtt_us / 1e6 for v in socks if v.srtt_us]
        out.append(sample(SRTT, statistics.median(rtts) if rtts else math.nan, {"stat": "p50"}))
        out.append(sample(SRTT, max(rtts) if rtts else math.nan, {"stat": "max"}))
        out.append(sample(EVENTS_LOST, totals[self._counters["NET_C_RINGBUF_DROPS"]]))
        out.append(sample(PROC_MAP_FULL, totals[self._counters["NET_C_PROC_MAP_FULL"]]))
        out += program.run_stats_samples()
        detached = {
            spec.name
            for part, r in self._detachable.items()
            if r.active
            for spec in _FED_BY.get(part, ())
        }
        if detached:  # what a detached program feeds is not known, never 0
            out = [sample_nan(s) if s.spec.name in detached else s for s in out]
        return out

    def _scaled_procs(self, raw: dict[int, ProcNet], share: float) -> dict[int, ProcNet]:
        """Each process's counters, the byte counts of sampled intervals scaled up.

        Exactly the map's values as long as the byte programs were never sampled.
        """
        prev, self._raw_procs = self._raw_procs, raw
        if share >= 1.0 and not self._extra:
            return raw
        extra: dict[int, list[float]] = {}
        out: dict[int, ProcNet] = {}
        for tgid, p in raw.items():
            now = p.byte_counts()
            add = list(self._extra.get(tgid, (0.0,) * len(now)))
            if 0 < share < 1.0:
                before = prev.get(tgid)
                was = before.byte_counts() if before is not None else (0,) * len(now)
                for i, (a, b) in enumerate(zip(was, now, strict=True)):
                    if b > a:
                        add[i] += (b - a) / share - (b - a)
            extra[tgid] = add
            tx, rx, utx, urx, otx, orx = (int(n + e) for n, e in zip(now, add, strict=True))
            out[tgid] = ProcNet(tx, rx, utx, urx, otx, orx, p.tcp_retransmits)
        self._extra = extra
        return out

    def drain_events(self) -> list[KernelEvent]:
        """Consume the ring buffer now; hand the events to the sink and return them.

        ``collect`` calls this; call it directly only from the thread that collects.
        """
        self._require()
        events = self._events.drain() if self._events is not None else []
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
        return self._decoded(self._socks, None)

    def connections_of(self, pids: Collection[int]) -> tuple[float, list[TcpConnection]] | None:
        """The tracked TCP connections of ``pids`` as of the last collection, with when that
        read the socket map (monotonic seconds); None while the collector is not running.
        Only these processes' sockets are decoded (the detection asks for its ranks' every
        interval, on a node that may hold thousands of others)."""
        if self._program is None:
            return None
        at, socks = self._socks_read
        return at, self._decoded(socks, pids)

    def retransmits_counted_since(self) -> float:
        """Since when (monotonic seconds) every retransmit has been counted: a connection's
        retransmits over an interval that began earlier miss those of the time the budget
        kept their program detached (inf while it does, or when it could not attach)."""
        if self._program is None or "retransmits" in self.unavailable_parts:
            return math.inf
        step = self._detachable.get("tcp_events")
        return step.complete_since() if step is not None else math.inf

    def _decoded(self, socks: list[Any], pids: Collection[int] | None) -> list[TcpConnection]:
        """The sockets (of ``pids``; None: all) as connections. While the budget keeps the
        RTT program detached their RTT is not known (NaN): the map keeps the last one it
        wrote, which would read as current (a slowed link as healthy)."""
        rtt = self._detachable.get("rtt")
        stale_rtt = rtt is not None and rtt.active
        conns = []
        for v in socks:
            if pids is None or v.tgid in pids:
                c = connection_from_leaf(v, self._clock)
                if c is not None:
                    conns.append(replace(c, srtt_s=math.nan) if stale_rtt else c)
        return conns

    def counter(self, name: str) -> int:
        """Current host-wide value of one ``enum net_counter`` slot (e.g. for tests)."""
        return self._read_totals(self._require())[self._counters[name]]

    def drop_reason_name(self, reason: int) -> str:
        """The kernel's name for a drop reason number."""
        return self._drop_names.get(reason, f"reason_{reason}")

    # -- internals ---------------------------------------------------------------------------

    def _require(self) -> BpfProgram:
        if self._program is None:
            raise NetUnavailable(f"the net collector is not running: {self.unavailable_reason}")
        return self._program

    def _decode_event(self, record: Any) -> KernelEvent:
        return event_from_record(record, self._clock, self._kinds, self._reset_names)

    def _read_procs(self, program: BpfProgram) -> dict[int, ProcNet]:
        """Each process's counters: its slot's bytes plus its hash entry's, if it has them.

        Bytes never move between the two (a slot is emptied only when its process is gone),
        so reading one after the other misses or doubles nothing.
        """
        procs = {int(k): proc_from_leaf(v) for k, v in map_items(program.table(_PROCS))}
        if not self._defines["NET_PROC_SLOTS"]:
            return procs
        words: array[int] = array("Q")
        words.frombytes(memoryview(program.table(_SLOTS).getvalue(0)).cast("B"))
        holders = words[0::_SLOT_WORDS]  # each slot's first word: its holder
        # A set of the holders, in C, rather than a Python loop over every slot (most are
        # free); a holder's slot is its tgid modulo the table's size.
        for tgid in set(holders).difference((_SLOT_FREE, _SLOT_BUSY)):
            at = (tgid % len(holders)) * _SLOT_WORDS + 1
            counts = words[at : at + 6]
            had = procs.get(tgid)
            if had is not None:
                counts = array("Q", (a + b for a, b in zip(counts, had.byte_counts(), strict=True)))
            tx, rx, utx, urx, otx, orx = counts
            procs[tgid] = ProcNet(tx, rx, utx, urx, otx, orx, had.tcp_retransmits if had else 0)
        return procs

    def _read_drops(self, program: BpfProgram, totals: list[int]) -> dict[int, int]:
        """Drops by reason: the per-CPU array of every reason (256 slots times every CPU) is
        read only when the total moved since the last round (drops are rare)."""
        total = totals[self._counters["NET_C_DROPS"]]
        if (
            self._prev_totals is not None
            and total == self._prev_totals[self._counters["NET_C_DROPS"]]
        ):
            return self._prev_drops
        return {i: n for i, n in enumerate(percpu_sums(program.table(_DROPS))) if n}

    def _read_totals(self, program: BpfProgram) -> list[int]:
        """Host-wide counters, indexed by ``enum net_counter`` (NET_C_MAX slots)."""
        return percpu_sums(program.table(_TOTALS))

    def _rate_samples(
        self, totals: list[int], drops: dict[int, int], dt: float, byte_share: float = 1.0
    ) -> list[Sample]:
        """The interval's host-wide rates; the byte programs were attached ``byte_share`` of
        it (their rates are then scaled up from that time and labelled estimates)."""
        prev = self._prev_totals

        def rate(slot: str, share: float = 1.0) -> float:
            if prev is None or dt <= 0 or share <= 0:
                return math.nan  # no baseline yet (or nothing seen): unknown, not zero
            i = self._counters[slot]
            return max(0, totals[i] - prev[i]) / (dt * share)

        exact = self.plan is not None and self.plan.byte_source == BYTES_SOCK
        est = SAMPLED if byte_share < 1.0 else ""
        out = []
        for slot, spec, per_protocol in _BYTE_METRICS:
            measured = exact == per_protocol  # counted at every call while attached
            value = rate(slot, byte_share) if measured else math.nan
            out.append(sample(spec, value, estimate=est if measured else ""))
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


def sample_nan(s: Sample) -> Sample:
    """The same series without a value this round (not known)."""
    return Sample(s.spec, math.nan, s.labels)
