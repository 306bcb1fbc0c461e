"""The diagnosis vocabulary: what one rank's trace shows (`RankEvidence`) and what the ranks
of a job show together (`Verdict`), shared by the agent, which reads its own trace files,
and every client, which compares the ranks of a job across nodes.

The records' field names are those of the messages in ``diagnosis.proto`` (units in the
names), mapped by `bpfdyno.rpc.wire` like every record of the API.
How the evidence is read from a file is `bpfdyno.analysis.evidence`; how ranks are compared
is `bpfdyno.analysis.verdict`.

Causes (`CAUSES`) are the reasons the kernel can give for a rank's lost time. Each names
what the kernel saw, never a guess: ``cpu_wait`` is time a thread of the rank was runnable
but another task held its CPU; the blocked causes come from the task state and the system
call the thread slept in; ``network_loss`` from TCP retransmits, resets and drops on the
rank's own sockets; ``gpu_compute`` from the GPU's own kernels (CUPTI) and its clocks.
"""

from __future__ import annotations

from bpfdyno.rpc.v1 import diagnosis_pb2
from bpfdyno.rpc.wire import record

#: Cause -> how it is said. The order is the order of listing when times are equal.
CAUSES: dict[str, str] = {
    "cpu_wait": "waiting for a CPU",
    "cpu_quota": "throttled by its CPU quota",
    "memory": "memory pressure: reclaim at its cgroup's memory limit",
    "data_loader": "waiting for DataLoader workers",
    "file_io": "blocked in file I/O",
    "io_wait": "blocked on a socket, pipe or event",
    "disk": "disk or file I/O (uninterruptible sleep: reads, writes, page faults)",
    "disk_cpu": "the kernel's work on its CPU in the disk reads it slept in",
    "file_io_cpu": "the kernel's work on its CPU in the file I/O it slept in",
    "lock": "blocked on a lock or another thread",
    "sleep": "sleeping",
    "blocked": "blocked (other)",
    "network_loss": "network loss (TCP retransmits, resets, drops)",
    "network_latency": "slow network links (TCP round trips)",
    "gpu_compute": "more GPU compute",
    "fabric": "fabric congestion or errors (RDMA ports, NICs)",
    "interrupts": "CPU time taken by interrupts and softirqs",
    "on_cpu": "on a CPU: its own work took longer",
    "unexplained": "not seen by the kernel (slower compute or Python work)",
}

#: A read cause -> the cause under which a run-up's evidence keeps the kernel's work on the
#: thread's CPU in the reads it slept in for that cause (filling the page cache, copying):
#: the reads' cost, which the verdict adds to them and says apart.
READ_CPU: dict[str, str] = {"disk": "disk_cpu", "file_io": "file_io_cpu"}

#: The parts of a step (`StepSplit`) besides the main thread's off-CPU causes.
STEP_PARTS: dict[str, str] = {
    "collectives": "in collectives",
    "on_cpu": "main thread on a CPU",
    "gpu_busy": "GPU busy",
}

#: The capture's off-CPU causes (`bpfdyno.tracing.capture.causes`) as diagnosis causes.
OFFCPU_CAUSE = {
    "runnable": "cpu_wait",
    "file io": "file_io",
    "io wait": "io_wait",
    "disk/uninterruptible": "disk",
    "lock": "lock",
    "sleep": "sleep",
    "blocked": "blocked",
}


@record(diagnosis_pb2.CauseTime)
class CauseTime:
    """Time spent for one cause (or, in a holder list, by one task holding the CPU)."""

    cause: str
    seconds: float
    detail: str = ""


@record(diagnosis_pb2.Instance)
class Instance:
    """One occurrence worth looking at in Perfetto: where it is in its file and what it was.

    Attributes:
        cause: its cause (`CAUSES`).
        ts_us: its ``ts`` in the trace file (µs on the file's base, as Perfetto reads it).
        start_unix_ns: the same moment on the host's wall clock.
        duration_ns: how long.
        detail: e.g. ``held by stress (pid 4242)``, ``read``, ``tcp_retransmit to 10.0.0.2:29500``.
        tid: the thread (0: not a thread's).
        path: the trace file it is in (set in a verdict, whose findings gather instances of
            several ranks; a rank's own evidence leaves it empty).
    """

    cause: str
    ts_us: float
    start_unix_ns: int
    duration_ns: int
    detail: str = ""
    tid: int = 0
    path: str = ""


@record(diagnosis_pb2.CollectiveEvidence)
class CollectiveEvidence:
    """One collective as one rank saw it, with what the kernel saw the rank do before it.

    Attributes:
        op: ``allreduce``, ``broadcast``, ``send``...
        source: ``gpu`` (an NCCL kernel), ``gloo``/``nccl`` (the backend's span on the CPU),
            ``enqueue`` (the c10d call), ``nccl_call`` (bpfdyno's NCCL probe).
        group: the ordered stream it belongs to on this rank (process group, CUDA stream).
        index: its place in that stream within the trace (0, 1, ...).
        step: the step it is in (0 = the trace's first step; -1 when the trace has none).
        size_bytes: payload when known.
        arrival_unix_ns: when this rank joined it (host wall clock).
        end_unix_ns: when it completed on this rank.
        before: what the rank's threads spent, by cause, from its previous collective's
            arrival (or the window's start) to this arrival: the run-up.
        during: the same from its arrival to its end.
        holders: the tasks that held the CPU while the rank waited for one in the run-up.
        worst: the longest instance of each cause in the run-up and during.
        loss_events: TCP retransmits, resets and drops (not duplicates) on the rank's sockets
            from the run-up's start to the end.
        fabric_congestion, fabric_errors: what the rank's RDMA ports and NICs counted over the
            same time (the fabric track): congestion signals (CNPs, ECN marks, transmit waits,
            pause frames), and errors (link errors, drops, discards).
        workers: while the main thread waited for its DataLoader workers in the run-up
            (``data_loader``), what the workers (its child processes, recorded with it) waited
            for meanwhile, by cause, each at most that wait; ``worker_pids`` which they were.
        nccl_seq: NCCL's sequence number of it in its communicator (NCCL's profiler plugin's
            rows in the file); None without them.
    """

    op: str
    source: str
    group: str
    index: int
    step: int
    size_bytes: int
    arrival_unix_ns: int
    end_unix_ns: int
    before: tuple[CauseTime, ...] = ()
    during: tuple[CauseTime, ...] = ()
    holders: tuple[CauseTime, ...] = ()
    worst: tuple[Instance, ...] = ()
    loss_events: int = 0
    fabric_congestion: int = 0
    fabric_errors: int = 0
    workers: tuple[CauseTime, ...] = ()
    worker_pids: tuple[int, ...] = ()
    nccl_seq: int | None = None


@record(diagnosis_pb2.LossEvent)
class LossEvent:
    """A TCP retransmit, reset or packet drop on one of the rank's sockets.

    ``kind`` is ``tcp_retransmit``, ``tcp_reset_sent``, ``tcp_reset_received``,
    ``packet_drop``, or ``duplicate``: a drop of data the socket had already (the copy of a
    retransmit that was not needed), which is no loss but tells which retransmit was not one.
    """

    kind: str
    ts_us: float
    unix_ns: int
    local: str
    peer: str


@record(diagnosis_pb2.ConnectionRtt)
class ConnectionRtt:
    """One TCP connection of the rank in the window: its smoothed round-trip times (the net
    track's samples), median and largest, and how many samples."""

    local: str
    peer: str
    srtt_median_ms: float
    srtt_max_ms: float
    samples: int


@record(diagnosis_pb2.CpuQuota)
class CpuQuota:
    """A cgroup of the rank with a CPU quota (``quota_us`` per ``period_us``): the periods
    of the window, how many it was throttled in, and for how long in all."""

    cgroup: str
    quota_us: int
    period_us: int
    periods: int
    throttled_periods: int
    throttled_seconds: float


@record(diagnosis_pb2.MemoryCgroup)
class MemoryCgroup:
    """A memory cgroup of the rank with a limit of ``limit_bytes``: what the window added to
    its limit hits, refaults (pages read again after reclaim evicted them), major faults,
    and the time its tasks stalled on memory (cgroup v2's pressure; 0 in v1)."""

    cgroup: str
    limit_bytes: int
    limit_hits: int
    refaults: int
    major_faults: int
    stall_seconds: float


@record(diagnosis_pb2.StepSplit)
class StepSplit:
    """Where a step's time went on this rank (medians over the trace's steps).

    ``parts`` are facts, not shares that add up: GPU work overlaps the CPU's.
    """

    steps: int = 0
    step_seconds: float = 0.0
    parts: tuple[CauseTime, ...] = ()


@record(diagnosis_pb2.RankEvidence)
class RankEvidence:
    """What one rank's trace file shows, read on its own node (no trace file travels).

    Attributes:
        path, host, pid, rank, world_size: whose it is (rank -1: not distributed).
        base_ns: the file's ``baseTimeNanoseconds`` (file ``ts`` = (unix ns - base) / 1000).
        window_start_unix_ns, window_end_unix_ns: the trace's window (host wall clock).
        kernel_tracks: the kernel tracks in the file.
        collectives: its collectives, in order, with the run-up to each.
        local_addresses: its sockets' own addresses (so peers name ranks).
        loss_events: TCP loss events on its sockets inside the window (at most 1000).
        gpu_sm_clock_mhz: the mean SM clock of its GPUs in the window (0: no GPU track).
        steps: where a step's time went.
        notes: what limits the evidence (no kernel tracks, records lost...).
        fabric_devices: the RDMA ports and NICs of its fabric track.
        connections: its TCP connections' round-trip times in the window (net track).
        cpu_quotas: its cgroups with a CPU quota, throttling in the window (sched track).
        memory_cgroups: its memory cgroups with a limit, reclaim in the window (sched track).
        sched_incomplete: why its sched track misses off-CPU intervals ("": complete).
        collective_net_bytes: bytes its sockets sent and received while it was inside its
            collectives (the net track; 0 without it).
    """

    path: str
    host: str = ""
    pid: int = 0
    rank: int = -1
    world_size: int = 0
    base_ns: int = 0
    window_start_unix_ns: int = 0
    window_end_unix_ns: int = 0
    kernel_tracks: tuple[str, ...] = ()
    collectives: tuple[CollectiveEvidence, ...] = ()
    local_addresses: tuple[str, ...] = ()
    loss_events: tuple[LossEvent, ...] = ()
    gpu_sm_clock_mhz: float = 0.0
    steps: StepSplit = StepSplit()
    notes: tuple[str, ...] = ()
    fabric_devices: tuple[str, ...] = ()
    connections: tuple[ConnectionRtt, ...] = ()
    cpu_quotas: tuple[CpuQuota, ...] = ()
    memory_cgroups: tuple[MemoryCgroup, ...] = ()
    sched_incomplete: str = ""
    collective_net_bytes: int = 0


@record(diagnosis_pb2.RankTiming)
class RankTiming:
    """One rank in the comparison.

    Attributes:
        collectives: collectives matched with the other ranks.
        last: how many of them it reached last.
        held_seconds: the time the other ranks waited for it alone (from the arrival of the
            last of them to its own), over the collectives it reached last.
        lateness_seconds: its median arrival after the median rank (negative: earlier).
        collective_seconds: its time inside the matched collectives (a rank that waits for
            others spends more).
        step_seconds: its median step.
    """

    rank: int
    host: str
    pid: int
    path: str
    collectives: int = 0
    last: int = 0
    held_seconds: float = 0.0
    lateness_seconds: float = 0.0
    collective_seconds: float = 0.0
    step_seconds: float = 0.0


@record(diagnosis_pb2.Finding)
class Finding:
    """A rank that held the job back, and why.

    Attributes:
        rank, host, pid: which.
        kind: ``late`` (it reached collectives after the others), ``network`` (collectives
            were slowed by packet loss on its connections) or ``fabric`` (collectives were
            slowed while its RDMA ports or NICs counted congestion or errors).
        seconds: the job's time lost to it.
        share: that time over the compared time.
        causes: the causes the kernel saw, by the time each explains (most first).
        worst: the worst instances (timestamps to jump to).
        summary: one sentence.
    """

    rank: int
    host: str
    pid: int
    kind: str
    seconds: float
    share: float
    causes: tuple[CauseTime, ...] = ()
    worst: tuple[Instance, ...] = ()
    summary: str = ""


@record(diagnosis_pb2.Verdict)
class Verdict:
    """The ranks of a trace compared: who held the job back and why, or that none did.

    Attributes:
        headline: the answer in one line.
        stragglers: the ranks that held the job back (most first); empty when none did.
        within_noise: no rank stands out.
        ranks: every rank's timing.
        compared_seconds: the time the comparison covers (matched collectives' span).
        matched: collectives matched across the ranks.
        notes: what limits the comparison (a rank without evidence, unaligned clocks...).
        job_time: where the job's time went, when no rank held it back (the parts of a
            step, and what the collectives achieved for their bytes); "" otherwise.
    """

    headline: str
    stragglers: tuple[Finding, ...] = ()
    within_noise: bool = True
    ranks: tuple[RankTiming, ...] = ()
    compared_seconds: float = 0.0
    matched: int = 0
    notes: tuple[str, ...] = ()
    job_time: str = ""


__all__ = [
    "CAUSES",
    "OFFCPU_CAUSE",
    "READ_CPU",
    "STEP_PARTS",
    "CauseTime",
    "CollectiveEvidence",
    "Finding",
    "Instance",
    "LossEvent",
    "MemoryCgroup",
    "RankEvidence",
    "RankTiming",
    "StepSplit",
    "Verdict",
]
