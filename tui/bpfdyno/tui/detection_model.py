"""The detection's events as the UI shows them: which ranks stand out now, and the words of
each event. Pure, no I/O (docs/detection.md).

An agent holds its events oldest first; the state of a rank is its latest event: suspected or
confirmed until a "cleared" follows, hung until the job's ranks stand out or clear again (a
hang has no event of its own when the job moves on). A hang whose hung rank is on another
node names rank -1: the job, not a rank, is marked. A "traced" event (the automatic trace a
confirmation started has ended) does not change a rank's state: it adds the trace's verdict to
the rank's standing flag.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bpfdyno.rpc.detection import DetectionEvent, DetectionKind

#: Kinds that leave a rank marked.
STANDING = (DetectionKind.SUSPECTED, DetectionKind.CONFIRMED, DetectionKind.HANG)
#: Colours by kind.
KIND_STYLE = {
    DetectionKind.SUSPECTED: "bold yellow",
    DetectionKind.CONFIRMED: "bold red",
    DetectionKind.HANG: "bold red",
    DetectionKind.CLEARED: "green",
    DetectionKind.TRACED: "bold cyan",
}
#: Ranks a hang event names when the hung rank is not on the event's node.
NO_RANK = -1


@dataclass(frozen=True, slots=True)
class RankFlag:
    """A rank that stands out now, by the latest event about it."""

    event: DetectionEvent
    #: The ``traced`` event of the automatic trace this flag's confirmation started, once
    #: it ended (its verdict), else None.
    traced: DetectionEvent | None = None

    @property
    def marker(self) -> str:
        """A short word for its row: ``SUSPECTED``, ``CONFIRMED``, ``HUNG stopped``..."""
        e = self.event
        if e.kind is DetectionKind.HANG:
            return "HUNG"
        return str(e.kind.value).upper()

    @property
    def style(self) -> str:
        """Its row's colour."""
        return KIND_STYLE.get(self.event.kind, "")

    @property
    def reason(self) -> str:
        """Why, in one line: the event's evidence beside the job's median, or the hang; and
        the automatic trace's verdict once there is one."""
        why = event_reason(self.event)
        if self.traced is None:
            return why
        return f"{why} · {traced_line(self.traced)}"


def flagged(events: Iterable[DetectionEvent]) -> dict[tuple[str, str, int], RankFlag]:
    """(host, job id, rank) of every rank (or hung job: rank -1) that stands out now.

    ``events`` are in the order an agent holds them (oldest first); several agents' lists may
    be given one after the other (their hosts differ).
    """
    latest: dict[tuple[str, str, int], DetectionEvent] = {}
    traced: dict[tuple[str, str, int], DetectionEvent] = {}
    for e in events:
        key = (e.host, e.job_id, e.rank)
        if e.kind is DetectionKind.TRACED:
            # The verdict of a confirmation's trace: the rank's state is unchanged. A trace
            # that ended after its rank cleared marks nothing.
            if key in latest and latest[key].kind is DetectionKind.CONFIRMED:
                traced[key] = e
            continue
        traced.pop(key, None)
        if e.kind is not DetectionKind.HANG:
            # A straggler event says the job moves: a hang noted before is over.
            over = [
                k for k, v in latest.items() if k[:2] == key[:2] and v.kind is DetectionKind.HANG
            ]
            for k in over:
                del latest[k]
        latest[key] = e
    return {k: RankFlag(e, traced.get(k)) for k, e in latest.items() if e.kind in STANDING}


def flags_by_pid(flags: dict[tuple[str, str, int], RankFlag]) -> dict[int, RankFlag]:
    """The flags of one agent's ranks by pid (a hung job's event names the hung rank's)."""
    return {f.event.pid: f for f in flags.values() if f.event.rank != NO_RANK and f.event.pid}


def event_reason(e: DetectionEvent) -> str:
    """The evidence of an event in one line (a hang: the state and the rank's main thread)."""
    if e.kind is DetectionKind.HANG:
        what = e.hang_state or "hung"
        if e.threads:
            t = e.threads[0]
            doing = t.syscall + (f" on a {t.waiting_on}" if t.waiting_on else "")
            what += f": tid {t.tid} {t.comm} {t.state} {doing or '-'} wchan {t.wchan or '-'}"
        return what
    if e.kind is DetectionKind.CLEARED or not e.evidence:
        return e.summary
    return "; ".join(
        f"{ev.name} {ev.value:.2f} vs job median {ev.job_median:.2f}" for ev in e.evidence
    )


def traced_line(e: DetectionEvent) -> str:
    """A ``traced`` event in a few words: its trace's verdict, or why there is none."""
    if e.verdict is not None:
        return f"traced {e.trace_id}: {e.verdict.headline}"
    return e.summary


def event_time(unix_seconds: float) -> str:
    """Local ``HH:MM:SS`` of an event."""
    return time.strftime("%H:%M:%S", time.localtime(unix_seconds))


def rank_text(rank: int) -> str:
    """A rank's number, or ``-`` for a hung job whose hung rank is on another node."""
    return "-" if rank == NO_RANK else str(rank)


def event_cells(e: DetectionEvent) -> Sequence[str]:
    """An event's cells, in `DETECTION_COLUMNS` order (see the Detection tab)."""
    return [
        event_time(e.unix_seconds),
        e.kind.value,
        e.job_id,
        rank_text(e.rank),
        e.host,
        str(e.pid) if e.pid else "-",
        event_reason(e),
    ]


def event_detail(e: DetectionEvent) -> str:
    """Everything about one event: its summary, each piece of evidence, a hang's threads."""
    lines = [f"{event_time(e.unix_seconds)} {e.host} {e.kind.value.upper()}: {e.summary}"]
    for ev in e.evidence:
        lines.append(f"  {ev.name} {ev.value:.3f} (job median {ev.job_median:.3f})")
    for t in e.threads:
        doing = t.syscall + (f" on a {t.waiting_on}" if t.waiting_on else "")
        lines.append(
            f"  tid {t.tid} {t.comm} {t.state} {doing or '-'} wchan {t.wchan or '-'}"
            f" off-CPU {t.offcpu_seconds:.0f} s, CPU share {t.oncpu_share:.2f}"
        )
    lines += [f"  file {path}" for path in e.trace_files]
    if e.verdict_text:
        lines += ["  " + line for line in e.verdict_text.splitlines()]
    return "\n".join(lines)


def flag_line(flag: RankFlag) -> str:
    """One standing rank, for a summary: ``job 7 rank 3 on node-b CONFIRMED: ...``."""
    e = flag.event
    who = f"job {e.job_id} rank {rank_text(e.rank)}"
    return f"{who} on {e.host} {flag.marker}: {flag.reason}"


def summary_line(flags: dict[tuple[str, str, int], RankFlag], events: int) -> str:
    """The Detection tab's first line."""
    if not flags:
        return f"no rank stands out · {events} event(s) held"
    return f"{len(flags)} rank(s) stand out · {events} event(s) held"
