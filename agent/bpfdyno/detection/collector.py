"""The detection as a collector: every interval (5 s by default) the ranks' signals are read,
the detector and the hang watch decide, events go to the event log (and from there to the
log, watchers and `bpfdyno events`), and the signals and states become metrics.

A collector, so it runs on its own thread (reading a new rank's environment can wait on its
memory map lock), its cost is measured like every other part's, and `bpfdyno status` shows it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.core.status import PartState
from bpfdyno.detection import metrics as m
from bpfdyno.detection.detector import DetectorSettings, StragglerDetector
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.hang import HangSettings, HangWatch
from bpfdyno.detection.irq_signal import InterruptTimes
from bpfdyno.detection.nccl_times import LateArrivals
from bpfdyno.detection.net_signal import ConnectionSource
from bpfdyno.detection.outliers import Hysteresis, State
from bpfdyno.detection.signals import (
    CollectiveSource,
    PeerWaitSource,
    RankProcess,
    RankSignals,
    SignalSampler,
    to_record,
)
from bpfdyno.rpc.detection import DetectionKind, RankSignal
from bpfdyno.sources.base import Collector


@dataclass(frozen=True, slots=True)
class DetectionSettings:
    detector: DetectorSettings = field(default_factory=DetectorSettings)
    hang: HangSettings = field(default_factory=HangSettings)

    @classmethod
    def of(
        cls,
        k: float,
        window: int,
        suspect_at: int,
        confirm_at: int,
        clear_at: int,
        hang_after_s: float,
    ) -> DetectionSettings:
        return cls(
            DetectorSettings(k, Hysteresis(window, suspect_at, confirm_at, clear_at)),
            HangSettings(after_s=hang_after_s),
        )


class DetectionCollector(Collector):
    """Args:
    ranks: the processes to watch (the registered trainers), asked every interval.
    events: where events go.
    host: this node's name, in every event.
    peers: the same jobs' ranks on other nodes, pulled from their agents (`rank_signals`
        is what this node gives them).
    peer_waits: gloo ranks' waits for their peers' data (`bpfdyno.sources.gloo`).
    connections: the net collector's last reading of the ranks' TCP connections, for the
        network scores (`bpfdyno.detection.net_signal`).
    interrupts: the interrupt collector's per-CPU books, for the ranks' interrupt share
        (`bpfdyno.detection.irq_signal`).
    """

    name = "detection"
    may_block = True
    #: The net collector's parts whose data the network scores read (`net_signal`): the
    #: budget does not detach them while a job is watched (`watching`).
    NET_INPUTS = ("rtt", "tcp_events", "connections")

    def __init__(
        self,
        ranks: Callable[[], Iterable[RankProcess]],
        events: EventLog,
        host: str,
        settings: DetectionSettings | None = None,
        proc_root: Path = Path("/proc"),
        collectives: CollectiveSource | None = None,
        peers: Callable[[], Iterable[RankSignals]] | None = None,
        peer_waits: PeerWaitSource | None = None,
        connections: ConnectionSource | None = None,
        interrupts: InterruptTimes | None = None,
    ) -> None:
        settings = settings or DetectionSettings()
        self._ranks = ranks
        self._peers = peers
        self._host = host
        #: The last round's signals, with when it ended (read by other threads: swapped whole).
        self._latest: tuple[float, list[RankSignals]] = (0.0, [])
        self.events = events
        self._peer_waits = peer_waits
        self.sampler = SignalSampler(proc_root, collectives, peer_waits, connections, interrupts)
        self.late_arrivals = LateArrivals()
        self.detector = StragglerDetector(host, settings.detector)
        self.hangs = HangWatch(host, settings.hang, proc_root)

    def collect(self) -> Sequence[Sample]:
        now_mono, now_unix = time.monotonic(), time.time()
        signals = self.sampler.sample(self._ranks(), now_mono)
        peers = list(self._peers()) if self._peers is not None else []
        # NCCL ranks' late arrival, counted over the job's ranks on every node.
        signals, peers = self.late_arrivals.apply(signals, peers)
        self._latest = (now_unix, signals)
        events = self.detector.update(signals, now_unix, peers)
        events += self.hangs.update(signals, now_mono, now_unix)
        self.events.add(events)
        out = []
        jobs = set()
        for s in signals:
            labels = {"job_id": s.job_id, "rank": str(s.rank)}
            state = self.detector.state_of(s.job_id, s.rank).state
            jobs.add(s.job_id)
            net = self.detector.net_scores_of(s.job_id, s.rank)
            out += [
                sample(m.RANK_CPU_WAIT, s.cpu_wait_share, labels),
                sample(m.RANK_NET_RTT, net.rtt_s, labels),
                sample(m.RANK_NET_RETRANSMITS, net.retransmits_per_s, labels),
                sample(m.RANK_IO, s.io_bytes / s.interval_s, labels),
                sample(m.SUSPECTED, float(state is not State.OK), labels),
                sample(m.CONFIRMED, float(state is State.CONFIRMED), labels),
            ]
            if not math.isnan(s.peer_wait_s):
                out.append(sample(m.RANK_PEER_WAIT, s.peer_wait_share, labels))
            if not math.isnan(s.interrupt_s):
                out.append(sample(m.RANK_INTERRUPT, s.interrupt_share, labels))
        counts = self.events.counts()  # the automatic trace adds "traced" events too
        hung = self.hangs.hung_jobs()
        out += [sample(m.HANG, float(job in hung), {"job_id": job}) for job in sorted(jobs)]
        out += [
            sample(m.EVENTS, float(counts.get(k.value, 0)), {"kind": k.value})
            for k in DetectionKind
            if k is not DetectionKind.UNSPECIFIED
        ]
        return out

    def health(self) -> tuple[PartState, str] | None:
        """Degraded while gloo's peer waits cannot be timed, the ranks' connections or
        their CPUs' interrupt time are not known, or that time is an estimate (the rest goes
        on)."""
        reasons = []
        if self._peer_waits is not None and self._peer_waits.error:
            reasons.append(f"gloo peer waits unavailable: {self._peer_waits.error}")
        links = self.sampler.links
        if links is not None and links.error:
            reasons.append(f"network scores unavailable: {links.error}")
        interrupts = self.sampler.interrupts
        if interrupts is not None and interrupts.error:
            reasons.append(f"interrupt share unavailable: {interrupts.error}")
        elif interrupts is not None and interrupts.estimated:
            reasons.append(f"interrupt share estimated {interrupts.estimated}")
        return (PartState.DEGRADED, "; ".join(reasons)) if reasons else None

    def close(self) -> None:
        """Detach gloo's probes."""
        if self._peer_waits is not None:
            self._peer_waits.close()

    def watching(self) -> str:
        """What the detection watches now, in words ("" when no rank): "detection watching
        job 1818 (4 ranks)"."""
        _, signals = self._latest
        if not signals:
            return ""
        jobs = sorted({s.job_id for s in signals})
        ranks = f"{len(signals)} rank{'s' if len(signals) != 1 else ''}"
        return f"detection watching job{'s' if len(jobs) > 1 else ''} {', '.join(jobs)} ({ranks})"

    def rank_signals(self, job_id: str = "") -> list[RankSignal]:
        """The last round's signals of this node's ranks (of one job), for its peers."""
        end_unix, signals = self._latest
        return [
            to_record(s, self._host, end_unix) for s in signals if not job_id or s.job_id == job_id
        ]
