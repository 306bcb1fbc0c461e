"""The Detection service's records (``detection.proto``): events about straggling and hung
ranks that the agent found by itself (docs/detection.md)."""

from __future__ import annotations

import enum

from bpfdyno.rpc.diagnosis import Verdict
from bpfdyno.rpc.v1 import detection_pb2 as pb
from bpfdyno.rpc.wire import record


class DetectionKind(enum.Enum):
    UNSPECIFIED = "unspecified"
    SUSPECTED = "suspected"
    CONFIRMED = "confirmed"
    CLEARED = "cleared"
    HANG = "hang"
    TRACED = "traced"  # the automatic trace a confirmation started ended: its verdict


class HangState(enum.Enum):
    """What the rank that holds a hung job is doing."""

    STOPPED = "stopped"  # a stop signal (SIGSTOP, a debugger): state T or t
    BLOCKED_READ = "blocked_read"  # asleep in a read on a pipe, FIFO, file or terminal
    SPINNING = "spinning"  # running: on a CPU, making no progress others can see
    WAITING = "waiting"  # waiting like its peers: no rank stands out


@record(pb.SignalEvidence)
class SignalEvidence:
    name: str
    value: float
    job_median: float


@record(pb.ThreadReport)
class ThreadReport:
    tid: int
    comm: str = ""
    state: str = ""
    syscall: str = ""
    wchan: str = ""
    waiting_on: str = ""
    offcpu_seconds: float = 0.0
    oncpu_share: float = 0.0


@record(pb.DetectionEvent)
class DetectionEvent:
    """One event: a rank suspected, confirmed or cleared as a straggler, or a hang.

    Attributes:
        host: the agent's host name (the node that saw it).
        unix_seconds: when the agent decided, wall clock.
        summary: one line that says what was seen, for logs and ``bpfdyno events``.
        evidence: the signals of the interval that decided, each beside the job's median.
        hang_state, threads: hangs only (`HangState` words; "" otherwise).
        trace_id, trace_files, verdict_text, verdict: ``traced`` only: the automatic trace,
            the files it wrote, and its verdict as ``gputrace`` prints it and in full (None
            when no file was written: the summary says why).
    """

    kind: DetectionKind
    job_id: str
    rank: int
    pid: int
    host: str
    unix_seconds: float
    summary: str = ""
    evidence: tuple[SignalEvidence, ...] = ()
    hang_state: str = ""
    threads: tuple[ThreadReport, ...] = ()
    trace_id: str = ""
    trace_files: tuple[str, ...] = ()
    verdict_text: str = ""
    verdict: Verdict | None = None


@record(pb.WatchEventsRequest, zero_is_default=True)
class WatchEventsRequest:
    job_id: str = ""


@record(pb.ListEventsRequest, zero_is_default=True)
class ListEventsRequest:
    job_id: str = ""


@record(pb.ListEventsResponse)
class ListEventsResponse:
    events: tuple[DetectionEvent, ...] = ()


@record(pb.NetLink)
class NetLink:
    """One TCP connection of a rank over one interval (``srtt_seconds`` None: never sampled;
    ``retransmits_unknown``: not every retransmit of the interval was counted, so
    ``retransmits`` is a lower bound; ``sent_bytes``: the part of ``moved_bytes`` it sent,
    None from an agent that predates it)."""

    local_address: str
    remote_address: str
    srtt_seconds: float | None = None
    retransmits: int = 0
    moved_bytes: int = 0
    seconds: float = 0.0
    retransmits_unknown: bool = False
    sent_bytes: int | None = None


@record(pb.CommArrivals)
class CommArrivals:
    """One rank's arrivals at one communicator's collectives, as packed deltas (unix ns on
    the sending agent's clock): the i-th sequence number and arrival are the sums of the
    first i + 1 deltas."""

    comm_hash: int
    comm_ranks: int = 0
    seq_deltas: tuple[int, ...] = ()
    arrival_deltas: tuple[int, ...] = ()


@record(pb.RankSignal)
class RankSignal:
    """What one rank did in one interval, as a job's agents exchange it (times in seconds;
    collective times None when unknown)."""

    job_id: str
    rank: int
    pid: int
    host: str
    end_unix_seconds: float
    interval_seconds: float
    oncpu_seconds: float = 0.0
    runq_wait_seconds: float = 0.0
    main_waiting_seconds: float = 0.0
    throttled_seconds: float = 0.0
    io_bytes: int = 0
    in_collective_seconds: float | None = None
    late_seconds: float | None = None
    peer_wait_seconds: float | None = None
    net_links: tuple[NetLink, ...] = ()
    net_links_known: bool = False  # False: no net data, network scores NaN
    arrivals: tuple[CommArrivals, ...] = ()  # NCCL ranks: collectives of the interval
    arrivals_known: bool = False  # False: no NCCL profiler plugin in the rank
    # Interrupt time of the CPUs it ran on, weighted by where (None: not known).
    interrupt_seconds: float | None = None
    interrupt_cpu: int | None = None  # the CPU it ran on most (None: not known)


@record(pb.GetRankSignalsRequest, zero_is_default=True)
class GetRankSignalsRequest:
    job_id: str = ""


@record(pb.GetRankSignalsResponse)
class GetRankSignalsResponse:
    signals: tuple[RankSignal, ...] = ()
