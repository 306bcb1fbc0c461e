"""Retransmits to a rank that was not tracing yet are not counted as packet loss.

Whether a retransmit lost anything is told by its peer's file: a copy the peer dropped as
data it already had was not needed (a busy receiver acknowledges late; on a loaded machine
most retransmits are such). With windows that begin apart, as ``gputrace --job-id`` starts
them (each rank at its own poll, up to a second apart), a rank's retransmits before its
peer began tracing cannot be told: a healthy job traced so in the matrix was found
"slowed by network loss" on rank 2 (11 % of the compared time) on 10 retransmits, every one
to a rank not tracing then (and 38 others the peers' files showed were not needed).
"""

from __future__ import annotations

from dataclasses import replace

from test_verdict_kernel_causes import T0, one_way_loss

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import RankEvidence

#: Rank 3 began tracing at the 11th collective (they are 400 ms apart).
FIRST = 10


def late_start(job: list[RankEvidence]) -> list[RankEvidence]:
    """``job`` with rank 3's window starting just before its collective `FIRST`."""
    r3 = job[3]
    kept = r3.collectives[FIRST:]
    job[3] = replace(
        r3, collectives=kept, window_start_unix_ns=kept[0].arrival_unix_ns - 100_000_000
    )
    return job


def test_retransmits_to_a_rank_not_tracing_then_are_left_out() -> None:
    """Rank 1's packets to rank 3 lost on the wire at every other collective: 5 of its
    retransmits fell before rank 3 traced, 5 after. The 5 after name rank 1; the 5 before
    are said apart, and their collectives are not counted as slowed by loss."""
    [f] = compare(late_start(one_way_loss(1, 3))).stragglers
    assert (f.rank, f.kind) == (1, "network")
    # The 5 lossy collectives rank 3 traced, each 200 ms slower than the clean ones.
    assert round(f.seconds, 6) == 1.0
    assert f.causes[0].detail.startswith("5 TCP retransmits; rank 1 is on 5 of the 5")
    assert f.causes[0].detail.endswith(
        "; 5 more to ranks not tracing then (whether they had the data is unknown): not counted"
    )


def test_a_job_whose_only_retransmits_fell_before_the_peer_traced_has_no_loss() -> None:
    """Only the 5 retransmits before rank 3 traced (their collectives slower among the ranks
    that traced them), none after: nothing says a packet was lost."""
    job = late_start(one_way_loss(1, 3))
    after = T0 + FIRST * 400 * 1_000_000
    for r, ev in enumerate(job):
        job[r] = replace(
            ev,
            loss_events=tuple(e for e in ev.loss_events if e.unix_ns < after),
            collectives=tuple(
                c
                if c.arrival_unix_ns < after
                else replace(c, end_unix_ns=c.arrival_unix_ns + 5_000_000, loss_events=0)
                for c in ev.collectives
            ),
        )
    v = compare(job)
    assert all(f.kind != "network" for f in v.stragglers)
