"""Which ranks the UI marks, from the events an agent holds (oldest first), and their words."""

from __future__ import annotations

from bpfdyno.rpc.detection import DetectionEvent, DetectionKind, SignalEvidence, ThreadReport
from bpfdyno.rpc.diagnosis import Verdict
from bpfdyno.tui.detection_model import (
    event_cells,
    event_detail,
    event_reason,
    flag_line,
    flagged,
    flags_by_pid,
)

K = DetectionKind


def ev(kind: DetectionKind, rank: int, t: float, host: str = "n1", pid: int = 0) -> DetectionEvent:
    return DetectionEvent(
        kind=kind,
        job_id="7",
        rank=rank,
        pid=pid or 100 + rank,
        host=host,
        unix_seconds=t,
        summary=f"job 7 rank {rank} {kind.value}",
        evidence=(SignalEvidence("cpu_wait_share", 1.234, 0.05),) if kind is not K.HANG else (),
    )


def test_a_rank_stands_out_from_suspected_until_cleared() -> None:
    assert {k: f.marker for k, f in flagged([ev(K.SUSPECTED, 3, 1)]).items()} == {
        ("n1", "7", 3): "SUSPECTED"
    }
    events = [ev(K.SUSPECTED, 3, 1), ev(K.CONFIRMED, 3, 2)]
    assert {k: f.marker for k, f in flagged(events).items()} == {("n1", "7", 3): "CONFIRMED"}
    assert flagged([*events, ev(K.CLEARED, 3, 3)]) == {}
    # Suspected again after a clear: marked again.
    again = [*events, ev(K.CLEARED, 3, 3), ev(K.SUSPECTED, 3, 4)]
    assert [f.marker for f in flagged(again).values()] == ["SUSPECTED"]


def test_ranks_of_several_nodes_are_told_apart_by_host() -> None:
    events = [ev(K.CONFIRMED, 1, 1, host="n1"), ev(K.SUSPECTED, 1, 2, host="n2")]
    flags = flagged(events)
    assert {k: f.marker for k, f in flags.items()} == {
        ("n1", "7", 1): "CONFIRMED",
        ("n2", "7", 1): "SUSPECTED",
    }
    assert {pid: f.marker for pid, f in flags_by_pid(flags).items()} == {101: "SUSPECTED"}


def test_a_hang_marks_its_rank_until_the_job_s_ranks_are_judged_again() -> None:
    hang = DetectionEvent(
        kind=K.HANG,
        job_id="7",
        rank=1,
        pid=101,
        host="n1",
        unix_seconds=5,
        summary="job 7 hangs: rank 1 stopped",
        hang_state="stopped",
        threads=(ThreadReport(101, "python", "T", "read", "do_signal_stop", "pipe", 31.0, 0.0),),
    )
    (flag,) = flagged([hang]).values()
    assert flag.marker == "HUNG"
    assert flag.reason == "stopped: tid 101 python T read on a pipe wchan do_signal_stop"
    # A straggler event of the same job says it moves again.
    assert list(flagged([hang, ev(K.SUSPECTED, 2, 6)])) == [("n1", "7", 2)]
    # A hang whose rank is on another node marks the job (rank -1), no pid's row.
    elsewhere = DetectionEvent(K.HANG, "7", -1, 0, "n1", 5, "job 7 hangs", hang_state="waiting")
    assert flags_by_pid(flagged([elsewhere])) == {}
    assert event_cells(elsewhere)[3:6] == ["-", "n1", "-"]


def test_an_event_s_cells_and_line_carry_its_evidence() -> None:
    e = ev(K.CONFIRMED, 3, 0)
    cells = event_cells(e)
    assert cells[1:] == [
        "confirmed",
        "7",
        "3",
        "n1",
        "103",
        "cpu_wait_share 1.23 vs job median 0.05",
    ]
    assert event_reason(ev(K.CLEARED, 3, 0)) == "job 7 rank 3 cleared"
    (flag,) = flagged([e]).values()
    assert flag_line(flag) == "job 7 rank 3 on n1 CONFIRMED: cpu_wait_share 1.23 vs job median 0.05"


TRACES = "/var/lib/bpfdyno/traces"


def traced(rank: int, t: float, headline: str | None) -> DetectionEvent:
    """The ``traced`` event of rank ``rank``'s confirmation (no verdict: nothing written)."""
    if headline is None:
        return DetectionEvent(
            K.TRACED, "7", rank, 100 + rank, "n1", t,
            summary=f"job 7 rank {rank}: automatic trace auto-1: no file written, no verdict: gone",
            trace_id="auto-1",
        )  # fmt: skip
    return DetectionEvent(
        K.TRACED, "7", rank, 100 + rank, "n1", t,
        summary=f"job 7 rank {rank}: automatic trace auto-1 of 2 rank(s) on this node",
        trace_id="auto-1",
        trace_files=(f"{TRACES}/auto-1_101.json", f"{TRACES}/auto-1_103.json"),
        verdict_text=f"verdict: {headline}\n  why: waiting for a CPU 2.10 s",
        verdict=Verdict(headline=headline, within_noise=False),
    )  # fmt: skip


def test_a_traced_verdict_stays_with_its_confirmed_rank() -> None:
    confirmed = [ev(K.SUSPECTED, 3, 1), ev(K.CONFIRMED, 3, 2)]
    head = "rank 3 on n1 held the job back: the other ranks waited 2.10 s for it (21%)"
    flags = flagged([*confirmed, traced(3, 3, head)])
    # The trace's end does not clear the rank: it is still confirmed, now with the verdict.
    assert {k: f.marker for k, f in flags.items()} == {("n1", "7", 3): "CONFIRMED"}
    (flag,) = flags.values()
    assert flag.reason == f"cpu_wait_share 1.23 vs job median 0.05 · traced auto-1: {head}"
    assert flag_line(flag) == f"job 7 rank 3 on n1 CONFIRMED: {flag.reason}"
    # A trace that wrote nothing says why.
    (empty,) = flagged([*confirmed, traced(3, 3, None)]).values()
    assert empty.reason.endswith("no file written, no verdict: gone")
    # Cleared after the trace: nothing stands out; suspected again: the old verdict is gone.
    assert flagged([*confirmed, traced(3, 3, head), ev(K.CLEARED, 3, 4)]) == {}
    (again,) = flagged([*confirmed, traced(3, 3, head), ev(K.SUSPECTED, 3, 5)]).values()
    assert (again.marker, again.traced) == ("SUSPECTED", None)
    # A trace that ended after its rank cleared marks nothing.
    assert flagged([*confirmed, ev(K.CLEARED, 3, 4), traced(3, 5, head)]) == {}


def test_a_traced_event_s_detail_lists_its_files_and_verdict() -> None:
    head = "rank 3 on n1 held the job back"
    detail = event_detail(traced(3, 0, head)).splitlines()
    assert detail[1:] == [
        "  file /var/lib/bpfdyno/traces/auto-1_101.json",
        "  file /var/lib/bpfdyno/traces/auto-1_103.json",
        f"  verdict: {head}",
        "    why: waiting for a CPU 2.10 s",
    ]
