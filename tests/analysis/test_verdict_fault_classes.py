"""The verdict on faults of the matrix (tests/bench/bench_verdict_matrix.py) beyond the
network and the CPU quota, on evidence whose answer is known: one rank with more work per
step on a CPU it shares with other ranks, an interrupt storm on a rank's CPU."""

from __future__ import annotations

import pytest

from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import CauseTime, CollectiveEvidence, RankEvidence

T0 = 1_800_000_000_000_000_000  # ns
STEP = 200  # ms between collectives
RANKS = 4
N = 20
LATE_MS = 40.0


def collective(
    i: int, arrival_ms: float, before: dict[str, float], holders: dict[str, float]
) -> CollectiveEvidence:
    return CollectiveEvidence(
        op="allreduce",
        source="gloo",
        group="gloo",
        index=i,
        step=i,
        size_bytes=4096,
        arrival_unix_ns=T0 + round(arrival_ms * 1e6),
        end_unix_ns=T0 + round((i * STEP + LATE_MS + 5) * 1e6),
        before=tuple(CauseTime(c, s) for c, s in before.items()),
        holders=tuple(CauseTime(h, s) for h, s in holders.items()),
    )


def job(late: int, late_before: dict[str, float], holders: dict[str, float]) -> list[RankEvidence]:
    """4 ranks (pids 100-103) on one host, N all-reduces STEP ms apart; rank ``late`` arrives
    LATE_MS after the others at each, its run-ups with ``late_before`` (seconds by cause) and
    CPU ``holders``; the others' run-ups: 30 ms on a CPU, 150 ms asleep."""
    out = []
    for r in range(RANKS):
        cs = [
            collective(
                i,
                i * STEP + (LATE_MS if r == late else 0.0),
                late_before if r == late else {"on_cpu": 0.030, "sleep": 0.150},
                holders if r == late else {},
            )
            for i in range(N)
        ]
        out.append(
            RankEvidence(
                path=f"/t/r{r}.json",
                host="node",
                pid=100 + r,
                rank=r,
                world_size=RANKS,
                window_start_unix_ns=cs[0].arrival_unix_ns - STEP * 1_000_000,
                window_end_unix_ns=cs[-1].end_unix_ns + STEP * 1_000_000,
                collectives=tuple(cs),
            )
        )
    return out


def test_more_work_on_a_shared_cpu_is_the_ranks_own_work() -> None:
    """Rank 1 runs 40 ms more per run-up and waits 50 ms more for its CPU, held half of that
    time by rank 0 (sharing its CPU), a quarter by its own gloo thread and a quarter by
    another process: its own work is the cause (the waits for rank 0 and itself with it),
    the outsider's share stays a wait for a CPU."""
    before = {"cpu_wait": 0.050, "on_cpu": 0.070, "sleep": 0.150}
    holders = {
        "python (pid 100)": 0.025,
        "gloo_tcp_loop (pid 101)": 0.0125,
        "cc1 (pid 999)": 0.0125,
    }
    v = compare(job(1, before, holders))
    [f] = v.stragglers
    assert (f.rank, f.kind) == (1, "late")
    lost = N * LATE_MS / 1000
    assert f.seconds == pytest.approx(lost)
    # on_cpu: 40 ms x 20 ran longer + 3/4 of 50 ms x 20 waited for rank 0 (capped at the time
    # lost); cpu_wait: the outsider's quarter, 250 ms.
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("on_cpu", lost),
        ("cpu_wait", 0.25),
    ]
    assert f.causes[0].detail == (
        "ran 800.0 ms longer than the other ranks; waited 750.0 ms for the CPU held by its own "
        "threads and rank 0"
    )
    assert f.causes[1].detail == (
        "the CPU was held by python (pid 100) 50%, gloo_tcp_loop (pid 101) 25%, cc1 (pid 999) 25%"
    )
    assert "its own work took longer" in f.summary


def test_waits_for_a_hog_stay_waits_for_a_cpu() -> None:
    """The same rank late with the same waits, held by a process outside the job, and no
    more work than the others: waiting for a CPU, the hog named."""
    before = {"cpu_wait": 0.050, "on_cpu": 0.030, "sleep": 0.150}
    v = compare(job(2, before, {"stress-hog (pid 999)": 0.05}))
    [f] = v.stragglers
    assert [c.cause for c in f.causes] == ["cpu_wait"]
    assert f.causes[0].detail == "the CPU was held by stress-hog (pid 999) 100%"


def test_more_work_without_waits_names_the_work() -> None:
    """A rank alone on its CPU that runs 40 ms longer per run-up."""
    v = compare(job(3, {"on_cpu": 0.070, "sleep": 0.150}, {}))
    [f] = v.stragglers
    assert [(c.cause, c.detail) for c in f.causes] == [
        ("on_cpu", "ran 800.0 ms longer than the other ranks")
    ]


def test_waits_for_ksoftirqd_are_interrupts() -> None:
    """An interrupt storm on rank 2's CPU: 20 ms of each run-up's interrupt time beyond the
    others', and 30 ms more waits for its CPU, two thirds held by that CPU's ksoftirqd (the
    softirq work the kernel could not do on the spot): interrupts, 600 + 400 ms of them."""
    before = {"interrupts": 0.020, "cpu_wait": 0.030, "on_cpu": 0.030, "sleep": 0.150}
    holders = {"ksoftirqd/1 (pid 22)": 0.020, "cc1 (pid 999)": 0.010}
    v = compare(job(2, before, holders))
    [f] = v.stragglers
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [
        ("interrupts", 0.8),  # 1.0 s, capped at the time lost
        ("cpu_wait", 0.2),
    ]
    assert f.causes[0].detail == "400.0 ms of it waiting for ksoftirqd (softirq work)"
