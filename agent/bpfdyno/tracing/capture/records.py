"""What a traced process's capture holds: decoded kernel, NCCL and GPU records.

Times of kernel and NCCL records are CLOCK_MONOTONIC nanoseconds (``bpf_ktime_get_ns``), as
the programs wrote them; GPU samples are taken on the same clock. `ProcessCapture` carries the
offset to the wall clock measured while capturing, and `bpfdyno.tracing.capture.tracks` turns
all of it into trace events on the trace's own time base.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class Track(enum.Enum):
    """The kernel tracks a trace can carry."""

    NET = "net"
    SCHED = "sched"
    NCCL = "nccl"
    GPU = "gpu"
    FABRIC = "fabric"


#: Every track, in the order they are listed and written.
ALL_TRACKS = (Track.NET, Track.SCHED, Track.NCCL, Track.GPU, Track.FABRIC)


@dataclass(frozen=True, slots=True)
class KernelTrackRequest:
    """Which kernel tracks a traced process's file gets, and how far back rare events go.

    Attributes:
        tracks: the tracks to record and merge (empty: none, the file stays Kineto's).
        pre_window_s: rare network events from this many seconds before the trace was
            requested are added from the flight recorder.
    """

    tracks: frozenset[Track] = frozenset()
    pre_window_s: float = 0.0

    @property
    def enabled(self) -> bool:
        """Whether anything is recorded for this process."""
        return bool(self.tracks)

    def names(self) -> tuple[str, ...]:
        """The track names, in the canonical order."""
        return tuple(t.value for t in ALL_TRACKS if t in self.tracks)


#: No kernel tracks.
NO_TRACKS = KernelTrackRequest()


@dataclass(frozen=True, slots=True)
class SocketInfo:
    """A socket's endpoints as the kernel had them (addresses printable)."""

    protocol: str  # "tcp", "udp", "mptcp"
    local: str  # "10.0.0.1:43210", "[::1]:29500"
    peer: str  # "" for an unconnected UDP socket

    def label(self) -> str:
        """E.g. ``TCP 127.0.0.1:43210 -> 127.0.0.1:29500``."""
        return f"{self.protocol.upper()} {self.local} -> {self.peer or '(unconnected)'}"


@dataclass(frozen=True, slots=True)
class NetBurst:
    """Consecutive send (or receive) calls of one thread on one socket.

    Attributes:
        tid: the calling thread.
        sk: the socket's kernel address (identifies it within the capture).
        rx: receive calls (else send calls).
        start_ns, end_ns: when the first and the last call returned.
        bytes: payload bytes moved by the calls.
        calls: how many calls (1: not coalesced).
        socket: its endpoints.
    """

    tid: int
    sk: int
    rx: bool
    start_ns: int
    end_ns: int
    bytes: int
    calls: int
    socket: SocketInfo


@dataclass(frozen=True, slots=True)
class NetEvent:
    """A rare network event of a traced process's socket.

    Attributes:
        kind: ``tcp_state``, ``tcp_retransmit``, ``tcp_reset_sent``, ``tcp_reset_received``,
            ``packet_drop``.
        ts_ns: when it happened.
        tid: the thread, 0 when it happened in softirq context.
        sk: the socket's kernel address.
        socket: its endpoints.
        attrs: kind-specific details (states, drop reason...).
    """

    kind: str
    ts_ns: int
    tid: int
    sk: int
    socket: SocketInfo
    attrs: dict[str, str | int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TcpSample:
    """A TCP connection of a traced process as the kernel had it at one of its socket calls
    (at most one per connection per ``net_tcp_sample_us``): its latency and throughput.

    Attributes:
        ts_ns: when; ``tid`` the thread whose call it was; ``sk``, ``socket`` the connection.
        srtt_us, rttvar_us: the smoothed round-trip time and its mean deviation.
        rto_us: the retransmission timeout.
        snd_cwnd: the congestion window (segments); ``packets_out`` segments sent and not
            acknowledged, ``inflight_bytes`` their bytes (snd_nxt - snd_una).
        queued_bytes: written by the process, not sent yet (write_seq - snd_nxt).
        total_retrans: segments retransmitted over the connection's life so far.
        rto_fires: consecutive retransmission timeouts at that moment (0 normally).
    """

    ts_ns: int
    tid: int
    sk: int
    socket: SocketInfo
    srtt_us: int
    rttvar_us: int
    rto_us: int
    snd_cwnd: int
    packets_out: int
    inflight_bytes: int
    queued_bytes: int
    total_retrans: int
    rto_fires: int


class OffCpu(NamedTuple):
    """One off-CPU interval of a traced thread.

    A named tuple, not a frozen dataclass like the other records: the sched track makes
    one per context switch of a traced thread (up to ~200,000 a second), and building a
    frozen dataclass of 16 fields cost four times as much (3.9 µs against 0.7 µs).

    Attributes:
        tid: the thread; ``comm`` its name.
        off_ns: switched out; ``on_ns``: switched back in.
        wake_ns: woken (blocked intervals); 0 when not seen or it never blocked.
        state: the task state at the switch-out; 0 = runnable (preempted: CPU contention).
        syscall: the system call it blocked in (x86-64), or was preempted in; negative when
            none (preempted in user mode, a page fault) or unknown.
        cpu: the CPU it came back on.
        held_pid, held_tid, held_comm: the task that held that CPU just before the thread
            got it back, i.e. that it waited for while runnable (0: the CPU was idle).
        pid: for a thread of a child process of the traced one (a DataLoader worker)
            recorded with it, that child (its pid as the host sees it, like ``tid``); 0 for
            the traced process's own threads.
        waker_pid, waker_tid: the task that woke it (blocked intervals; 0: not seen). The
            waker for a wakeup from a process (a pipe write, a futex wake); for one from an
            interrupt (a timer, a disk) whatever the interrupt found running.
        user_ns, system_ns: the thread's user and system CPU time at the switch-out
            (cumulative since it started; the kernel's accounting, by whole ticks where it
            accounts by the tick); -1 when not recorded.
    """

    tid: int
    comm: str
    off_ns: int
    wake_ns: int
    on_ns: int
    state: int
    syscall: int
    cpu: int
    held_pid: int = 0
    held_tid: int = 0
    held_comm: str = ""
    pid: int = 0
    waker_pid: int = 0
    waker_tid: int = 0
    user_ns: int = -1
    system_ns: int = -1

    @property
    def runnable(self) -> bool:
        """Preempted while runnable: the whole interval was spent waiting for a CPU."""
        return self.state == 0


@dataclass(frozen=True, slots=True)
class Reclaim:
    """A traced thread's time in direct memory reclaim: at its cgroup's memory limit (or on
    a node short of memory) the kernel reclaims pages on the CPU of the task that asked for
    one. On a CPU for all of it but the off-CPU intervals inside it (recorded as `OffCpu`).

    Attributes:
        tid: the thread; ``comm`` its name.
        start_ns, end_ns: CLOCK_MONOTONIC at the reclaim's start and end.
        cpu: the CPU it ended on.
        pid: as `OffCpu.pid` (a child process's thread; 0: the traced process's own).
    """

    tid: int
    comm: str
    start_ns: int
    end_ns: int
    cpu: int
    pid: int = 0


@dataclass(frozen=True, slots=True)
class CpuQuotaSample:
    """One cgroup's CPU quota and its cumulative throttling counters at one moment.

    Attributes:
        ts_ns: CLOCK_MONOTONIC when read.
        cgroup: the cgroup's path in its hierarchy (``/kubepods/pod1/c2``).
        quota_us, period_us: the quota (CPU time per period, over all CPUs) and its period.
        periods: periods in which the cgroup had runnable tasks (``nr_periods``).
        throttled_periods: periods in which it used its quota up (``nr_throttled``).
        throttled_ns: how long its tasks were held off the CPU in all (``throttled_usec``
            in v2, ``throttled_time`` in v1).
    """

    ts_ns: int
    cgroup: str
    quota_us: int
    period_us: int
    periods: int
    throttled_periods: int
    throttled_ns: int


@dataclass(frozen=True, slots=True)
class MemoryCgroupSample:
    """One memory cgroup's limit and its cumulative reclaim counters at one moment.

    Attributes:
        ts_ns: CLOCK_MONOTONIC when read.
        cgroup: the cgroup's path in its hierarchy.
        limit_bytes: its limit (v2: the lower of ``memory.high`` and ``memory.max``).
        limit_hits: times it reached the limit (v1 ``memory.failcnt``, v2 ``memory.events``
            high + max).
        refaults: pages read again after reclaim evicted them (``workingset_refault_*``).
        major_faults: page faults that read from the disk (``pgmajfault``).
        stall_ns: time some of its tasks stalled on memory (v2 ``memory.pressure``; 0 in v1).
    """

    ts_ns: int
    cgroup: str
    limit_bytes: int
    limit_hits: int
    refaults: int
    major_faults: int
    stall_ns: int


@dataclass(frozen=True, slots=True)
class NcclCall:
    """One NCCL API call of a traced process, with the arguments it was given.

    Attributes:
        tid: the calling thread.
        function: the NCCL function, e.g. ``ncclAllReduce``.
        start_ns, end_ns: entry and return.
        count: elements; ``datatype``, ``op``: NCCL's enum values (-1: none).
        peer: root or peer rank (-1: none).
        comm, stream, sendbuff, recvbuff: the pointers passed.
        ret: the ncclResult_t returned.
    """

    tid: int
    function: str
    start_ns: int
    end_ns: int
    count: int
    datatype: int
    op: int
    peer: int
    comm: int
    stream: int
    sendbuff: int
    recvbuff: int
    ret: int


@dataclass(frozen=True, slots=True)
class GpuSample:
    """The counters of one GPU at one moment (NaN: not available).

    Attributes:
        ts_ns: CLOCK_MONOTONIC when read.
        gpu: the GPU index.
        values: counter name (with its unit, e.g. ``utilization_percent``) -> value.
    """

    ts_ns: int
    gpu: int
    values: dict[str, float]


@dataclass(frozen=True, slots=True)
class FabricDelta:
    """How much a group of a fabric device's counters advanced over one sampling interval.

    Attributes:
        start_ns, end_ns: the interval (CLOCK_MONOTONIC, two consecutive readings).
        device: ``rdma mlx5_0:1``, ``nic eth2``, or ``cpu`` (the CPUs the process's threads
            ran on in the interval).
        group: ``bytes``, ``packets``, ``congestion``, ``errors``, ``drops``, ``pause``,
            ``interrupt time``.
        values: counter -> its advance (bytes for ``bytes``, ns for ``interrupt time``,
            counts for the others).
    """

    start_ns: int
    end_ns: int
    device: str
    group: str
    values: dict[str, int]


@dataclass(frozen=True, slots=True)
class FabricEvent:
    """A link of a traced process's fabric went down or came up.

    Attributes:
        ts_ns: the reading that saw it.
        kind: ``rdma_link_down``, ``rdma_link_up``, ``nic_carrier_down``, ``nic_carrier_up``.
        attrs: the device and its state.
    """

    ts_ns: int
    kind: str
    attrs: dict[str, str | int] = field(default_factory=dict)


KernelRecord = (
    NetBurst
    | NetEvent
    | TcpSample
    | OffCpu
    | Reclaim
    | CpuQuotaSample
    | MemoryCgroupSample
    | NcclCall
    | GpuSample
    | FabricDelta
    | FabricEvent
)
#: An `OffCpu` as the capture keeps it until its file is written: a plain tuple of its fields
#: in order. The garbage collector stops following a plain tuple of numbers and strings after
#: its first pass, not a named tuple or a dataclass: a capture at its cap keeps 100,000
#: records a process, and each full collection walked them all (40 % of the capture thread's
#: time at ~150,000 records a second, a full collection every 0.4 s). `unpacked` makes the
#: record again.
PackedOffCpu = tuple[Any, ...]


def unpacked(record: KernelRecord | PackedOffCpu) -> KernelRecord:
    """The record a kept one stands for (`PackedOffCpu` or the record itself)."""
    return OffCpu._make(record) if type(record) is tuple else record  # type: ignore[return-value]


#: The track each kind of record belongs to.
TRACK_OF: dict[type, Track] = {
    NetBurst: Track.NET,
    NetEvent: Track.NET,
    TcpSample: Track.NET,
    OffCpu: Track.SCHED,
    Reclaim: Track.SCHED,
    CpuQuotaSample: Track.SCHED,
    MemoryCgroupSample: Track.SCHED,
    NcclCall: Track.NCCL,
    GpuSample: Track.GPU,
    FabricDelta: Track.FABRIC,
    FabricEvent: Track.FABRIC,
}


@dataclass(slots=True)
class TrackStats:
    """What one track recorded for a process, and what it lost.

    Attributes:
        events: records kept.
        lost_kernel: records the kernel could not write (ring buffer full).
        calls: socket calls seen (net; bursts hold several).
        short_offcpu: off-CPU intervals under the minimum, counted only (sched), and
            ``short_offcpu_ns`` their total length.
        note: why the track is missing or partial ("" when complete).
        info: what else the trace's info slice says of the track (``<track>_<key>``).
    """

    events: int = 0
    lost_kernel: int = 0
    calls: int = 0
    short_offcpu: int = 0
    short_offcpu_ns: int = 0
    note: str = ""
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class ProcessCapture:
    """Everything recorded for one traced process, from its trace request to its file.

    Attributes:
        pid: the traced process.
        request: the tracks asked for.
        begin_ns, end_ns: CLOCK_MONOTONIC when capturing started and stopped.
        begin_wall_ns: the wall clock when capturing started.
        offset_ns: wall clock minus CLOCK_MONOTONIC, measured while capturing (the mean of
            the readings at the start and the end); ``drift_ns`` the difference between them.
        records: the kept records, oldest first per source.
        stats: per track.
        dropped_over_cap: records dropped because the per-process cap was reached (oldest
            first).
        cap: that cap.
        settings: the capture settings that shape the records (coalescing, minimums).
        distributed: the process's rank and world size from its environment (``RANK``,
            ``WORLD_SIZE``, ``LOCAL_RANK`` as torchrun sets them), read when capturing began;
            None when it has none.
        host_pid: when ``pid`` is the pid the process knows itself by in its container, its
            pid as the host sees it (the sched track's thread ids and child pids are the
            host's); 0 when they are the same.
    """

    pid: int
    request: KernelTrackRequest
    begin_ns: int
    end_ns: int
    begin_wall_ns: int
    offset_ns: int
    drift_ns: int
    records: list[KernelRecord]
    stats: dict[Track, TrackStats]
    dropped_over_cap: int
    cap: int
    settings: dict[str, int] = field(default_factory=dict)
    distributed: dict[str, int] | None = None
    host_pid: int = 0
