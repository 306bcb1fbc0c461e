"""The network and scheduler capture of traced processes: ``bpf/capture.bpf.c``.

`KernelCapture` compiles the program once (`load`) and keeps it loaded, but attaches its
functions only while some process is traced: `add` puts a tgid into ``bpfdyno_ctgids`` (and
attaches the net or sched functions if it is the first process that wants them), `remove`
takes it out, collects what is still in the maps for it (bursts not yet written, its
counters) and detaches the functions nobody needs any more. So when nothing is traced, no
function of this program runs: the kernel's hot paths are as without it.

A traced process's child processes (one level: its DataLoader workers) are recorded with it
when the sched track is: those alive when it is added are put into the map here, those it
forks later by the program itself; their off-CPU intervals come back as the parent's records
(`OffCpu.pid` names the child), so a main thread waiting for its workers can be explained by
what they waited for.

Not thread-safe: one thread (the capture manager's) makes every call.
"""

from __future__ import annotations

import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from bpfdyno.core.config import CaptureSection
from bpfdyno.core.text import shown_c_string
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.headers import header_defines, header_enum, header_text
from bpfdyno.ebpf.maps import map_items, percpu_sums
from bpfdyno.ebpf.program import BpfProgram, RingBuffer, loaded_program_ids
from bpfdyno.ebpf.tracefs import TracefsError, ensure_tracefs, read_format
from bpfdyno.sources.net.decode import AF_INET6, format_addr, state_name
from bpfdyno.sources.net.plan import enum_names, format_fields
from bpfdyno.tracing.capture.records import (
    KernelRecord,
    NetBurst,
    NetEvent,
    PackedOffCpu,
    Reclaim,
    SocketInfo,
    TcpSample,
    Track,
    TrackStats,
)

log = logging.getLogger(__name__)

SOURCE = "capture.bpf.c"
_TGIDS = "bpfdyno_ctgids"
_THREADS = "bpfdyno_cthread"
_BURSTS = "bpfdyno_cbursts"
_SOCKS = "bpfdyno_csocks"
_LISTEN = "bpfdyno_clisten"
_TOTALS = "bpfdyno_ctotals"
_NET_RING = "bpfdyno_cnet"
_SCHED_RING = "bpfdyno_csched"

_PROTOCOLS = {6: "tcp", 17: "udp", 262: "mptcp"}


@dataclass(frozen=True, slots=True)
class Attachment:
    """One function on one raw tracepoint; a required one makes its track unavailable when it
    cannot be attached, an optional one only loses its kind of event."""

    tracepoint: str
    fn: str
    required: bool
    what: str


NET_ATTACHMENTS = (
    Attachment("sock_send_length", "bpfdyno_csend", True, "socket sends"),
    Attachment("sock_recv_length", "bpfdyno_crecv", True, "socket receives"),
    Attachment("inet_sock_set_state", "bpfdyno_cstate", False, "TCP state changes"),
    Attachment("tcp_retransmit_skb", "bpfdyno_cretx", False, "retransmits"),
    Attachment("tcp_send_reset", "bpfdyno_crstsnd", False, "resets sent"),
    Attachment("tcp_receive_reset", "bpfdyno_crstrcv", False, "resets received"),
    Attachment("kfree_skb", "bpfdyno_cdrop", False, "packet drops"),
)
SCHED_ATTACHMENTS = (
    Attachment("sched_switch", "bpfdyno_cswitch", True, "context switches"),
    Attachment("sched_waking", "bpfdyno_cwaking", True, "wakeups"),
    Attachment("sched_process_fork", "bpfdyno_cfork", False, "child processes forked while traced"),
    Attachment("sched_process_exit", "bpfdyno_cexit", False, "exits of child processes"),
    # Time in direct reclaim, on the thread's own CPU: under its cgroup's memory limit that
    # is the limit's time, not the thread's work.
    Attachment("mm_vmscan_memcg_reclaim_begin", "bpfdyno_creclaimin", False, "memory reclaim"),
    Attachment("mm_vmscan_memcg_reclaim_end", "bpfdyno_creclaimout", False, "memory reclaim"),
    Attachment("mm_vmscan_direct_reclaim_begin", "bpfdyno_creclaimin", False, "memory reclaim"),
    Attachment("mm_vmscan_direct_reclaim_end", "bpfdyno_creclaimout", False, "memory reclaim"),
)
_ATTACHMENTS = {Track.NET: NET_ATTACHMENTS, Track.SCHED: SCHED_ATTACHMENTS}
_GEN = "bpfdyno_cgen"


@cache
def capture_enums() -> tuple[dict[str, int], dict[int, str], dict[str, int]]:
    """(counter name -> slot, net kind number -> name, CAP_F_* flags), from ``capture.h``."""
    text = header_text("capture.h")
    counters = header_enum(text, "cap_counter")
    kinds = {n: name for name, n in header_enum(text, "cap_net_kind").items()}
    return counters, kinds, header_defines(text, "CAP_F_")


@cache
def reclaim_state() -> int:
    """``CAP_STATE_RECLAIM``: the state of a `bpfdyno_csched` record that is a reclaim."""
    return header_defines(header_text("capture.h"), "CAP_STATE_")["CAP_STATE_RECLAIM"]


#: Thread names kept decoded (`KernelCapture._comm`); beyond it the cache starts again.
_COMMS_KEPT = 4096

_NET_KIND_NAMES = {
    "CAP_NET_STATE": "tcp_state",
    "CAP_NET_RETRANSMIT": "tcp_retransmit",
    "CAP_NET_RESET_SENT": "tcp_reset_sent",
    "CAP_NET_RESET_RECEIVED": "tcp_reset_received",
    "CAP_NET_DROP": "packet_drop",
}


def optional_cflags(tracefs: Path | None) -> list[str]:
    """-D flags for the tracepoint arguments this kernel has (from their tracefs formats).

    Without tracefs none are set: the program then reads no argument it cannot be sure of
    (retransmit errors, reset and drop reasons read as 0).
    """
    if tracefs is None:
        return []
    checks = (
        ("tcp:tcp_retransmit_skb", "err", "CAP_RETX_HAS_ERR"),
        ("tcp:tcp_send_reset", "reason", "CAP_RST_HAS_REASON"),
        ("skb:kfree_skb", "reason", "CAP_DROP_HAS_REASON"),
        ("skb:kfree_skb", "rx_sk", "CAP_DROP_HAS_RXSK"),
    )
    out = []
    for tracepoint, name, flag in checks:
        fmt = read_format(tracefs, tracepoint)
        if fmt is not None and name in format_fields(fmt):
            out.append(f"-D{flag}")
    return out


@dataclass(slots=True)
class RemovedProcess:
    """What `KernelCapture.remove` hands back: the records still held in maps, the counters."""

    records: list[KernelRecord] = field(default_factory=list)
    stats: dict[Track, TrackStats] = field(default_factory=dict)


class KernelCapture:
    """capture.bpf.c: loaded once, attached while some traced process wants net or sched.

    Args:
        settings: the ``[capture]`` section (map sizes, ring buffers, coalescing).
        header_cache: where generated kernel headers are cached.
    """

    def __init__(self, settings: CaptureSection, header_cache: Path | None = None) -> None:
        self._settings = settings
        self._header_cache = header_cache
        self._program: BpfProgram | None = None
        self._rings: list[RingBuffer[tuple[int, KernelRecord | PackedOffCpu | None]]] = []
        self._counters, kinds, self._flags = capture_enums()
        self._kinds = {n: _NET_KIND_NAMES.get(name, "") for n, name in kinds.items()}
        self._send_kind = kinds_by_name(kinds)["CAP_NET_SEND"]
        self._recv_kind = kinds_by_name(kinds)["CAP_NET_RECV"]
        self._tcp_kind = kinds_by_name(kinds)["CAP_NET_TCP"]
        self._drop_names: dict[int, str] = {}
        self._reset_names: dict[int, str] = {}
        self._sockets: dict[tuple[Any, ...], SocketInfo] = {}
        self._comms: dict[bytes, str] = {}
        self._reclaim_state = reclaim_state()
        self._attached: dict[Track, bool] = {Track.NET: False, Track.SCHED: False}
        self._procs: dict[int, frozenset[Track]] = {}
        # Removed processes, whose last records may still be in the ring buffers.
        self._removed: set[int] = set()
        #: Optional attachments this kernel lacks: "what" -> reason.
        self.missing: dict[str, str] = {}
        #: Tracks that cannot be recorded here: track -> reason.
        self.unavailable: dict[Track, str] = {}
        #: Records that arrived for a process not traced (must stay 0: the kernel filters).
        self.foreign_records = 0

    # -- lifecycle ----------------------------------------------------------------------

    def load(self) -> None:
        """Compile and load the program (nothing is attached).

        Raises:
            BpfLoadError: compiling or loading failed; the message says what to do.
        """
        s = self._settings
        tracefs: Path | None
        try:
            tracefs = ensure_tracefs()
        except TracefsError as e:
            log.warning("capture: %s; reset and drop reasons will not be read", e)
            tracefs = None
        defines = {
            "CAP_MAX_PROCS": s.max_processes,
            "CAP_MAX_THREADS": s.max_threads,
            "CAP_MAX_SOCKS": s.max_sockets,
            "CAP_RINGBUF_PAGES": s.ringbuf_pages,
            "CAP_COALESCE_GAP_NS": s.net_coalesce_gap_us * 1000,
            "CAP_COALESCE_MAX_NS": s.net_coalesce_max_us * 1000,
            "CAP_MIN_OFFCPU_NS": s.sched_min_offcpu_us * 1000,
            "CAP_TCP_SAMPLE_NS": s.net_tcp_sample_us * 1000,
        }
        program = BpfProgram.load(
            SOURCE,
            defines=defines,
            cflags=optional_cflags(tracefs),
            flavour="btf",
            header_cache=self._header_cache,
        )
        try:
            self._rings = [
                program.open_ring_buffer(_NET_RING, self._decode_net),
                program.open_ring_buffer(_SCHED_RING, self._decode_sched),
            ]
        except BaseException:
            program.close()
            raise
        if tracefs is not None:
            self._drop_names = enum_names(tracefs, "skb:kfree_skb", "reason")
            self._reset_names = enum_names(tracefs, "tcp:tcp_send_reset", "reason")
        self._program = program

    @property
    def loaded(self) -> bool:
        return self._program is not None

    def loaded_ids(self) -> frozenset[int]:
        """The kernel's ids of its functions loaded now (any thread; none once closed)."""
        return loaded_program_ids(self._program)

    def close(self) -> None:
        """Detach and unload (idempotent)."""
        if self._program is not None:
            self._program.close()
            self._program = None
        self._rings = []
        self._procs.clear()
        self._attached = {Track.NET: False, Track.SCHED: False}

    # -- traced processes -----------------------------------------------------------------

    def add(self, tgid: int, tracks: frozenset[Track]) -> dict[Track, str]:
        """Start recording ``tracks`` (net and/or sched) of process ``tgid``.

        Returns:
            Track -> why it cannot be recorded (empty when all can).
        """
        program = self._require()
        wanted = frozenset(t for t in tracks if t in _ATTACHMENTS)
        problems: dict[Track, str] = {}
        for track in sorted(wanted, key=lambda t: t.value):
            if not self._attached[track]:
                reason = self._attach(track)
                if reason:
                    problems[track] = reason
        wanted = frozenset(t for t in wanted if t not in problems)
        if not wanted:
            return problems
        table = program.table(_TGIDS)
        leaf = table.Leaf()
        leaf.flags = (self._flags["CAP_F_NET"] if Track.NET in wanted else 0) | (
            self._flags["CAP_F_SCHED"] if Track.SCHED in wanted else 0
        )
        try:
            table[table.Key(tgid)] = leaf
        except Exception as e:  # the map is full: more traced processes than max_processes
            for track in wanted:
                problems[track] = (
                    f"more than {self._settings.max_processes} processes are traced at once "
                    f"({e}); raise [capture] max_processes"
                )
            self._detach_unused()
            return problems
        self._procs[tgid] = wanted
        self._removed.discard(tgid)
        if Track.SCHED in wanted:
            self._add_children(table, tgid)
        return problems

    def _add_children(self, table: Any, tgid: int) -> None:
        """Put ``tgid``'s child processes alive now into the map (those it forks from now on
        the program adds); not over an entry of their own."""
        flags = self._flags["CAP_F_SCHED"] | self._flags["CAP_F_CHILD"]
        for child in child_pids(tgid):
            key = table.Key(child)
            try:
                table[key]
            except KeyError:
                leaf = table.Leaf()
                leaf.flags = flags
                leaf.parent = tgid
                try:
                    table[key] = leaf
                except Exception:  # full: the same as the program's count says
                    log.debug("capture: no room for child %d of %d", child, tgid)
                    return

    def remove(self, tgid: int) -> RemovedProcess:
        """Stop recording process ``tgid``; return what the maps still held for it.

        Call `drain` first: records already in the ring buffers are not part of this.
        """
        program = self._require()
        out = RemovedProcess()
        wanted = self._procs.pop(tgid, frozenset())
        if len(self._removed) > 4096:
            self._removed.clear()
        self._removed.add(tgid)
        table = program.table(_TGIDS)
        key = table.Key(tgid)
        try:
            leaf = table[key]
        except KeyError:
            leaf = None
        else:
            del table[key]
        # Its children (still alive) leave with it; the threads of processes no longer in
        # the map are forgotten below.
        self._forget(table, lambda v: int(v.parent) == tgid)
        traced_now = {k if isinstance(k, int) else int(k.value) for k, _ in map_items(table)}
        if leaf is not None:
            if Track.NET in wanted:
                out.stats[Track.NET] = TrackStats(
                    events=int(leaf.net_events),
                    lost_kernel=int(leaf.net_lost),
                    calls=int(leaf.calls),
                )
            if Track.SCHED in wanted:
                out.stats[Track.SCHED] = TrackStats(
                    events=int(leaf.offcpu),
                    lost_kernel=int(leaf.offcpu_lost),
                    short_offcpu=int(leaf.short_count),
                    short_offcpu_ns=int(leaf.short_ns),
                )
        bursts = program.table(_BURSTS)
        for k, b in map_items(bursts):
            if int(b.tgid) != tgid:
                continue
            out.records.append(
                NetBurst(
                    tid=int(k.tid),
                    sk=int(k.sk),
                    rx=bool(k.rx),
                    start_ns=int(b.first_ns),
                    end_ns=int(b.last_ns),
                    bytes=int(b.bytes),
                    calls=int(b.calls),
                    socket=self._socket(
                        int(k.sk),
                        int(b.tuple.family),
                        int(b.tuple.protocol),
                        int(b.tuple.sport),
                        int(b.tuple.dport),
                        bytes(b.tuple.saddr),
                        bytes(b.tuple.daddr),
                    ),
                )
            )
            if Track.NET in out.stats:
                out.stats[Track.NET].events += 1
            del bursts[k]
        self._forget(program.table(_THREADS), lambda v: int(v.tgid) not in traced_now)
        self._forget(program.table(_SOCKS), lambda v: int(v) == tgid)
        self._forget(program.table(_LISTEN), lambda v: int(v) == tgid)
        self._detach_unused()
        return out

    def traced(self) -> dict[int, frozenset[Track]]:
        """The processes being recorded, with their tracks."""
        return dict(self._procs)

    def program_fds(self) -> dict[str, int]:
        """Loaded function -> fd (for BPF run statistics); a function loads when first
        attached."""
        return self._require().program_fds()

    def program_ids(self) -> dict[str, int]:
        """Loaded function -> kernel program id (what ``bpftool`` shows)."""
        return self._require().program_ids()

    def counters(self) -> dict[str, int]:
        """The host-wide ``enum cap_counter`` values by name (e.g. ``CAP_C_THREAD_FULL``)."""
        sums = percpu_sums(self._require().table(_TOTALS))
        return {name: sums[slot] for name, slot in self._counters.items() if name != "CAP_C_MAX"}

    # -- reading ----------------------------------------------------------------------------

    def drain(self) -> dict[int, list[KernelRecord | PackedOffCpu]]:
        """Consume both ring buffers now; records by tgid (off-CPU intervals packed)."""
        out: dict[int, list[KernelRecord | PackedOffCpu]] = defaultdict(list)
        if self._program is None:
            return out
        for ring in self._rings:
            for tgid, record in ring.drain():
                if record is None:
                    continue
                if tgid not in self._procs and tgid not in self._removed:
                    self.foreign_records += 1
                out[tgid].append(record)
        return out

    def fill(self) -> float:
        """The fullest ring buffer's share filled at the last `drain` (0-1)."""
        return max((ring.fill for ring in self._rings), default=0.0)

    # -- internals --------------------------------------------------------------------------

    def _require(self) -> BpfProgram:
        if self._program is None:
            raise RuntimeError("the capture program is not loaded")
        return self._program

    def _attach(self, track: Track) -> str:
        """Attach one track's functions; "" on success, else why the track is unavailable."""
        program = self._require()
        done: list[str] = []
        for a in _ATTACHMENTS[track]:
            bump = (lambda: _bump_generation(program)) if a.fn == "bpfdyno_cswitch" else None
            try:
                program.attach_raw_tracepoint(a.tracepoint, a.fn, before_attach=bump)
            except BpfLoadError as e:
                if a.required:
                    for tp in done:
                        program.detach_raw_tracepoint(tp)
                    reason = f"cannot record {a.what}: {e}"
                    self.unavailable[track] = reason
                    return reason
                self.missing[a.what] = str(e)
                log.warning("capture: %s will not be recorded: %s", a.what, e)
                continue
            done.append(a.tracepoint)
        self._attached[track] = True
        self.unavailable.pop(track, None)
        return ""

    def _detach_unused(self) -> None:
        needed = {t for tracks in self._procs.values() for t in tracks}
        program = self._require()
        for track, attached in self._attached.items():
            if attached and track not in needed:
                for a in _ATTACHMENTS[track]:
                    program.detach_raw_tracepoint(a.tracepoint)
                self._attached[track] = False

    @staticmethod
    def _forget(table: Any, belongs: Callable[[Any], bool]) -> None:
        """Delete the entries whose value ``belongs`` (scalar keys come back as ints)."""
        for k, v in map_items(table):
            if belongs(v):
                with contextlib.suppress(KeyError):
                    del table[table.Key(k) if isinstance(k, int) else k]

    def _socket(
        self,
        sk: int,
        family: int,
        protocol: int,
        sport: int,
        dport: int,
        saddr: bytes,
        daddr: bytes,
    ) -> SocketInfo:
        key = (sk, family, protocol, sport, dport, saddr, daddr)
        info = self._sockets.get(key)
        if info is None:
            if len(self._sockets) > 4 * self._settings.max_sockets:
                self._sockets.clear()
            local = _endpoint(family, saddr, sport)
            peer = _endpoint(family, daddr, dport) if dport else ""
            info = SocketInfo(_PROTOCOLS.get(protocol, str(protocol)), local, peer)
            self._sockets[key] = info
        return info

    def _decode_net(self, e: Any) -> tuple[int, KernelRecord | None]:
        tgid = int(e.tgid)
        kind = int(e.kind)
        sock = self._socket(
            int(e.sk),
            int(e.family),
            int(e.protocol),
            int(e.sport),
            int(e.dport),
            bytes(e.saddr),
            bytes(e.daddr),
        )
        if kind in (self._send_kind, self._recv_kind):
            return tgid, NetBurst(
                tid=int(e.tid),
                sk=int(e.sk),
                rx=kind == self._recv_kind,
                start_ns=int(e.start_ns),
                end_ns=int(e.ts_ns),
                bytes=int(e.bytes),
                calls=int(e.calls),
                socket=sock,
            )
        if kind == self._tcp_kind:
            return tgid, TcpSample(
                ts_ns=int(e.ts_ns),
                tid=int(e.tid),
                sk=int(e.sk),
                socket=sock,
                srtt_us=int(e.srtt_us),
                rttvar_us=int(e.rttvar_us),
                rto_us=int(e.rto_us),
                snd_cwnd=int(e.snd_cwnd),
                packets_out=int(e.packets_out),
                inflight_bytes=int(e.inflight_bytes),
                queued_bytes=int(e.queued_bytes),
                total_retrans=int(e.total_retrans),
                rto_fires=int(e.rto_fires),
            )
        name = self._kinds.get(kind, "")
        if not name:
            return tgid, None
        attrs: dict[str, str | int] = {"state": state_name(int(e.state))}
        if int(e.tcp_valid):
            # The connection when it happened: a retransmit's timeout and how many before it.
            attrs.update(
                srtt_us=int(e.srtt_us),
                rto_us=int(e.rto_us),
                inflight_bytes=int(e.inflight_bytes),
                total_retrans=int(e.total_retrans),
                rto_fires=int(e.rto_fires),
            )
        if name == "tcp_state":
            attrs["oldstate"] = state_name(int(e.oldstate))
        elif name == "packet_drop":
            attrs["reason"] = self._drop_names.get(int(e.detail), str(int(e.detail)))
        elif name == "tcp_reset_sent":
            attrs["reason"] = self._reset_names.get(int(e.detail), str(int(e.detail)))
        return tgid, NetEvent(name, int(e.ts_ns), int(e.tid), int(e.sk), sock, attrs)

    def _decode_sched(self, e: Any) -> tuple[int, KernelRecord | PackedOffCpu | None]:
        # The hot path of the sched track (one record per context switch of a traced
        # thread): the record's fields are ints already, an off-CPU interval is kept as a
        # plain tuple (`PackedOffCpu`), and thread names are decoded once each.
        tgid, tid = e.tgid, e.tid
        pid = e.pid if e.pid != tgid else 0  # a child's thread (host pids, like tids)
        comm = self._comm(e.comm)
        if e.state == self._reclaim_state:
            return tgid, Reclaim(
                tid=tid, comm=comm, start_ns=e.off_ns, end_ns=e.on_ns, cpu=e.cpu, pid=pid
            )
        return tgid, (  # OffCpu's fields, in order
            tid,
            comm,
            e.off_ns,
            e.wake_ns,
            e.on_ns,
            e.state,
            e.syscall,
            e.cpu,
            e.held_tgid,
            e.held_tid,
            self._comm(e.held_comm),
            pid,
            e.waker_tgid,
            e.waker_tid,
            e.utime_ns,
            e.stime_ns,
        )

    def _comm(self, raw: bytes) -> str:
        """A thread name from a record (`shown_c_string`), decoded once per distinct name."""
        shown = self._comms.get(raw)
        if shown is None:
            if len(self._comms) >= _COMMS_KEPT:
                self._comms.clear()
            shown = self._comms[raw] = shown_c_string(bytes(raw))
        return shown


def child_pids(pid: int) -> list[int]:
    """The child processes of process ``pid`` now (each thread's ``children`` list, which
    Linux keeps since 3.5 with CONFIG_PROC_CHILDREN); empty when it is gone or the kernel
    lacks the file (then only children forked while traced are recorded)."""
    out: set[int] = set()
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    for task in tasks:
        try:
            out.update(int(w) for w in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(out)


def kinds_by_name(kinds: Mapping[int, str]) -> dict[str, int]:
    """Invert ``enum cap_net_kind``: member name -> number."""
    return {name: n for n, name in kinds.items()}


def _endpoint(family: int, raw: bytes, port: int) -> str:
    addr = format_addr(family, raw)
    return f"[{addr}]:{port}" if family == AF_INET6 else f"{addr}:{port}"


def _bump_generation(program: BpfProgram) -> None:
    """Tell the switch function it was off (`bpfdyno_cgen`, see bpf/capture.bpf.c)."""
    table = program.table(_GEN)
    key = table.Key(0)
    table[key] = table.Leaf((int(table[key].value) + 1) & 0xFFFFFFFF)
