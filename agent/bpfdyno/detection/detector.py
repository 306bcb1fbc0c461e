"""The straggler detector: each interval's rank signals in, events out.

For every job, each score of `SCORES` is compared across the job's ranks (`outliers`); a rank
that stands out in any score had an outlier interval, and `step` (the hysteresis) decides
whether that makes an event. Ranks are keyed by (job, rank): a rank restarted under a new pid
keeps its history. A rank that stops reporting (its process exited) is forgotten.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from bpfdyno.detection.net_signal import LinkScores, link_scores
from bpfdyno.detection.outliers import Hysteresis, RankState, Transition, outliers, step
from bpfdyno.detection.signals import RankSignals
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind, SignalEvidence


@dataclass(frozen=True, slots=True)
class Score:
    """One way a rank can stand out: its value per interval, and the least excess over the
    job's median that counts (below it a difference is jitter, however many MADs)."""

    name: str
    value: Callable[[RankSignals], float]
    floor: float
    relative: float  # ... and the least excess as a multiple of the median
    says: str  # how the summary words it
    below: bool = False  # the straggler is the rank with the *least* (see `outliers`)


#: The least excess RTT (ms) of a rank's best link over the job's median that counts.
RTT_FLOOR_MS = 4.0
#: The least excess of retransmits per second on a rank's best link that counts.
RETX_FLOOR_PER_S = 4.0

#: A rank its machine holds back: its threads wanted a CPU (run queue, CPU quota). On the
#: real 4-rank job healthy ranks' waits were 0.06-0.3 thread-seconds per second (twice the
#: median seen in one interval, jitter), a rank sharing its CPU with a hog 1.0-1.2 against
#: a median of 0.1: at least 2.5 times the median counts.
CPU_WAIT = Score("cpu_wait_share", lambda s: s.cpu_wait_share, 0.05, 1.5, "waited for a CPU")
#: A gloo rank its peers wait for, whatever held it back (its input, its disk, its CPU): in a
#: synchronous job the ranks on time wait in the collective for the late one, which hardly
#: waits at all, so the straggler is the rank that waits *least*. On the real 4-rank job
#: under load (docs/detection.md) healthy ranks waited 0.13-0.42 thread-seconds per second,
#: the least of them down to 0.68 of the median and at most 0.07 under it; a rank whose
#: batches, DataLoader item or disk reads came late 0.01-0.27 against medians of 0.33-0.81.
#: So: at least 0.1 under the median and under half of it. (Under a heavier load a healthy
#: rank went under both in 8 of 132 intervals; k kept it out.)
PEER_WAIT = Score(
    "peer_wait_share",
    lambda s: s.peer_wait_share,
    0.1,
    0.5,
    "its peers waited for it in gloo's collectives; it waited for them",
    below=True,
)

#: A rank its peers waited for at collectives (NCCL's profiler, when plugged in).
LATE_SHARE = Score(
    "late_share", lambda s: s.late_s / s.interval_s, 0.05, 1.0, "arrived late at collectives"
)

SCORES: tuple[Score, ...] = (
    CPU_WAIT,
    # A rank that computes while its peers wait (more work per step, interrupts taking its
    # CPU time): its main thread busy, theirs asleep in the collective. Ranks of the real
    # 4-rank job (docs/detection.md): healthy 0.02-0.08, all alike at 0.2-0.27 in busy
    # stretches; a rank computing 40 ms more per step 0.80-0.87 against a median of 0.04-0.11
    # (its CPU wait, 1.3 against 0.5, hid behind another rank's).
    Score(
        "main_busy_share",
        lambda s: s.main_busy_share,
        0.1,
        1.5,
        "its main thread was busy (on a CPU or waiting for one)",
    ),
    LATE_SHARE,
    PEER_WAIT,
    # A rank whose every link to its peers is slow (latency added on its link, a bandwidth cap
    # queueing what it sends): its best active link's RTT (`net_signal`). On the real 4-rank
    # job a 5 ms delay put the faulted rank 5.6-8.7 ms over the median; ranks not faulted
    # went 3.3-4.6 ms over it in 3 of 71 intervals (single intervals: the hysteresis).
    Score(
        "net_rtt_ms",
        lambda s: s.net.rtt_s * 1000,
        RTT_FLOOR_MS,
        1.0,
        "every link to its peers was slow (TCP RTT, ms)",
    ),
    # A rank whose every link to its peers loses packets (at its receiver or on its wire):
    # its best active link's retransmits per second, both ends'. Healthy links on the loaded
    # machine reached 3.6/s over the median (spurious tail-loss probes); 5 % loss gave
    # 5.8-11.2/s over it.
    Score(
        "net_retransmits",
        lambda s: s.net.retransmits_per_s,
        RETX_FLOOR_PER_S,
        1.0,
        "every link to its peers lost packets (TCP retransmits per second)",
    ),
)


#: Pairs of a cause and its effect, each at a lower bar than its score's own, that make a rank
#: an outlier when it stands out in both in one interval: a rank held back a little less than
#: either score asks alone, seen from both sides. A CPU hog at nice -10 on the real job's rank
#: 2 slowed the job to 0.74 of its healthy steps per second; the rank waited for a CPU 2.0-2.4
#: times the median (2.5 asked) and its peers waited for it, it for them 0.5-0.58 of the
#: median (under 0.5 asked): found in neither score in 8 of 9 intervals. At least twice the
#: median's CPU wait and under 0.6 of its peer wait, both: 5 of 9. Healthy ranks of the same
#: runs came to at most 1.58 times the median's CPU wait (rank 1, on the shared CPU, whose
#: peer wait was then 0.35 of the median: the cause's bar is what keeps it out).
#: A rank whose CPUs an interrupt storm holds (`irq_signal`): the share of the time of the CPUs
#: it ran on that went to interrupts, at least 0.1 over the job's median and twice it. It never
#: makes a straggler alone (not in `SCORES`): a storm the rank absorbs, or one that slows every
#: rank alike, holds nobody back. It makes one with an effect seen from the job's side, at the
#: same lowered bars as the CPU wait's: its peers waited for it (gloo), or it arrived late
#: (NCCL; that bar is not measured on a real NCCL job here).
IRQ_SHARE = Score(
    "interrupt_share",
    lambda s: s.interrupt_share,
    0.1,
    1.0,
    "the CPUs it ran on were taken by interrupts (share of their time)",
)

CORROBORATED: tuple[tuple[Score, Score], ...] = (
    (replace(CPU_WAIT, relative=1.0), replace(PEER_WAIT, relative=0.4)),
    (IRQ_SHARE, replace(PEER_WAIT, relative=0.4)),
    (IRQ_SHARE, replace(LATE_SHARE, floor=0.03, relative=0.5)),
)
#: Causes that never make an outlier alone but are named in the evidence of a rank that
#: stands out otherwise, when it stands out in them too.
EVIDENCE_ONLY: tuple[Score, ...] = (IRQ_SHARE,)


@dataclass(frozen=True, slots=True)
class DetectorSettings:
    k: float = 3.0  # robust standard deviations above the median that make an outlier
    hysteresis: Hysteresis = field(default_factory=Hysteresis)


def with_net_scores(ranks: dict[int, RankSignals]) -> dict[int, RankSignals]:
    """The job's ranks with their network scores, from all their links joined."""
    net = link_scores({r: s.net_links for r, s in ranks.items()})
    return {r: replace(s, net=net[r]) for r, s in ranks.items()}


class StragglerDetector:
    """Keeps each rank's hysteresis state; `update` turns one interval into events."""

    def __init__(self, host: str, settings: DetectorSettings | None = None) -> None:
        self.host = host
        self.settings = settings or DetectorSettings()
        self._states: dict[tuple[str, int], RankState] = {}
        #: Each rank's network scores in the last interval (for its metrics).
        self._net: dict[tuple[str, int], LinkScores] = {}

    def state_of(self, job_id: str, rank: int) -> RankState:
        return self._states.get((job_id, rank), RankState())

    def net_scores_of(self, job_id: str, rank: int) -> LinkScores:
        """The rank's network scores in the last interval (NaN: not known)."""
        return self._net.get((job_id, rank), LinkScores())

    def update(
        self,
        signals: Iterable[RankSignals],
        now_unix: float,
        peers: Iterable[RankSignals] = (),
    ) -> list[DetectionEvent]:
        """The events of one interval: this node's ranks' signals, compared with each other
        and with ``peers``' (the same jobs' ranks on other nodes, pulled from their agents;
        their events are their own agents' to emit)."""
        jobs: dict[str, dict[int, RankSignals]] = {}
        for s in signals:
            jobs.setdefault(s.job_id, {})[s.rank] = s
        remote: dict[str, dict[int, RankSignals]] = {}
        for s in peers:
            if s.job_id in jobs and s.rank not in jobs[s.job_id]:
                remote.setdefault(s.job_id, {})[s.rank] = s
        events: list[DetectionEvent] = []
        states: dict[tuple[str, int], RankState] = {}
        self._net = {}
        for job_id, ranks in sorted(jobs.items()):
            # The network scores are the job's: all its ranks' links joined.
            scored = with_net_scores({**remote.get(job_id, {}), **ranks})
            self._net.update({(job_id, r): s.net for r, s in scored.items() if r in ranks})
            evidence = self._evidence(scored)
            for rank, s in sorted(ranks.items()):
                key = (job_id, rank)
                new, transition = step(
                    self._states.get(key, RankState()), rank in evidence, self.settings.hysteresis
                )
                states[key] = new
                if transition is not None:
                    events.append(self._event(transition, s, evidence.get(rank, ()), now_unix))
        self._states = states
        return events

    def _evidence(self, ranks: dict[int, RankSignals]) -> dict[int, tuple[SignalEvidence, ...]]:
        """Per outlier rank, the scores it stood out in, each beside the job's median."""
        found: dict[int, list[SignalEvidence]] = {}
        for score in SCORES:
            values, flagged = self._flagged(score, ranks)
            for rank in flagged:
                found.setdefault(rank, []).append(_beside_median(score, values, rank))
        for cause, effect in CORROBORATED:
            cause_values, by_cause = self._flagged(cause, ranks)
            effect_values, by_effect = self._flagged(effect, ranks)
            for rank in (by_cause & by_effect) - found.keys():
                found[rank] = [
                    _beside_median(cause, cause_values, rank),
                    _beside_median(effect, effect_values, rank),
                ]
        for cause in EVIDENCE_ONLY:
            cause_values, by_cause = self._flagged(cause, ranks)
            for rank in by_cause & found.keys():
                if all(e.name != cause.name for e in found[rank]):
                    found[rank].append(_beside_median(cause, cause_values, rank))
        return {r: tuple(e) for r, e in found.items()}

    def _flagged(
        self, score: Score, ranks: dict[int, RankSignals]
    ) -> tuple[dict[int, float], set[int]]:
        """The ranks' values of ``score`` (NaN left out) and the ranks that stand out in it."""
        values = {r: score.value(s) for r, s in ranks.items()}
        values = {r: v for r, v in values.items() if not math.isnan(v)}
        flagged = outliers(values, self.settings.k, score.floor, score.relative, below=score.below)
        return values, flagged

    def _event(
        self,
        transition: Transition,
        s: RankSignals,
        evidence: tuple[SignalEvidence, ...],
        now_unix: float,
    ) -> DetectionEvent:
        kind = DetectionKind[transition.name]
        if transition is Transition.CLEARED:
            summary = f"job {s.job_id} rank {s.rank} no longer stands out"
        else:
            says = {sc.name: sc.says for sc in (*SCORES, *EVIDENCE_ONLY)}
            what = "; ".join(
                f"{says[e.name]}: {e.value:.2f} against the job's median {e.job_median:.2f}"
                f" ({e.name})"
                for e in evidence
            )
            summary = f"job {s.job_id} rank {s.rank} {kind.value} straggler: {what}"
        return DetectionEvent(
            kind=kind,
            job_id=s.job_id,
            rank=s.rank,
            pid=s.pid,
            host=self.host,
            unix_seconds=now_unix,
            summary=summary,
            evidence=evidence,
        )


def _beside_median(score: Score, values: dict[int, float], rank: int) -> SignalEvidence:
    return SignalEvidence(score.name, values[rank], statistics.median(values.values()))
