"""The ranks of a job compared: which rank holds the job back, and why — `compare`.

Input: each rank's `RankEvidence` (read on its own node) and, for ranks on other hosts, the
offset of each host's clock (measured by the fan-out, `bpfdyno.client.cluster.clock`).
Pure computation: the agent uses it for the ranks of one node (``GetTraceSummary``), the
clients for a whole job; both decide the same way.

1. **Match** the collectives across ranks by what identifies them (`_match`,
   `_alignment`): NCCL's sequence number where both ranks' files have it (NCCL's
   profiler plugin's rows); else, as a collective completes on every rank at nearly the
   same moment, each collective votes for the other rank's collective of the same operation
   and size that completed nearest to it on the common clock; the offset in order most
   votes agree on pairs two ranks' groups, however far apart their windows began. What
   completed with none of the reference's collectives is not compared (a note says so);
   windows that share too little are not compared at all ("too little overlap: X of Y").
2. **Arrival**: per matched collective, each rank's arrival against the median of the
   others'. A rank that arrives after them made them wait that long. Over the collectives
   (the union of those waits, so no moment counts twice and no share exceeds 100 %), it is
   the time the job lost to that rank — except what it inherited from a collective slowed
   by packet loss: a rank whose previous collective ended after the others' because its
   packets were lost on the way is late for the network's sake, and that part is the
   network's (5).
3. **Straggler**: a rank the others waited for at least `MIN_SHARE` of the compared time, in
   at least `MIN_LATE_FRACTION` of the collectives (consistently, not by jitter) — or at
   least `EVIDENCED_MIN_SHARE` of it when most of its lost time is its CPU quota's throttling or
   waits for a CPU held outside the job (`_evidenced`), or `OWN_HOLDER_MIN_SHARE` when one
   task outside the job held its CPU, and not the others', run-up after run-up (a weak hog:
   `_own_holder`). With a network finding, the share is
   of the compared time less the time inside the collectives the network slowed
   (`_own_span`): two faults, two ranks. Otherwise the ranks are within noise.
4. **Why**: in each collective a straggler reached late, what its threads spent, by cause,
   in the run-up (from its previous arrival), beyond the median of the other ranks' same
   run-up: that excess is the time the cause explains. Causes are ranked by it; who held
   the CPU and the system calls are named; the worst instances come with their timestamps.
   What no cause explains is said as such.
5. **Network**: packet loss slows the collectives themselves rather than one rank's arrival
   (everyone waits inside them). The time from the last arrival to the last completion is
   compared with that of the collectives without loss; the excess in collectives with TCP
   retransmits, resets or drops is the time lost to the network, and the rank whose
   connections carry the loss (its address on both ends of the lost packets' sockets) is
   named. A retransmit whose copy the peer dropped as data it already had lost nothing (the
   original arrived, its acknowledgement was late: a busy receiver does that), and neither
   did that drop: both are left out, as are retransmits to a rank not tracing then (its
   file would tell). When the two ends of the lossy connections tie (one
   connection, or one link), the end that retransmitted is named: its packets were the ones
   lost on the way (one-way loss on the wire shows only as the sender's retransmits). The
   rules over the collectives themselves are `COLLECTIVE_RULES`; a late rank's cause
   details, `CAUSE_DETAILS`.
6. **Slow links** (`_latency_finding`): the net track samples each TCP connection's
   smoothed round-trip time. A delay on one rank's link (its packets or its acknowledgements
   held on the way) shows on both ends of every connection of that rank, and on no other;
   a rank starved of CPU acknowledges late, so its peers see it slow while its own round
   trips stay fast. So each connection between two ranks counts its faster end, and it is
   slow when that is `SLOW_RTT_FACTOR` times the job's lower quartile and at least
   `SLOW_RTT_MS`; with a slow connection measured from both ends, or `MIN_SLOW_CONNECTIONS`,
   the rank on (nearly) every slow connection is named, or the link between two ranks when
   only theirs is slow; when no rank is on nearly all of them, the slow connections
   `SLOW_RTT_FACTOR` times slower than the rest of the slow ones are taken alone (a second
   fault, a CPU hog, slows its rank's connections a little beside a delayed link). The
   time lost is the collectives' own time (last arrival to last completion, each moment
   once) times the share of their round trips the slowness added (1 - typical / slow). A
   rank that left a collective late because of it is late for the link's sake (as with
   loss, 2). A rank starved of CPU can slow both ends of its links (its softirqs wait for
   the CPU too): when an end's longest waits for a CPU are as long as the round trips, they
   are its waits, not the network's (`_cpu_starved_end`, said in a note).
7. **CPU quota**: a late rank whose cgroup was throttled by its CPU quota in the window
   (the sched track reads the cgroup's counters) is named "throttled by its CPU quota"
   with the cgroup's periods and throttled time: its excess waits for a CPU are the quota's
   (all of them when most periods were throttled, else up to the throttled time), and no
   task that ran meanwhile is named for them.
8. **The job's time**: when no rank stands out, where a step's time went and what the
   collectives achieved for their bytes (`_job_time`).
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bpfdyno.rpc.diagnosis import (
    CAUSES,
    READ_CPU,
    STEP_PARTS,
    CauseTime,
    CollectiveEvidence,
    CpuQuota,
    Finding,
    Instance,
    LossEvent,
    MemoryCgroup,
    RankEvidence,
    RankTiming,
    Verdict,
)

#: A rank is a straggler when the others waited for it this share of the compared time...
#: Measured on a real 4-rank gloo job (tests/tracing/test_straggler_verdict.py, docs/tracing.md)
#: on a loaded 2-CPU machine, three ranks sharing a CPU: healthy ranks late in 60 % of the
#: collectives or more kept the others waiting up to 5.6 % of the time; a rank held back by
#: a CPU hog, a slow read or packet loss 23 % or more.
MIN_SHARE = 0.10
#: ... and it arrived after the median of the others in at least this share of collectives.
MIN_LATE_FRACTION = 0.6
#: A rank held back by a CPU hog at nice -10 or a quota of 10 ms per 100 ms on the same job
#: kept the others waiting 2-8 % of the time: under `MIN_SHARE`, but with the kernel's word
#: for why (`_evidenced`). Per cause, the share from which it is named when that cause
#: explains at least `EVIDENCED_EXPLAINED` of its lost time: a throttled quota is evidence
#: no healthy rank has (the cgroup's counters); waits for a CPU held outside the job are
#: what a healthy rank on a loaded machine has too, in small amounts (up to 5.6 % seen);
#: uninterruptible disk waits beyond the other ranks' are not (none in 71 healthy runs of
#: the matrix) and are named from the same share: a 1 MiB read a step from a disk throttled
#: to 20 MB/s held the job back 7-14 % of the time (last to 46-57 of 60 collectives on a
#: CPU shared with other ranks, 28-33 alone on one). Interrupts are named from the quota's
#: share when the rank's CPUs spent at least `JOB_PART_MIN` of its step in them (`_stormed`):
#: a storm on the CPU two ranks share held the job back 5-8 % of the time, every step, and
#: the CPUs of the same job without the storm spent 1.3 % of a step in interrupts.
EVIDENCED_MIN_SHARE = {
    "cpu_quota": 0.02,
    "interrupts": 0.02,
    "cpu_wait": 0.06,
    "disk": 0.06,
    "memory": 0.06,
}
EVIDENCED_EXPLAINED = 0.6
#: Waits for a CPU held by one task outside the job that holds this rank's CPU and not the
#: others' (`_own_holder`) are evidence healthy jitter does not have: a weak hog (nice -10)
#: pinned to a rank's CPU held the job back 3.5-8 % of the time, in nearly every late
#: run-up; a healthy rank's waits on a loaded machine are spread over many tasks, which
#: hold the other ranks' CPUs too. From this share it is named...
OWN_HOLDER_MIN_SHARE = 0.02
#: ... when that task held its CPU in at least this share of its late run-ups (at least
#: `OWN_HOLDER_MIN_RUNUPS` of them) ...
OWN_HOLDER_PRESENCE = 0.8
OWN_HOLDER_MIN_RUNUPS = 5
#: ... for at least this share of its waits for a CPU in them, and for at least this many
#: times what it held the median other rank's CPU in the same run-ups.
OWN_HOLDER_OF_WAITS = 0.5
OWN_HOLDER_FACTOR = 4.0
#: A rank late in fewer than `MIN_LATE_FRACTION` of the collectives but at least this share
#: is named when it kept the others waiting `MIN_SHARE` and most of that time
#: (`EVIDENCED_EXPLAINED`) was one of `INTERMITTENT_CAUSES`: waits no healthy rank has for
#: long, that come in some steps only. A disk throttled for the rank (cgroup ``io.max``)
#: lets a read that follows an idle gap through at once up to its slice's allowance and
#: holds the next back (1 MiB reads at 20 MB/s took 3-114 ms on the test VM): a ~45 ms step
#: that reads for 50 ms catches up in between (the rank held the job back 15-24 % of the
#: time, late in too few collectives to pass). Jitter — waits for a CPU, a few long stalls
#: (late in under 20 %) — stays under the consistency rule. A CPU quota's throttling comes
#: in some steps too (a 100 ms period against a ~80 ms step runs out in some steps, not in
#: others: at 5 ms per 100 ms a rank alone on its CPU was throttled in 44 of 47 periods,
#: held the job back 21 % of the time and was late to 28 of 60 collectives), and no healthy
#: rank has it (the cgroup's own counters).
INTERMITTENT_CAUSES = frozenset({"disk", "memory", "cpu_quota"})
MIN_INTERMITTENT_FRACTION = 0.2
#: Lost time below this is noise, whatever the share.
MIN_SECONDS = 0.002
#: Two ranks' collectives that completed further apart than this (seconds, on the common
#: clock) are not taken for one collective.
MAX_APART = 0.5
#: Collectives that must vouch for an alignment of two ranks' groups (`_alignment`).
MIN_VOTES = 2
#: The ranks' windows must overlap by at least this share of the shortest, and at least
#: `MIN_MATCHED` collectives must be paired, for the ranks to be compared.
MIN_OVERLAP = 0.25
MIN_MATCHED = 3
#: A cause is listed when it explains at least this share of a straggler's lost time.
MIN_CAUSE_SHARE = 0.05
#: The job's time (no straggler): the parts of a step said, the largest first, down to this
#: share of the step.
JOB_PARTS = 4
JOB_PART_MIN = 0.05
#: Tasks named as holding the ranks' CPUs in the job's time.
JOB_HOLDERS = 3
#: Worst instances listed per finding.
TOP_INSTANCES = 5
#: A finding's kind, as the verdict's text says it.
KIND_WORDS = {
    "late": "late to collectives",
    "network": "network loss",
    "latency": "slow network links",
    "fabric": "fabric",
}
#: The loss events, as a finding says them (one; "s" is added for several).
LOSS_WORDS = {
    "tcp_retransmit": "TCP retransmit",
    "tcp_reset_sent": "TCP reset sent",
    "tcp_reset_received": "TCP reset received",
    "packet_drop": "packet drop",
}
#: Ratio of a straggler's SM clock to the others' below which it is said to run slower.
SLOW_CLOCK = 0.95
#: A peer's drop of data it already had pairs with a retransmit on the same connection at
#: most this long before it (seconds; clocks of other hosts may be off by `CLOCK_SLACK`).
SPURIOUS_WINDOW = 1.0
CLOCK_SLACK = 0.01
#: A TCP connection is slow when its median smoothed round trip is at least this many times
#: the lower quartile of the job's connections...
SLOW_RTT_FACTOR = 4.0
#: ... and at least this long (ms): below it, round trips cost a collective little (healthy
#: ranks sharing a loaded 2-CPU machine were seen at up to 0.3 ms, an idle store connection
#: whose last sample dated from the job's start at 1.9 ms).
SLOW_RTT_MS = 2.0
#: Slow connections needed when none was measured slow from both its ends.
MIN_SLOW_CONNECTIONS = 2
#: A cgroup throttled in at least this share of its periods: every wait of its threads for a
#: CPU is the quota's.
QUOTA_MOSTLY = 0.5
#: The rank named for slow links is on at least this share of the slow connections.
SLOW_LINK_OWNER = 0.9
#: The kernel's per-CPU softirq threads, as a CPU holder is named (``ksoftirqd/1 (pid 22)``).
SOFTIRQ_THREAD = "ksoftirqd/"


@dataclass(slots=True)
class _Rank:
    ev: RankEvidence
    label: int  # the rank, or its position when the file has no rank
    offset_ns: int  # to the common clock, and from the comparison's origin (seconds are
    # kept small so that doubles hold them to the nanosecond)
    groups: list[list[CollectiveEvidence]] = field(default_factory=list)


@dataclass(slots=True)
class _Match:
    """One collective across the ranks: rank label -> its collective."""

    members: dict[int, CollectiveEvidence]
    arrivals: dict[int, float]  # seconds on the common clock
    ends: dict[int, float]
    group: int = 0
    #: Per rank: when its run-up to it began (its previous arrival, or its window's start).
    run_ups: dict[int, float] = field(default_factory=dict)
    #: Packets were lost while it ran (`_mark_lossy`).
    lossy: bool = False
    #: It ran over slow links (`_latency_finding`): lateness inherited from it is theirs.
    slow_link: bool = False
    #: Per rank: its lateness that is its own (set by `_lateness`).
    late: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Loss:
    """A loss event of a rank, on the common clock."""

    t: float
    rank: int
    event: LossEvent


@dataclass(frozen=True, slots=True)
class Comparison:
    """What a rule over the collectives sees (`COLLECTIVE_RULES`): the matched collectives,
    the ranks, the compared seconds, and every rank's loss events on the common clock (those
    that lost packets, and the retransmits that were not needed)."""

    matches: list[_Match]
    ranks: list[_Rank]
    span: float
    losses: list[_Loss]
    spurious: list[_Loss]
    #: Retransmits to a rank that was not tracing then: needed or not, nobody can tell.
    unseen: list[_Loss] = field(default_factory=list)
    #: The job's slow links (`_slow_links`, found once per comparison), or None.
    slow: _SlowLinks | None = None


def compare(ranks: Sequence[RankEvidence], offsets_ns: Mapping[str, int] | None = None) -> Verdict:
    """Compare the ranks of one trace (see the module doc).

    Args:
        ranks: each rank's evidence (one per traced process).
        offsets_ns: per host, ns to add to its clock to get the common clock (absent: 0).
    """
    offsets_ns = offsets_ns or {}
    rs = _ranks(ranks, offsets_ns)
    notes: list[str] = []
    for r in rs:
        notes += [f"{_name(r)}: {n}" for n in r.ev.notes]
    timings = {r.label: _timing(r) for r in rs}
    with_collectives = [r for r in rs if r.groups]
    if len(with_collectives) < 2:
        return Verdict(
            headline=_single_headline(rs),
            ranks=tuple(timings.values()),
            notes=tuple(notes),
        )
    apart = _apart(with_collectives)
    if apart:
        return Verdict(
            headline=f"not compared: {apart}",
            ranks=tuple(timings.values()),
            notes=tuple(notes),
        )
    if len({r.ev.host for r in rs}) > 1 and not all(r.ev.host in offsets_ns for r in rs):
        notes.append(
            "ranks on several hosts without measured clock offsets: arrivals compared as is"
        )
    matches, unpaired = _match(with_collectives)
    notes += unpaired
    overlap, shortest = _overlap(with_collectives)
    if overlap < MIN_OVERLAP * shortest or len(matches) < MIN_MATCHED:
        # Too little in common to tell a late rank from windows that began apart: say so.
        return Verdict(
            headline=(
                f"not compared: too little overlap: {_fmt_s(overlap)} of {_fmt_s(shortest)} "
                f"({len(matches)} collective(s) completed together on two ranks or more; "
                f"need {MIN_MATCHED} and a quarter of the shortest window): trace the ranks "
                "together (gputrace --job-id)"
            ),
            ranks=tuple(timings.values()),
            matched=len(matches),
            notes=tuple(notes),
        )
    if overlap < shortest * 0.9:
        notes.append(
            f"the ranks' windows overlap {_fmt_s(overlap)} of {_fmt_s(shortest)}: each "
            "collective is compared among the ranks that traced it"
        )
    span = max(max(m.ends.values()) for m in matches) - min(
        min(m.arrivals.values()) for m in matches
    )
    span = max(span, 1e-9)
    losses, spurious, unseen = _real_losses(rs)
    _mark_lossy(matches, losses, sorted(spurious + unseen, key=lambda x: x.t))
    slow = _slow_links(rs)
    if slow is not None and slow.starved:
        notes.append(slow.starved)
    elif slow is not None:
        for m in matches:
            m.slow_link = bool(set(m.members) & set(slow.ranks))
    late = _lateness(matches)
    by_label = {r.label: r for r in rs}
    seen = Comparison(matches, rs, span, losses, spurious, unseen, slow)
    findings: list[Finding] = [f for rule in COLLECTIVE_RULES if (f := rule(seen)) is not None]
    own = _own_span(matches, span) if findings else span
    for label, (seconds, late_count, count, lateness) in late.items():
        t = timings[label]
        timings[label] = RankTiming(
            t.rank,
            t.host,
            t.pid,
            t.path,
            collectives=count,
            last=sum(1 for m in matches if label in m.arrivals and _last(m) == label),
            held_seconds=seconds,
            lateness_seconds=statistics.median(lateness) if lateness else 0.0,
            collective_seconds=sum(
                m.ends[label] - m.arrivals[label] for m in matches if label in m.arrivals
            ),
            step_seconds=t.step_seconds,
        )
        if (
            seconds
            < max(MIN_SECONDS, min(*EVIDENCED_MIN_SHARE.values(), OWN_HOLDER_MIN_SHARE) * own)
            or not count
            # Never the last to arrive: in every collective the others still waited for a
            # later rank, so none ended sooner for its lateness (seen: a rank sharing a CPU
            # with a CPU-hogged one, after the median in most collectives, before the hogged
            # rank in all 19).
            or not timings[label].last
        ):
            continue
        consistent = late_count / count >= MIN_LATE_FRACTION
        if not consistent and (
            late_count / count < MIN_INTERMITTENT_FRACTION or seconds < MIN_SHARE * own
        ):
            continue  # not consistently: jitter
        f = _late_finding(by_label[label], matches, seconds, span, rs)
        if not consistent and not _intermittent(f):
            continue
        if seconds >= MIN_SHARE * own or _evidenced(
            f,
            own,
            _own_holder(by_label[label], matches, rs),
            _held_outside(by_label[label], matches, rs),
            _stormed(by_label[label]),
        ):
            findings.append(f)
    findings.sort(key=lambda f: -f.seconds)
    worst = max(late.values(), key=lambda v: v[0])[0] if late else 0.0
    job_time = ""
    if findings:
        headline = "; ".join(f.summary for f in findings)
    else:
        headline = (
            f"no straggler: the ranks are within noise (the latest rank kept the others "
            f"waiting {_fmt_s(worst)}, {worst / span:.1%} of the {_fmt_s(span)} compared)"
        )
        job_time, first = _job_time(rs, matches)
        if first:
            headline += f"; where the time went: {first}"
    return Verdict(
        headline=headline,
        stragglers=tuple(findings),
        within_noise=not findings,
        job_time=job_time,
        ranks=tuple(timings[r.label] for r in rs),
        compared_seconds=span,
        matched=len(matches),
        notes=tuple(notes),
    )


def _ranks(ranks: Sequence[RankEvidence], offsets_ns: Mapping[str, int]) -> list[_Rank]:
    out = []
    seen: set[int] = set()
    origin = min(
        (c.arrival_unix_ns + offsets_ns.get(ev.host, 0) for ev in ranks for c in ev.collectives),
        default=0,
    )
    for i, ev in enumerate(sorted(ranks, key=lambda e: (e.rank < 0, e.rank, e.host, e.pid))):
        label = ev.rank if ev.rank >= 0 and ev.rank not in seen else -(i + 1)
        seen.add(label)
        r = _Rank(ev, label, offsets_ns.get(ev.host, 0) - origin)
        groups: dict[str, list[CollectiveEvidence]] = {}
        for c in ev.collectives:
            groups.setdefault(c.group, []).append(c)
        r.groups = sorted(groups.values(), key=lambda g: g[0].arrival_unix_ns)
        out.append(r)
    return out


def _apart(rs: list[_Rank]) -> str:
    """Why these ranks' files are not one trace of one job ("" when their windows overlap)."""
    starts = [r.ev.window_start_unix_ns + r.offset_ns for r in rs]
    ends = [r.ev.window_end_unix_ns + r.offset_ns for r in rs]
    if max(starts) < min(ends):
        return ""
    return (
        "the files' windows do not overlap in time, so they are not one trace of one job "
        "(give the files of one trace: each rank's file of the same request)"
    )


def _overlap(rs: list[_Rank]) -> tuple[float, float]:
    """(seconds all the ranks' windows share, seconds of the shortest window): a window
    inside a longer one is compared whole; windows that began apart share less."""
    starts = [r.ev.window_start_unix_ns + r.offset_ns for r in rs]
    ends = [r.ev.window_end_unix_ns + r.offset_ns for r in rs]
    shortest = min(e - s for s, e in zip(starts, ends, strict=True))
    return max(0, min(ends) - max(starts)) / 1e9, shortest / 1e9


def _name(r: _Rank) -> str:
    who = f"rank {r.label}" if r.label >= 0 else f"pid {r.ev.pid}"
    return who + (f" on {r.ev.host}" if r.ev.host else "")


def _timing(r: _Rank) -> RankTiming:
    return RankTiming(r.label, r.ev.host, r.ev.pid, r.ev.path, step_seconds=r.ev.steps.step_seconds)


def _sec(r: _Rank, unix_ns: int) -> float:
    return (unix_ns + r.offset_ns) / 1e9


def _match(rs: list[_Rank]) -> tuple[list[_Match], list[str]]:
    """The ranks' collectives paired by what identifies them (see the module doc), and
    notes on what could not be paired.

    The reference is the rank with the most collectives. Each other rank's groups are
    paired with the reference's groups, and each pair of groups aligned, by `_alignment`;
    a collective then joins the match of the reference's collective it aligns with, or a
    match of its own beyond the reference's window (where two other ranks may still share
    it), keyed by its place in the reference's order.
    """
    ref = max(rs, key=lambda r: sum(len(g) for g in r.groups))
    notes: list[str] = []
    # (reference group, place in its order) -> rank label -> (the rank, its group, place)
    keyed: dict[tuple[int, int], dict[int, tuple[_Rank, int, int]]] = defaultdict(dict)
    for g, seq in enumerate(ref.groups):
        for i in range(len(seq)):
            keyed[(g, i)][ref.label] = (ref, g, i)
    for r in rs:
        if r is ref:
            continue
        candidates = sorted(
            (
                (support, -abs(shift), g, h, shift)
                for g, a in enumerate(ref.groups)
                for h, b in enumerate(r.groups)
                for shift, support in [_alignment(ref, a, r, b)]
                if support
            ),
            reverse=True,
        )
        used_ref: set[int] = set()
        used_own: set[int] = set()
        for _support, _, g, h, shift in candidates:
            if g in used_ref or h in used_own:
                continue
            used_ref.add(g)
            used_own.add(h)
            a, b = ref.groups[g], r.groups[h]
            for j, c in enumerate(b):
                i = j - shift
                if 0 <= i < len(a) and not _same(a[i], c):
                    continue  # a different collective at that place: not this one
                keyed[(g, i)][r.label] = (r, h, j)
        unpaired = sum(len(b) for h, b in enumerate(r.groups) if h not in used_own)
        if unpaired:
            notes.append(
                f"{_name(r)}: {unpaired} collective(s) completed at no moment when one of "
                f"{_name(ref)}'s did (different collectives, or clocks apart): not compared"
            )
    out: list[_Match] = []
    for (g, _i), found in sorted(keyed.items()):
        if len(found) < 2:
            continue
        members = {k: r.groups[h][j] for k, (r, h, j) in found.items()}
        run_ups = {
            k: _sec(r, r.groups[h][j - 1].arrival_unix_ns if j else r.ev.window_start_unix_ns)
            for k, (r, h, j) in found.items()
        }
        out.append(
            _Match(
                members,
                {k: _sec(found[k][0], v.arrival_unix_ns) for k, v in members.items()},
                {k: _sec(found[k][0], v.end_unix_ns) for k, v in members.items()},
                g,
                run_ups,
            )
        )
    out.sort(key=lambda m: (m.group, min(m.ends.values())))
    return out, notes


#: Collectives whose payload is the same on every rank (so a different size means a
#: different collective); all-to-all, gather, scatter and point-to-point sizes may differ.
SAME_SIZE_OPS = frozenset(
    {"allreduce", "broadcast", "allgather", "reducescatter", "reduce", "allgatherbase"}
)


def _same(a: CollectiveEvidence, b: CollectiveEvidence) -> bool:
    """Whether two ranks' collectives may be one: the same operation, the same NCCL sequence
    number where both files know it, and the same size where both files know it and every
    rank's is the same."""
    if a.op != b.op:
        return False
    if a.nccl_seq is not None and b.nccl_seq is not None and a.nccl_seq != b.nccl_seq:
        return False
    if a.op not in SAME_SIZE_OPS or not a.size_bytes or not b.size_bytes:
        return True
    return a.size_bytes == b.size_bytes


def _alignment(
    ref: _Rank, a: list[CollectiveEvidence], r: _Rank, b: list[CollectiveEvidence]
) -> tuple[int, int]:
    """(shift, support): the offset j - i at which b[j] is the same collective as a[i], and
    how many collectives vouch for it (0: none do).

    Where both ranks' files have NCCL's sequence numbers (its profiler plugin's rows), they
    say which collective is which whatever the clocks: each number both have votes, and the
    offset most of them agree on wins.

    A collective completes on every rank at nearly the same moment (its last rank's arrival
    releases them all), so each of ``a``'s collectives votes for the one of ``b`` that
    completed nearest to it on the common clock — when that is the same operation and size,
    and nearer than half the time to ``a``'s neighbouring completions (else it could be a
    neighbour's) and than `MAX_APART`. The offset most collectives vote for wins, when at
    least `MIN_VOTES` vote for it and twice as many as for any other: there is no limit on
    how far apart the windows started, and nothing is paired by order alone.
    """
    if not a or not b:
        return 0, 0
    numbered = {c.nccl_seq: j for j, c in enumerate(b) if c.nccl_seq is not None}
    by_number = Counter(
        numbered[c.nccl_seq] - i
        for i, c in enumerate(a)
        if c.nccl_seq in numbered and _same(c, b[numbered[c.nccl_seq]])
    )
    if by_number:
        return max(by_number.items(), key=lambda kv: (kv[1], -abs(kv[0])))
    a_end = [_sec(ref, c.end_unix_ns) for c in a]
    order = sorted(range(len(b)), key=lambda j: b[j].end_unix_ns)
    b_end = [_sec(r, b[j].end_unix_ns) for j in order]
    votes: Counter[int] = Counter()
    for i, c in enumerate(a):
        room = MAX_APART
        if i:
            room = min(room, (a_end[i] - a_end[i - 1]) / 2)
        if i + 1 < len(a):
            room = min(room, (a_end[i + 1] - a_end[i]) / 2)
        k = bisect.bisect_left(b_end, a_end[i])
        near = min(
            (x for x in (k - 1, k) if 0 <= x < len(b_end)),
            key=lambda x: abs(b_end[x] - a_end[i]),
        )
        j = order[near]
        if abs(b_end[near] - a_end[i]) < room and _same(c, b[j]):
            votes[j - i] += 1
    if not votes:
        return 0, 0
    (shift, support), *rest = sorted(votes.items(), key=lambda kv: (-kv[1], abs(kv[0])))
    needed = min(MIN_VOTES, len(a), len(b))
    if support < needed or (rest and support < 2 * rest[0][1]):
        return 0, 0
    return shift, support


def _last(m: _Match) -> int:
    return max(m.arrivals, key=m.arrivals.__getitem__)


def _lateness(matches: list[_Match]) -> dict[int, tuple[float, int, int, list[float]]]:
    """Per rank: (seconds the others waited for it, collectives it was late to, collectives
    it took part in, its lateness in each); each match's ``late`` holds the part of each
    rank's lateness that is its own.

    A rank that left the previous collective of its group after the others, when packets
    were lost around that collective, starts its run-up late for the network's sake: with
    gloo's ring, a packet lost on the way to one rank stalls that rank (and those that wait
    for its next send) until the retransmit, while the others are already done. That part
    of its lateness (how much later than the others' median it left, at most its lateness)
    is not its own; the network finding counts it (the collective's last completion).
    """
    raw: dict[int, list[float]] = defaultdict(list)
    own: dict[int, list[float]] = defaultdict(list)
    waits: dict[int, list[tuple[float, float]]] = defaultdict(list)
    previous: dict[tuple[int, int], _Match] = {}
    for m in matches:
        for k, a in m.arrivals.items():
            lateness = a - statistics.median(v for o, v in m.arrivals.items() if o != k)
            raw[k].append(lateness)
            mine = lateness
            before = previous.get((m.group, k))
            if mine > 0 and before is not None and (before.lossy or before.slow_link):
                left = before.ends[k] - statistics.median(
                    v for o, v in before.ends.items() if o != k
                )
                mine -= min(mine, max(0.0, left))
            m.late[k] = mine
            own[k].append(mine)
            if mine > 0:  # the others waited from `mine` before its arrival to its arrival
                waits[k].append((a - mine, a))
        for k in m.arrivals:
            previous[(m.group, k)] = m
    return {
        k: (_union_length(waits[k]), sum(1 for x in own[k] if x > 0), len(v), v)
        for k, v in raw.items()
    }


def _own_span(matches: list[_Match], span: float) -> float:
    """The compared time less the network's: the time inside collectives that packet loss
    or slow links slowed, after their last rank arrived. With a network finding made, a
    late rank's share is of what remains: with every collective 160 ms longer for a slow
    link, a rank starved of CPU on the side loses the job as much time per step as before,
    a small share of the whole (two faults, two ranks named)."""
    network = _union_length(
        [
            (max(m.arrivals.values()), max(m.ends.values()))
            for m in matches
            if m.lossy or m.slow_link
        ]
    )
    return max(span - network, 1e-9)


def _evidenced(
    f: Finding,
    own: float,
    own_holder: str | None = None,
    outside: float = 1.0,
    stormed: bool = False,
) -> bool:
    """A late rank under `MIN_SHARE` is named when the kernel says why with evidence that
    healthy ranks do not have: most of its lost time is its cgroup's CPU quota throttling
    (the cgroup's own counters), uninterruptible disk waits (or memory pressure), or waits
    for a CPU held by tasks outside the job (ranks of the job and its own threads are taken
    out by `_shared_cpu` when its work or its reads lead) — from a lower share
    when one task outside the job held its CPU, and not the others', run-up after run-up
    (``own_holder``, `_own_holder`). Of its waits for a CPU, only the share held outside
    the job (``outside``, `_held_outside`) counts: a healthy rank on a CPU shared with
    other ranks and another job's busy process, traced with windows apart, waited for a
    CPU 6 % of the time beyond the others, 53 % of it for its own threads and the job's
    ranks, and was named. Interrupts only when its CPUs were ``stormed`` (`_stormed`)."""
    if not f.causes or f.causes[0].cause not in EVIDENCED_MIN_SHARE:
        return False
    if f.causes[0].cause == "interrupts" and not stormed:
        return False
    first = f.causes[0]
    bar = EVIDENCED_MIN_SHARE[first.cause]
    explained = first.seconds
    if first.cause == "cpu_wait":
        lead = next((c.cause for c in f.causes if c.cause not in ("cpu_wait", "unexplained")), "")
        if own_holder is not None:
            bar = OWN_HOLDER_MIN_SHARE
        elif lead not in SHARED_CPU_LEADS or (lead == "interrupts" and not stormed):
            explained *= outside  # else `_shared_cpu` took the job's waits out
    return f.seconds >= bar * own and explained >= EVIDENCED_EXPLAINED * f.seconds


def _held_outside(r: _Rank, matches: list[_Match], rs: list[_Rank]) -> float:
    """Of ``r``'s waits for a CPU in the run-ups it reached late, the share held by tasks
    outside the job: not its own threads, not the job's ranks on its host (1 when it
    waited for none)."""
    job = {x.ev.pid for x in rs if x.ev.host == r.ev.host}
    total = outside = 0.0
    for m in matches:
        if m.late.get(r.label, 0.0) > 0 and r.label in m.members:
            for h in m.members[r.label].holders:
                total += h.seconds
                if _holder_pid(h.cause) not in job:
                    outside += h.seconds
    return outside / total if total else 1.0


def _own_holder(r: _Rank, matches: list[_Match], rs: list[_Rank]) -> str | None:
    """The task outside the job that held ``r``'s CPU consistently and the other ranks'
    hardly at all (a weak hog pinned to its CPU), or None.

    In the run-ups to the collectives ``r`` reached late: it is among the tasks that held
    its CPU in at least `OWN_HOLDER_PRESENCE` of them, holds at least `OWN_HOLDER_OF_WAITS`
    of its waits there, and at least `OWN_HOLDER_FACTOR` times what it held the median
    other rank's CPU in the same run-ups. The ranks of the job on its host, its own threads
    and ksoftirqd (interrupts) are not candidates. Healthy jitter fails it: waits spread
    over many tasks, or a busy process that takes every rank's CPU in turn.
    """
    late = [m for m in matches if m.late.get(r.label, 0.0) > 0 and r.label in m.members]
    if len(late) < OWN_HOLDER_MIN_RUNUPS:
        return None
    job = {x.ev.pid for x in rs if x.ev.host == r.ev.host}
    present: Counter[str] = Counter()
    held: dict[str, float] = defaultdict(float)
    total = 0.0
    for m in late:
        for h in m.members[r.label].holders:
            total += h.seconds
            if h.cause.startswith(SOFTIRQ_THREAD) or _holder_pid(h.cause) in job:
                continue
            present[h.cause] += 1
            held[h.cause] += h.seconds
    if not held:
        return None
    task = max(held, key=held.__getitem__)
    if present[task] < OWN_HOLDER_PRESENCE * len(late) or held[task] < OWN_HOLDER_OF_WAITS * total:
        return None
    others = [
        sum(
            h.seconds
            for m in late
            if o in m.members
            for h in m.members[o].holders
            if h.cause == task
        )
        for o in {x.label for x in rs} - {r.label}
    ]
    if others and OWN_HOLDER_FACTOR * statistics.median(others) > held[task]:
        return None
    return task


def _intermittent(f: Finding) -> bool:
    """A rank late in only some collectives is named when most of its lost time was a
    cause of `INTERMITTENT_CAUSES` (see there)."""
    return bool(
        f.causes
        and f.causes[0].cause in INTERMITTENT_CAUSES
        and f.causes[0].seconds >= EVIDENCED_EXPLAINED * f.seconds
    )


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by the intervals: time counted once however many collectives (of
    several groups, or mispaired) claim it, so it never exceeds the time compared."""
    total, reach = 0.0, -math.inf
    for lo, hi in sorted(intervals):
        if hi > reach:
            total += hi - max(lo, reach)
            reach = hi
    return total


def _late_finding(
    r: _Rank, matches: list[_Match], seconds: float, span: float, rs: list[_Rank]
) -> Finding:
    """Why ``r`` arrived late: its run-ups' causes beyond the other ranks' (module doc)."""
    excess: dict[str, float] = defaultdict(float)
    usual: dict[str, float] = defaultdict(float)  # what the other ranks had of each cause
    holders: dict[str, float] = defaultdict(float)
    details: dict[str, Counter[str]] = defaultdict(Counter)
    worst: list[Instance] = []
    workers = _WorkerWaits()
    for m in matches:
        mine = m.members.get(r.label)
        if mine is None:
            continue
        if m.late.get(r.label, 0.0) <= 0:
            continue
        own = {c.cause: c for c in mine.before}
        theirs = [
            {c.cause: c.seconds for c in v.before} for o, v in m.members.items() if o != r.label
        ]
        for cause, c in own.items():
            typical = statistics.median(t.get(cause, 0.0) for t in theirs)
            usual[cause] += typical
            extra = c.seconds - typical
            if extra > 0:
                excess[cause] += extra
                if c.detail:
                    details[cause][c.detail] += 1
        for h in mine.holders:
            holders[h.cause] += h.seconds
        if "data_loader" in own:
            workers.add(mine, own["data_loader"].seconds)
        worst += [replace(w, path=r.ev.path) for w in mine.worst if w.cause in own]
    reads_on_cpu: dict[str, float] = {}
    for cause, on_cpu in READ_CPU.items():
        # The kernel's work on its CPU in the reads it slept in is the reads' cost: a rank
        # refilling evicted pages was named for "its own work" before its disk.
        usual[cause] += usual.pop(on_cpu, 0.0)
        if (ran := excess.pop(on_cpu, 0.0)) > 0:
            excess[cause] += ran
            reads_on_cpu[cause] = ran
    quota = _throttled(r.ev.cpu_quotas)
    if quota is not None:
        # The quota held the rank's threads off the CPU while they were runnable: its waits
        # for a CPU are the quota's (whoever ran meanwhile did not cause them) — all of them
        # when most periods were throttled (each runnable thread waits out the period, so
        # threads together wait longer than the cgroup's throttled time), else up to it.
        waits = excess.pop("cpu_wait", 0.0)
        mostly = quota.throttled_periods >= QUOTA_MOSTLY * quota.periods
        moved = waits if mostly else min(waits, quota.throttled_seconds)
        excess["cpu_quota"] = moved
        if waits > moved:
            excess["cpu_wait"] = waits - moved
        worst = [_quota_instance(w, quota) if w.cause == "cpu_wait" else w for w in worst]
        details["cpu_quota"][_quota_detail(quota)] += 1
    memory = _memory_pressure(r, rs)
    # Reclaim on its CPU beyond the other ranks', where its file timed it (the sched track's
    # reclaim slices; the evidence takes that time out of its work).
    reclaiming = excess.get("memory", 0.0)
    if memory is not None and (excess.get("disk") or excess.get("on_cpu") or reclaiming):
        # Reclaim at its own cgroup's limit: its uninterruptible waits (pages read again
        # after reclaim evicted them, stalls in reclaim) are the limit's, not the disk's...
        waited = excess.pop("disk", 0.0)
        worst = [replace(w, cause="memory") if w.cause == "disk" else w for w in worst]
        # ... and so is its extra time on a CPU beyond its timed reclaims: it reads back the
        # pages the others find in memory (allocating, charging and filling them), which
        # costs far more CPU than reclaim itself (reading 192 MiB through a 16 MiB limit:
        # 223 reclaims, 21 ms in all; the rank of the real job ran 1.5-2.7 s longer), and a
        # file without reclaim slices cannot split reclaim out either. Where the cgroup's
        # pressure counters exist (v2), at most the time its tasks stalled on memory beyond
        # those waits.
        ran = excess.pop("on_cpu", 0.0)
        stall = memory.stall_seconds
        bound = max(0.0, stall - waited - reclaiming) if stall else ran
        untimed = min(ran, bound)
        if ran > untimed:
            excess["on_cpu"] = ran - untimed
        excess["memory"] = reclaiming + waited + untimed
        details["memory"][_memory_detail(memory, reclaiming, untimed)] += 1
    elif reclaiming > 0:
        details["memory"][f"reclaiming pages on its CPU {_fmt_s(reclaiming)}"] += 1
    taken = _softirq_threads(holders, excess, details, r.ev.pid, seconds)
    taken |= _shared_cpu(r, rs, holders, excess, details, seconds)
    causes: list[CauseTime] = []
    explained = 0.0
    # The waits for a CPU that remain are those held by everyone else: only they are named.
    said = LateCause(
        r, rs, {h: v for h, v in holders.items() if h not in taken}, details, workers, reads_on_cpu
    )
    for cause, extra in sorted(excess.items(), key=_rank_causes(seconds, usual)):
        share = min(extra, seconds)
        if share < MIN_CAUSE_SHARE * seconds:
            continue
        explained += share
        causes.append(CauseTime(cause, share, _cause_detail(cause, said)))
    rest = seconds - min(seconds, explained)
    if rest >= MIN_CAUSE_SHARE * seconds:
        # Not seen by the kernel, or not recorded: a sched track sampled in time by the
        # agent's overhead budget shows a quarter of the waits, and the rest is no evidence
        # of slower work.
        incomplete = r.ev.sched_incomplete
        causes.append(
            CauseTime(
                "unexplained",
                rest,
                f"the sched track was incomplete: {incomplete}" if incomplete else "",
            )
        )
    order = {c.cause: i for i, c in enumerate(causes)}
    # A collective's run-up starts at the previous arrival, so it holds the previous
    # collective: an interval there is the worst of both. List it once.
    unique = {(w.cause, w.tid, w.ts_us): w for w in worst if w.cause in order}
    # The first cause's worst first: a long wait for a CPU on a loaded machine must not
    # hide the reads that made the rank late.
    worst = sorted(unique.values(), key=lambda w: (order[w.cause], -w.duration_ns))
    why = ", ".join(
        f"{CAUSES.get(c.cause, c.cause)} {_fmt_s(c.seconds)}"
        + (f" ({c.detail})" if c.detail else "")
        for c in causes[:3]
    )
    summary = (
        f"{_name(r)} held the job back: the other ranks waited {_fmt_s(seconds)} for it "
        f"({seconds / span:.0%} of the {_fmt_s(span)} compared)" + (f"; why: {why}" if why else "")
    )
    return Finding(
        rank=r.label,
        host=r.ev.host,
        pid=r.ev.pid,
        kind="late",
        seconds=seconds,
        share=seconds / span,
        causes=tuple(causes),
        worst=tuple(worst[:TOP_INSTANCES]),
        summary=summary,
    )


def _rank_causes(
    seconds: float, usual: Mapping[str, float]
) -> Callable[[tuple[str, float]], tuple[float, bool, float]]:
    """The order of a late rank's causes: by the time each explains (at most the time it
    lost), the largest first; of causes that each explain all of it, one the other ranks had
    none of first (disk waits beside waits for a CPU every rank on a loaded machine has),
    then the larger excess. A 1 MiB read a step from a throttled disk, on a CPU shared with
    other jobs, left its rank 405 ms of disk waits (its waits for its own threads with them;
    the other ranks had none) and 426 ms more waits for a CPU than the others' 322 ms, each
    over the 338 ms it lost: "waiting for a CPU" came first, held by other jobs' threads."""

    def key(kv: tuple[str, float]) -> tuple[float, bool, float]:
        cause, extra = kv
        return (
            -min(extra, seconds),
            not (extra >= seconds and usual.get(cause, 0.0) == 0.0),
            -extra,
        )

    return key


def _memory_pressure(r: _Rank, rs: list[_Rank]) -> MemoryCgroup | None:
    """The nearest memory cgroup of ``r`` that hit its limit in the window and made it read
    pages again (refaults, major faults), and that no other rank of its host is in: a limit
    of its own below its working set. (A cgroup the whole node shares is no reason for one
    rank to be late.)"""
    shared = {
        m.cgroup for x in rs if x is not r and x.ev.host == r.ev.host for m in x.ev.memory_cgroups
    }
    for m in r.ev.memory_cgroups:
        if m.cgroup not in shared and m.limit_hits > 0 and m.refaults + m.major_faults > 0:
            return m
    return None


def _memory_detail(m: MemoryCgroup, reclaiming: float = 0.0, untimed: float = 0.0) -> str:
    stalled = f", its tasks stalled {_fmt_s(m.stall_seconds)}" if m.stall_seconds else ""
    ran = ""
    if reclaiming >= 0.0005:
        ran = f"; {_fmt_s(reclaiming)} of it reclaiming pages on its CPU"
        if untimed >= 0.0005:
            ran += f", {_fmt_s(untimed)} more on its CPU (reading pages back)"
    elif untimed >= 0.0005:
        ran = f"; {_fmt_s(untimed)} of it on its CPU (reclaim and reading pages back)"
    return (
        f"cgroup {m.cgroup} at its {_fmt_bytes(m.limit_bytes)} limit {m.limit_hits} times: "
        f"{m.refaults} pages read again after reclaim, {m.major_faults} major faults{stalled}" + ran
    )


def _holder_pid(holder: str) -> int:
    """The pid in a CPU holder's name (``comm (pid N)``), or 0."""
    _, _, tail = holder.rpartition("(pid ")
    return int(tail[:-1]) if tail.endswith(")") and tail[:-1].isdigit() else 0


def _softirq_threads(
    holders: Mapping[str, float],
    excess: dict[str, float],
    details: dict[str, Counter[str]],
    own_pid: int = 0,
    lost: float = math.inf,
) -> set[str]:
    """Waits for a CPU held by ksoftirqd are interrupts: the kernel hands softirq work that
    comes faster than it can do on the spot (an interrupt storm) to that CPU's ksoftirqd
    thread, which then takes the CPU from the rank like any task. Returns the holders whose
    waits it took.

    Their share is of the waits held by others than the rank's own threads (process
    ``own_pid``): those take turns with its main thread on what CPU the storm leaves them,
    as every rank's do; a storm that starves the rank makes its main thread wait for its
    own gloo threads too (80 % of its waits in a matrix run, ksoftirqd's a third of the
    rest), and they did not cause that."""
    total = sum(v for h, v in holders.items() if not own_pid or _holder_pid(h) != own_pid)
    threads = {h for h in holders if h.startswith(SOFTIRQ_THREAD)}
    soft = sum(holders[h] for h in threads)
    if not soft or not excess.get("cpu_wait"):
        return set()
    moved = excess["cpu_wait"] * min(1.0, soft / total)
    excess["cpu_wait"] -= moved
    excess["interrupts"] = excess.get("interrupts", 0.0) + moved
    # Said of the cause, which is capped at the time the rank lost (``lost``): never more.
    said = min(moved, lost)
    details["interrupts"][f"{_fmt_s(said)} of it waiting for ksoftirqd (softirq work)"] += 1
    return threads


def _shared_cpu(
    r: _Rank,
    rs: list[_Rank],
    holders: Mapping[str, float],
    excess: dict[str, float],
    details: dict[str, Counter[str]],
    seconds: float,
) -> set[str]:
    """A rank late for its own work or its reads, and waiting for a CPU held by its own
    threads or other ranks of the job on its host: those waits are that cause's too.

    Its threads and ranks sharing a CPU take turns on it; the one with more work is
    runnable while the others run theirs (gloo's threads among them, serving the collective
    it is late to), so it also waits longer for the CPU. A rank late for its disk reads
    (`SHARED_CPU_LEADS`) reaches each collective when its own gloo threads are busy taking
    in the other ranks' data, and waits for them: a 1 MiB read a step from a disk throttled
    to 20 MB/s slept 2.5 ms a step on the disk and made the rank wait twice that for its own
    threads, and "waiting for a CPU" came first. Blaming the job's threads for either
    would send an engineer after the wrong processes. Waits for anyone else (a hog) stay
    ``cpu_wait``. Only when that cause is the largest excess besides the waits. Returns the
    holders whose waits it took."""
    lead = max((k for k in excess if k != "cpu_wait"), key=excess.__getitem__, default="")
    ran = excess.get("on_cpu", 0.0)
    said = f"ran {_fmt_s(ran)} longer than the other ranks"
    if (
        lead not in SHARED_CPU_LEADS
        or excess[lead] < MIN_CAUSE_SHARE * seconds
        or (lead == "interrupts" and not _stormed(r))
    ):
        # Its work or reads are not the main excess (reads past the page cache run longer
        # too, in the kernel's copies, but a hog's waits are not theirs).
        if ran >= MIN_CAUSE_SHARE * seconds:
            details["on_cpu"][said] += 1
        return set()
    ranks = {x.ev.pid: x.label for x in rs if x.ev.host == r.ev.host}
    by_ranks: dict[int, float] = defaultdict(float)
    taken = set()
    for holder, held in holders.items():
        if _holder_pid(holder) in ranks:
            by_ranks[ranks[_holder_pid(holder)]] += held
            taken.add(holder)
    if by_ranks and excess.get("cpu_wait"):
        # Of the waits `_softirq_threads` left: those for anyone but ksoftirqd.
        others_held = sum(v for h, v in holders.items() if not h.startswith(SOFTIRQ_THREAD))
        moved = excess["cpu_wait"] * sum(by_ranks.values()) / others_held
        excess["cpu_wait"] -= moved
        excess[lead] += moved
        others = sorted(k for k in by_ranks if k != r.label)
        whom = [*(["its own threads"] if r.label in by_ranks else [])]
        if others:
            whom.append(f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))}")
        waited = f"waited {_fmt_s(moved)} for the CPU held by {' and '.join(whom)}"
        said = f"{said}; {waited}" if lead == "on_cpu" else waited
    else:
        taken = set()
    if lead == "on_cpu":
        details["on_cpu"][said] += 1
        return taken
    if taken:
        details[lead][said] += 1
    if ran >= MIN_CAUSE_SHARE * seconds:
        details["on_cpu"][f"ran {_fmt_s(ran)} longer than the other ranks"] += 1
    return taken


#: The causes whose waits for a CPU held by the rank's own threads and the job's other ranks
#: are theirs (`_shared_cpu`): its own work, reads from the disk (or under a memory limit),
#: and a storm's interrupts on its CPUs (`_stormed`): ranks sharing a CPU a storm takes wait
#: for each other on what it leaves them, and the storm, not the other rank, caused that.
SHARED_CPU_LEADS = frozenset({"on_cpu", "disk", "memory", "interrupts"})


def _interrupts_a_step(r: _Rank) -> float:
    """The time ``r``'s CPUs spent in interrupts and softirqs a step (the fabric track's,
    at its rate over the steps' span for a median step; 0 without it)."""
    return next((p.seconds for p in r.ev.steps.parts if p.cause == "interrupts"), 0.0)


def _stormed(r: _Rank) -> bool:
    """An interrupt storm on ``r``'s CPUs: they spent at least `JOB_PART_MIN` of its step in
    interrupts (1.3 % in the storm's control run)."""
    step = r.ev.steps.step_seconds
    return step > 0 and _interrupts_a_step(r) >= JOB_PART_MIN * step


@dataclass(frozen=True, slots=True)
class LateCause:
    """What a cause's detail is said from, for a rank found late (`CAUSE_DETAILS`): the rank,
    every rank, the tasks that held its CPU while it waited for one (seconds each), and the
    details its run-ups gave each cause (system calls...), counted."""

    rank: _Rank
    ranks: list[_Rank]
    holders: Mapping[str, float]
    details: Mapping[str, Counter[str]]
    workers: _WorkerWaits = field(default_factory=lambda: _WorkerWaits())
    #: Per read cause: the kernel's work on its CPU in those reads, beyond the other ranks'.
    reads_on_cpu: Mapping[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _WorkerWaits:
    """What a late rank's DataLoader workers waited for while its main thread waited for them,
    over its late run-ups (`CollectiveEvidence.workers`)."""

    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    details: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    pids: set[int] = field(default_factory=set)
    waited: float = 0.0  # the main thread's waits for them in those run-ups

    def add(self, c: CollectiveEvidence, waited: float) -> None:
        self.waited += waited
        for w in c.workers:
            self.seconds[w.cause] += w.seconds
            if w.detail:
                self.details[w.cause][w.detail] += 1
        self.pids.update(c.worker_pids)


def _cpu_holders(c: LateCause) -> str:
    if not c.holders:
        return ""
    total = sum(c.holders.values())
    top = sorted(c.holders.items(), key=lambda kv: -kv[1])[:3]
    return "the CPU was held by " + ", ".join(f"{h} {s / total:.0%}" for h, s in top)


def _sm_clock(c: LateCause) -> str:
    mine = c.rank.ev.gpu_sm_clock_mhz
    others = [x.ev.gpu_sm_clock_mhz for x in c.ranks if x is not c.rank and x.ev.gpu_sm_clock_mhz]
    if mine and others:
        median = statistics.median(others)
        if mine < SLOW_CLOCK * median:
            return f"SM clock {mine:.0f} MHz against {median:.0f} MHz on the other ranks"
    return ""


def _workers_said(c: LateCause) -> str:
    """The DataLoader workers and what they waited for while the main thread waited for them
    (each cause at most that): "pid 12, 13, which were blocked on disk for 1.20 s (read),
    waiting for a CPU for 0.10 s (held by hog (pid 9)) of the 1.40 s it waited for them"."""
    w = c.workers
    if not w.pids:  # no workers recorded: the system calls the main thread waited in
        return ", ".join(name for name, _ in c.details.get("data_loader", Counter()).most_common(3))
    said = []
    for cause, seconds in sorted(w.seconds.items(), key=lambda kv: -kv[1])[:3]:
        top = w.details[cause].most_common(1)
        said.append(
            f"{WORKER_CAUSES.get(cause, CAUSES.get(cause, cause))} for {_fmt_s(seconds)}"
            + (f" ({top[0][0]})" if top else "")
        )
    pids = ", ".join(str(p) for p in sorted(w.pids))
    were = "was" if len(w.pids) == 1 else "were"
    return (
        f"pid {pids}, which {were} "
        + ", ".join(said)
        + f" of the {_fmt_s(w.waited)} it waited for them"
    )


#: How a DataLoader worker's wait is said after "which were".
WORKER_CAUSES = {
    "cpu_wait": "waiting for a CPU",
    "disk": "blocked on disk (uninterruptible sleep)",
    "file_io": "blocked in file I/O",
    "sleep": "sleeping",
    "io_wait": "blocked on a socket or pipe outside the job",
    "lock": "blocked on a lock outside the job",
    "blocked": "blocked (other)",
}


def _quota_said(c: LateCause) -> str:
    """The throttled cgroup, its periods and time (set in `_late_finding`)."""
    return next(iter(c.details.get("cpu_quota", ())), "")


def _memory_said(c: LateCause) -> str:
    """The cgroup at its limit and its counters (set in `_late_finding`)."""
    return next(iter(c.details.get("memory", ())), "")


#: A cause's detail for a late rank, when it says more than the system calls its run-ups
#: gave (the default): a small function of what `LateCause` holds. A cause whose evidence
#: names someone else (who held the CPU, a quota that throttled it) adds its function here.
def _interrupts_said(c: LateCause) -> str:
    """How much of a step its CPUs spent in interrupts when stormed (`_stormed`), then the
    waits for ksoftirqd (`_softirq_threads`) and for ranks sharing its CPU (`_shared_cpu`)."""
    said = list(c.details.get("interrupts", ()))
    if _stormed(c.rank):
        took, step = _interrupts_a_step(c.rank), c.rank.ev.steps.step_seconds
        said.insert(0, f"its CPUs spent {_fmt_s(took)} a step ({took / step:.0%}) in interrupts")
    return "; ".join(said)


def _own_work_said(c: LateCause) -> str:
    """How much longer it ran, and the waits for ranks sharing its CPU (`_shared_cpu`)."""
    return next(iter(c.details.get("on_cpu", ())), "")


def _reads_said(cause: str) -> Callable[[LateCause], str]:
    """A read cause's details, with how much of its time was the kernel's work on the
    rank's CPU in those reads after the first (the system call)."""

    def said(c: LateCause) -> str:
        parts = [name for name, _ in c.details.get(cause, Counter()).most_common(3)]
        ran = c.reads_on_cpu.get(cause, 0.0)
        if ran >= 0.0005:
            parts.insert(min(1, len(parts)), f"{_fmt_s(ran)} of it on its CPU in the reads")
        return ", ".join(parts)

    return said


CAUSE_DETAILS: dict[str, Callable[[LateCause], str]] = {
    "disk": _reads_said("disk"),
    "file_io": _reads_said("file_io"),
    "cpu_wait": _cpu_holders,
    "on_cpu": _own_work_said,
    "interrupts": _interrupts_said,
    "gpu_compute": _sm_clock,
    "cpu_quota": _quota_said,
    "memory": _memory_said,
    "data_loader": _workers_said,
}


def _cause_detail(cause: str, c: LateCause) -> str:
    said = CAUSE_DETAILS.get(cause)
    if said is not None:
        return said(c)
    if c.details.get(cause):
        return ", ".join(name for name, _ in c.details[cause].most_common(3))
    return ""


def _real_losses(rs: list[_Rank]) -> tuple[list[_Loss], list[_Loss], list[_Loss]]:
    """Every rank's loss events on the common clock, in time order, split into those that
    lost packets, the retransmits that were not needed — those whose copy the peer dropped
    as data it already had (a ``duplicate`` on the same connection, seen from the other
    end) — and the retransmits to a rank of the job that was not tracing then, which no one
    can tell apart: its file would have said whether it had the data. Windows that begin
    apart (``gputrace --job-id``: each rank at its own poll) leave up to a second of each
    rank's retransmits so; on a loaded machine most retransmits are not needed, and a
    healthy job traced that way was found "slowed by network loss" on them (10 of them,
    every one to a rank not yet tracing). Duplicates themselves are none of these."""
    events = sorted(
        (_Loss(_sec(r, e.unix_ns), r.label, e) for r in rs for e in r.ev.loss_events),
        key=lambda x: x.t,
    )
    unpaired: dict[tuple[str, str], list[int]] = defaultdict(list)  # (local, peer) -> indices
    for i, x in enumerate(events):
        if x.event.kind == "tcp_retransmit":
            unpaired[(x.event.local, x.event.peer)].append(i)
    spurious: set[int] = set()
    for x in events:
        if x.event.kind != "duplicate":
            continue
        # The latest retransmit of the connection's other end before this copy arrived.
        candidates = unpaired.get((x.event.peer, x.event.local), [])
        for j in reversed(candidates):
            if events[j].t <= x.t + CLOCK_SLACK:
                if x.t - events[j].t <= SPURIOUS_WINDOW:
                    spurious.add(j)
                    candidates.remove(j)
                break
    windows = {
        r.label: (_sec(r, r.ev.window_start_unix_ns), _sec(r, r.ev.window_end_unix_ns)) for r in rs
    }
    owner = {
        a: r.label
        for r in rs
        for a in (*r.ev.local_addresses, *(c.local for c in r.ev.connections))
    }

    def unseen(x: _Loss) -> bool:
        peer = owner.get(x.event.peer)
        if x.event.kind != "tcp_retransmit" or peer is None or peer == x.rank:
            return False
        lo, hi = windows[peer]
        return not lo - CLOCK_SLACK <= x.t <= hi + CLOCK_SLACK

    real: list[_Loss] = []
    unknown: list[_Loss] = []
    for i, x in enumerate(events):
        if x.event.kind == "duplicate" or i in spurious:
            continue
        (unknown if unseen(x) else real).append(x)
    return real, [events[i] for i in sorted(spurious)], unknown


def _mark_lossy(matches: list[_Match], real: list[_Loss], spurious: list[_Loss]) -> None:
    """A collective is lossy when some member counted loss events from its run-up to its
    end, unless every event listed in that time was a retransmit that was not needed, or
    one to a rank not tracing then (``spurious`` holds both: `_real_losses`). (A rank lists
    at most its first 1000 events: beyond them its count is trusted.)"""
    real_times = [x.t for x in real]
    spurious_times = [x.t for x in spurious]

    def within(times: list[float], lo: float, hi: float) -> int:
        return bisect.bisect_right(times, hi) - bisect.bisect_left(times, lo)

    for m in matches:
        if not any(c.loss_events for c in m.members.values()):
            continue
        lo, hi = min(m.run_ups.values()), max(m.ends.values())
        m.lossy = within(real_times, lo, hi) > 0 or within(spurious_times, lo, hi) == 0


def _network_finding(seen: Comparison) -> Finding | None:
    """Collectives slowed by packet loss, and whose connections lost the packets."""
    matches, rs, span, losses, spurious = (
        seen.matches,
        seen.ranks,
        seen.span,
        seen.losses,
        seen.spurious,
    )
    lost = _slowed(matches, lambda m: m.lossy)
    if lost < max(MIN_SECONDS, MIN_SHARE * span):
        return None
    owner: dict[str, int] = {}
    for r in rs:
        for address in r.ev.local_addresses:
            owner[address] = r.label
    involved: Counter[int] = Counter()
    peers: dict[int, Counter[int]] = defaultdict(Counter)
    kinds: Counter[str] = Counter()
    events = 0
    instances: list[Instance] = []
    by_label = {r.label: r for r in rs}
    for x in losses:  # in time order
        e, r = x.event, by_label[x.rank]
        events += 1
        kinds[e.kind] += 1
        other = owner.get(e.peer)
        involved[r.label] += 1
        if other is not None and other != r.label:
            involved[other] += 1
            peers[r.label][other] += 1
            peers[other][r.label] += 1
        instances.append(
            Instance(
                "network_loss",
                e.ts_us,
                e.unix_ns,
                0,
                f"{e.kind} on {_name(r)}'s socket {e.local} -> {e.peer}",
                path=r.ev.path,
            )
        )
    if not involved:
        return None
    # On a tie (the two ends of the same connections) the end that retransmitted: its
    # packets were lost on the way.
    retransmitted = Counter(x.rank for x in losses if x.event.kind == "tcp_retransmit")
    culprit = max(involved, key=lambda k: (involved[k], retransmitted[k], -k))
    count = involved[culprit]
    who = by_label[culprit]
    tied = [k for k, n in involved.items() if n == count and k != culprit]
    what = ", ".join(
        f"{n} {LOSS_WORDS.get(kind, kind)}{'' if n == 1 else 's'}"
        for kind, n in kinds.most_common()
    )
    with_ranks = ", ".join(str(k) for k, _ in peers[culprit].most_common()) or "unknown peers"
    detail = (
        f"{what}; rank {culprit} is on {count} of the {events} lost packets' connections "
        f"(peers: ranks {with_ranks})"
    )
    if tied:
        detail += f"; as many on rank(s) {', '.join(map(str, tied))}: the link between them"
        if retransmitted[culprit] > max(retransmitted[k] for k in tied):
            detail += f", rank {culprit}'s packets lost on the way (it retransmitted them)"
    if spurious:
        detail += (
            f"; {len(spurious)} more retransmit(s) were not needed (the peer had the data): "
            "not counted"
        )
    if seen.unseen:
        detail += (
            f"; {len(seen.unseen)} more to ranks not tracing then (whether they had the data "
            "is unknown): not counted"
        )
    summary = (
        f"network loss on {_name(who)}'s connections slowed the collectives by {_fmt_s(lost)} "
        f"({lost / span:.0%} of the {_fmt_s(span)} compared): {what}"
    )
    return Finding(
        rank=culprit,
        host=who.ev.host,
        pid=who.ev.pid,
        kind="network",
        seconds=lost,
        share=lost / span,
        causes=(CauseTime("network_loss", lost, detail),),
        worst=tuple(instances[:TOP_INSTANCES]),
        summary=summary,
    )


def _slowed(matches: list[_Match], flagged: Callable[[_Match], bool]) -> float:
    """Seconds the flagged collectives took beyond the others: each one's time from the last
    arrival to the last completion, over the median of the unflagged ones' (over the lower
    quartile of all when fewer than 3 are unflagged)."""
    transfer = [
        (max(0.0, max(m.ends.values()) - max(m.arrivals.values())), flagged(m)) for m in matches
    ]
    clean = [t for t, bad in transfer if not bad]
    if len(clean) >= 3:
        baseline = statistics.median(clean)
    else:
        baseline = sorted(t for t, _ in transfer)[len(transfer) // 4]
    return sum(max(0.0, t - baseline) for t, bad in transfer if bad)


def _fabric_finding(seen: Comparison) -> Finding | None:
    """Collectives slowed while the fabric (the ranks' RDMA ports and NICs, the fabric track)
    counted congestion or errors, and whose fabric counted most."""
    matches, rs, span = seen.matches, seen.ranks, seen.span

    def troubled(m: _Match) -> bool:
        return any(c.fabric_congestion or c.fabric_errors for c in m.members.values())

    lost = _slowed(matches, troubled)
    if lost < max(MIN_SECONDS, MIN_SHARE * span):
        return None
    congestion: Counter[int] = Counter()
    errors: Counter[int] = Counter()
    for m in matches:
        if troubled(m):
            for label, c in m.members.items():
                congestion[label] += c.fabric_congestion
                errors[label] += c.fabric_errors
    by_label = {r.label: r for r in rs}
    culprit = max(by_label, key=lambda k: (errors[k], congestion[k]))
    who = by_label[culprit]
    others = sorted(k for k in by_label if k != culprit and errors[k] + congestion[k])
    devices = ", ".join(who.ev.fabric_devices) or "its fabric"
    detail = (
        f"{errors[culprit]} errors or drops and {congestion[culprit]} congestion signals "
        f"(CNPs, ECN marks, transmit waits, pause frames) on {devices}"
        + (f"; fewer on rank(s) {', '.join(map(str, others))}" if others else "")
    )
    return Finding(
        rank=culprit,
        host=who.ev.host,
        pid=who.ev.pid,
        kind="fabric",
        seconds=lost,
        share=lost / span,
        causes=(CauseTime("fabric", lost, detail),),
        summary=(
            f"the fabric of {_name(who)} slowed the collectives by {_fmt_s(lost)} "
            f"({lost / span:.0%} of the {_fmt_s(span)} compared): {errors[culprit]} errors or "
            f"drops, {congestion[culprit]} congestion signals on {devices}"
        ),
    )


@dataclass(frozen=True, slots=True)
class _SlowLinks:
    """The slow connections of a job: the rank(s) they have in common (one rank, or the two
    ends of one link), their round trips and the job's typical one (ms)."""

    ranks: tuple[int, ...]
    slow_ms: float
    typical_ms: float
    connections: int
    peers: tuple[int, ...]
    #: Why the slowness is an end's waits for a CPU, not the network's ("": it is the
    #: network's) — `_cpu_starved_end`.
    starved: str = ""


def _slow_links(rs: list[_Rank]) -> _SlowLinks | None:
    """The rank (or link) on the job's slow TCP connections (module doc, 6), or None."""
    owner: dict[str, int] = {}
    for r in rs:
        for address in (*r.ev.local_addresses, *(c.local for c in r.ev.connections)):
            owner[address] = r.label
    # Per connection between two ranks (the collectives' connections: not the rendezvous
    # store's, whose process is not a rank), the round trips of its sampled ends.
    conns: dict[tuple[str, str], list[float]] = defaultdict(list)
    pair: dict[tuple[str, str], tuple[int, int]] = {}
    for r in rs:
        for c in r.ev.connections:
            if c.samples and c.peer in owner and owner[c.peer] != r.label:
                key = (min(c.local, c.peer), max(c.local, c.peer))
                conns[key].append(c.srtt_median_ms)
                pair[key] = (r.label, owner[c.peer])
    if len(conns) < 2:
        return None
    # A link delays what crosses it both ways, so both ends measure it; one end alone slow is
    # that end's peer answering late (a busy receiver acknowledges late): the faster end.
    rtt = {key: min(v) for key, v in conns.items()}
    ordered = sorted(rtt.values())
    typical = ordered[(len(ordered) - 1) // 4]
    threshold = max(SLOW_RTT_MS, SLOW_RTT_FACTOR * typical)
    slow = [key for key, ms in rtt.items() if ms >= threshold]

    def owners(keys: list[tuple[str, str]]) -> tuple[int, ...]:
        """The rank (or the two ranks) on nearly every one of ``keys``; () when none is, or
        too few were seen to call it a link."""
        if len(keys) < MIN_SLOW_CONNECTIONS and not any(len(conns[k]) == 2 for k in keys):
            return ()  # one connection seen from one end: that socket's moment, not a link
        on: Counter[int] = Counter(k for key in keys for k in pair[key])
        common = tuple(sorted(k for k, n in on.items() if n >= SLOW_LINK_OWNER * len(keys)))
        return common if len(common) <= 2 else ()  # more: slow everywhere

    common = owners(slow)
    if not common:
        # A second fault can slow other connections a little: a CPU hog on a rank's CPU
        # delays that rank's acknowledgements (its ring neighbours' round trips 2.8-3.1 ms
        # beside a delayed link's 21 ms, on the real job). The connections far slower than
        # the rest of the slow ones, with a rank in common, are still that rank's link.
        slow = _far_slower(slow, rtt)
        common = owners(slow)
    if not common:
        return None  # slow everywhere, or no rank in common: not one rank's link
    peers = sorted({k for key in slow for k in pair[key] if k not in common})
    slow_ms = statistics.median(rtt[key] for key in slow)
    return _SlowLinks(
        common, slow_ms, typical, len(slow), tuple(peers), _cpu_starved_end(rs, common, slow_ms)
    )


def _longest_cpu_wait_ms(r: _Rank) -> float:
    """The median over a rank's collectives of its longest wait for a CPU in each (ms)."""
    longest = [
        max((w.duration_ns for w in c.worst if w.cause == "cpu_wait"), default=0) / 1e6
        for c in r.ev.collectives
    ]
    return statistics.median(longest) if longest else 0.0


def _cpu_starved_end(rs: list[_Rank], ends: tuple[int, ...], slow_ms: float) -> str:
    """Why the slow round trips of ``ends``' connections are an end's waits for a CPU ("" when
    they are not).

    A round trip is timed by the kernel of the sender from its segment to the peer's
    acknowledgement. On a CPU a hog or a quota takes, the rank's softirqs run late (in
    ksoftirqd, which waits for the CPU like any task): it acknowledges late *and* takes its
    peers' acknowledgements late, so both ends of its links measure them slow. Found on the
    real job: a CPU hog on rank 2 made its link to rank 1 "2.1 ms against 0.12 ms" from both
    ends, and the verdict blamed the network for 70 % of the time beside the hog. A rank
    whose typical longest wait for a CPU in a collective is at least the slow round trip, and
    `SLOW_RTT_FACTOR` times the other ranks', explains them.
    """
    longest = {r.label: _longest_cpu_wait_ms(r) for r in rs}
    for end in ends:
        others = [ms for label, ms in longest.items() if label != end]
        typical = statistics.median(others) if others else 0.0
        if longest[end] >= slow_ms and longest[end] >= SLOW_RTT_FACTOR * typical:
            return (
                f"round trips of {slow_ms:.1f} ms on rank {end}'s connections are its waits "
                f"for a CPU (its longest in a collective {longest[end]:.1f} ms, median; other "
                f"ranks {typical:.1f} ms): a rank starved of CPU acknowledges late; not counted "
                "as slow network"
            )
    return ""


def _far_slower(
    slow: list[tuple[str, str]], rtt: Mapping[tuple[str, str], float]
) -> list[tuple[str, str]]:
    """Of the slow connections, those above the widest gap between two of their round trips
    when it is a factor of `SLOW_RTT_FACTOR` or more (else none)."""
    ordered = sorted(slow, key=lambda k: rtt[k])
    gaps = [(rtt[b] / rtt[a], i + 1) for i, (a, b) in enumerate(itertools.pairwise(ordered))]
    if not gaps:
        return []
    factor, cut = max(gaps)
    return ordered[cut:] if factor >= SLOW_RTT_FACTOR else []


def _latency_finding(seen: Comparison) -> Finding | None:
    """Collectives slowed by slow links, and whose links (module doc, 6)."""
    matches, rs, span, slow = seen.matches, seen.ranks, seen.span, seen.slow
    if slow is None or slow.starved:
        return None
    inside = _union_length(
        [(max(m.arrivals.values()), max(m.ends.values())) for m in matches if m.slow_link]
    )
    lost = inside * (1 - slow.typical_ms / slow.slow_ms)
    if lost < max(MIN_SECONDS, MIN_SHARE * span):
        return None
    by_label = {r.label: r for r in rs}

    def own(k: int) -> float:
        mine = [c.srtt_median_ms for c in by_label[k].ev.connections if c.samples]
        return statistics.median(mine) if mine else 0.0

    # One link: its two ends; the end whose own connections are slower.
    culprit = max(slow.ranks, key=lambda k: (own(k), -k))
    who = by_label[culprit]
    where = (
        f"the link between ranks {slow.ranks[0]} and {slow.ranks[1]}"
        if len(slow.ranks) == 2
        else f"{_name(who)}'s connections"
    )
    with_ranks = ", ".join(map(str, slow.peers)) or "unknown peers"
    detail = (
        f"round trips of {slow.slow_ms:.1f} ms on {where} against {slow.typical_ms:.2f} ms "
        f"typical ({slow.connections} slow connections; peers: ranks {with_ranks}): "
        "added latency, or a bandwidth cap queueing its packets"
    )
    summary = (
        f"slow network on {where} slowed the collectives by {_fmt_s(lost)} "
        f"({lost / span:.0%} of the {_fmt_s(span)} compared): round trips of "
        f"{slow.slow_ms:.1f} ms against {slow.typical_ms:.2f} ms"
    )
    return Finding(
        rank=culprit,
        host=who.ev.host,
        pid=who.ev.pid,
        kind="latency",
        seconds=lost,
        share=lost / span,
        causes=(CauseTime("network_latency", lost, detail),),
        summary=summary,
    )


def _throttled(quotas: Sequence[CpuQuota]) -> CpuQuota | None:
    """The rank's cgroup throttled most by its CPU quota in the window, or None."""
    hit = [q for q in quotas if q.throttled_periods and q.throttled_seconds > 0]
    return max(hit, key=lambda q: q.throttled_seconds) if hit else None


def _quota_detail(q: CpuQuota) -> str:
    return (
        f"cgroup {q.cgroup}: {q.throttled_periods} periods of {q.periods} throttled, "
        f"{_fmt_s(q.throttled_seconds)}; quota {q.quota_us / 1000:g} ms per "
        f"{q.period_us / 1000:g} ms"
    )


def _quota_instance(w: Instance, q: CpuQuota) -> Instance:
    """A wait for a CPU under a throttled quota: the quota's, not the task that ran."""
    return replace(w, cause="cpu_quota", detail=f"throttled: cgroup {q.cgroup}")


def _job_time(rs: list[_Rank], matches: list[_Match]) -> tuple[str, str]:
    """Where the job's time went when no rank held it back, and its largest part in words
    ("" each when the files show no steps or bytes).

    The parts of a step are the medians over the ranks of each rank's own medians (they
    overlap: GPU work runs beside the CPU's); waits for a CPU say who held the CPUs
    (`_job_holders`); the interrupt time on each rank's CPUs is said per rank
    (`_job_interrupts`: a storm on one rank's CPU slows every rank, and the median would
    hide it); what the collectives achieved for their bytes is the bytes a rank's sockets
    moved inside its collectives over the time the matched collectives took after their
    last rank arrived (the transfer itself, not the waiting).
    """
    said: list[str] = []
    first = ""
    splits = [r.ev.steps for r in rs if r.ev.steps.steps]
    if splits:
        step = statistics.median(x.step_seconds for x in splits)
        causes = [
            c for c in dict.fromkeys(p.cause for x in splits for p in x.parts) if c != "interrupts"
        ]
        medians = {
            c: statistics.median(
                next((p.seconds for p in x.parts if p.cause == c), 0.0) for x in splits
            )
            for c in causes
        }
        top = [
            (c, v)
            for c, v in sorted(medians.items(), key=lambda kv: -kv[1])
            if step and v >= JOB_PART_MIN * step
        ][:JOB_PARTS]
        if top:
            held = _job_holders(rs)
            words = [
                f"{STEP_PARTS.get(c) or CAUSES.get(c, c)} {_fmt_s(v)} ({v / step:.0%}"
                + (f"; {held})" if c == "cpu_wait" and held else ")")
                for c, v in top
            ]
            said.append(
                f"a step takes {_fmt_s(step)} (median over {len(splits)} ranks): "
                + ", ".join(words)
            )
            first = f"{STEP_PARTS.get(top[0][0]) or CAUSES.get(top[0][0], top[0][0])} " + (
                f"({top[0][1] / step:.0%} of a {_fmt_s(step)} step)"
            )
        stormed = _job_interrupts(rs, step)
        if stormed:
            said.append(stormed)
            first = f"{first}; {stormed}" if first else stormed
    moved = [r.ev.collective_net_bytes for r in rs if r.ev.collective_net_bytes]
    transfer = sum(max(0.0, max(m.ends.values()) - max(m.arrivals.values())) for m in matches)
    if moved and transfer > 0:
        per_rank = statistics.median(moved)
        said.append(
            f"its collectives moved {_fmt_bytes(per_rank)} per rank over TCP (median) in "
            f"{_fmt_s(transfer)} after their last rank arrived: {_fmt_bytes(per_rank / transfer)}/s"
        )
    return "; ".join(said), first


def _job_holders(rs: list[_Rank]) -> str:
    """Who held the ranks' CPUs while their threads waited for one, over every rank's
    run-ups: the job's own threads (its ranks' processes, each other's gloo threads among
    them) together, then the largest other tasks — a busy process beside the job, a
    storm's sender — each with its share of the waits ("" when the files name none)."""
    pids = {r.ev.pid for r in rs}
    held: dict[str, float] = defaultdict(float)
    for r in rs:
        for c in r.ev.collectives:
            for h in c.holders:
                own = _holder_pid(h.cause) in pids  # a holder's name is its cause
                held["the job's own threads" if own else h.cause] += h.seconds
    total = sum(held.values())
    if not total:
        return ""
    top = sorted(held.items(), key=lambda kv: -kv[1])[:JOB_HOLDERS]
    return "the CPUs held by " + ", ".join(f"{h} {s / total:.0%}" for h, s in top)


def _job_interrupts(rs: list[_Rank], step: float) -> str:
    """The ranks whose CPUs spent at least `JOB_PART_MIN` of a step in interrupts and
    softirqs (the fabric track's interrupt time, per step), the largest first; "" when
    none did, or the files have no interrupt time."""
    taken = sorted(
        (
            (took, _name(r))
            for r in rs
            if step and (took := _interrupts_a_step(r)) >= JOB_PART_MIN * step
        ),
        reverse=True,
    )[:JOB_PARTS]
    if not taken:
        return ""
    return ", ".join(
        f"{who}'s CPUs spent {_fmt_s(s)} a step ({s / step:.0%}) in interrupts and softirqs"
        for s, who in taken
    )


def _fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


#: The rules over the collectives themselves: time lost inside them (everyone waiting)
#: rather than to a rank that arrived late. Each is a function of the comparison that
#: returns its finding, or None when its cause did not slow the job; a new cause of slow
#: collectives (latency on a connection, a throttled CPU quota) is one more function here.
COLLECTIVE_RULES: tuple[Callable[[Comparison], Finding | None], ...] = (
    _network_finding,
    _latency_finding,
    _fabric_finding,
)


def _single_headline(rs: list[_Rank]) -> str:
    if not rs:
        return "no trace to compare"
    r = rs[0]
    split = r.ev.steps
    if len(rs) > 1:
        head = f"{len(rs)} processes, but fewer than two with collectives: nothing to compare"
    else:
        head = f"one rank ({_name(r)}): nothing to compare it with"
    if not split.steps:
        return head
    parts = ", ".join(
        f"{STEP_PARTS.get(p.cause) or CAUSES.get(p.cause, p.cause)} {_fmt_s(p.seconds)}"
        for p in split.parts
    )
    return f"{head}; a step takes {_fmt_s(split.step_seconds)} (median of {split.steps}): {parts}"


def _fmt_s(seconds: float) -> str:
    if abs(seconds) >= 1:
        return f"{seconds:.2f} s"
    if abs(seconds) >= 0.001:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def verdict_text(v: Verdict) -> str:
    """The verdict as the CLI prints it: the headline, then per finding its causes with the
    time each explains, the worst instances (``ts`` in the rank's file, to jump to in
    Perfetto), and the notes.
    """
    lines = [f"verdict: {v.headline}"]
    for f in v.stragglers:
        lines.append(
            ("  " + (f"rank {f.rank}" if f.rank >= 0 else f"pid {f.pid}"))
            + (f" on {f.host}" if f.host else "")
            + f" ({KIND_WORDS.get(f.kind, f.kind)}): "
            f"{_fmt_s(f.seconds)} lost, {f.share:.0%} of the {_fmt_s(v.compared_seconds)} compared"
        )
        width = max((len(CAUSES.get(c.cause, c.cause)) for c in f.causes), default=0)
        for c in f.causes:
            label = CAUSES.get(c.cause, c.cause)
            lines.append(
                f"    {label:<{width}}  {_fmt_s(c.seconds):>9}"
                + (f"  {c.detail}" if c.detail else "")
            )
        for w in f.worst:
            what = CAUSES.get(w.cause, w.cause)
            how_long = f" {_fmt_s(w.duration_ns / 1e9)}" if w.duration_ns else ""  # instants
            lines.append(
                f"    worst: {what}{how_long} at ts {w.ts_us:.3f}"
                + (f" ({w.detail})" if w.detail else "")
                + (f" in {w.path}" if w.path else "")
            )
    if v.ranks and v.matched:
        lines.append(
            f"  {v.matched} collectives matched; per rank: reached last / kept the others "
            "waiting / median lateness"
        )
        for t in v.ranks:
            who = f"rank {t.rank}" if t.rank >= 0 else f"pid {t.pid}"
            lines.append(
                f"    {who}: {t.last}/{t.collectives}, {_fmt_s(t.held_seconds)}, "
                f"{_fmt_s(t.lateness_seconds)}"
            )
    if v.job_time:
        lines.append(f"  where the job's time went: {v.job_time}")
    lines += [f"  note: {n}" for n in v.notes]
    return "\n".join(lines)
