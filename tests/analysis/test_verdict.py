"""The ranks compared (`bpfdyno.analysis.verdict.compare`) on evidence whose answer is known:
who arrived late and by how much, what its run-ups held, which connections lost packets."""

from __future__ import annotations

import dataclasses

import pytest

from bpfdyno.analysis.verdict import MIN_SHARE, compare, verdict_text
from bpfdyno.rpc.diagnosis import (
    CauseTime,
    CollectiveEvidence,
    Finding,
    Instance,
    LossEvent,
    RankEvidence,
    StepSplit,
    Verdict,
)
from bpfdyno.rpc.v1 import diagnosis_pb2
from bpfdyno.rpc.wire import from_pb, to_pb

T0 = 1_800_000_000_000_000_000  # ns
STEP = 100_000_000  # 100 ms between collectives


def collective(
    i: int,
    arrival_ms: float,
    end_ms: float,
    before: dict[str, float] | None = None,
    holders: dict[str, float] | None = None,
    worst: tuple[Instance, ...] = (),
    loss: int = 0,
    op: str = "allreduce",
) -> CollectiveEvidence:
    return CollectiveEvidence(
        op=op,
        source="gloo",
        group="gloo",
        index=i,
        step=i,
        size_bytes=4096,
        arrival_unix_ns=T0 + round(arrival_ms * 1e6),
        end_unix_ns=T0 + round(end_ms * 1e6),
        before=tuple(CauseTime(c, s) for c, s in (before or {}).items()),
        holders=tuple(CauseTime(h, s) for h, s in (holders or {}).items()),
        worst=worst,
        loss_events=loss,
    )


def rank(r: int, collectives: list[CollectiveEvidence], **kw: object) -> RankEvidence:
    """A rank's evidence; its window from 100 ms before its first collective to 100 ms after
    its last."""
    return RankEvidence(
        path=f"/t/r{r}.json",
        host="node",
        pid=100 + r,
        rank=r,
        world_size=4,
        window_start_unix_ns=collectives[0].arrival_unix_ns - STEP,
        window_end_unix_ns=collectives[-1].end_unix_ns + STEP,
        collectives=tuple(collectives),
        **kw,  # type: ignore[arg-type]
    )


def healthy(r: int, n: int = 20, jitter: float = 0.0) -> RankEvidence:
    """Arrives every 100 ms (± a jitter that alternates between ranks), 1 ms of waiting for
    a CPU in each run-up, collectives end 5 ms after the last arrival."""
    return rank(
        r,
        [
            collective(
                i,
                i * 100 + (jitter if (i + r) % 2 else -jitter),
                i * 100 + 30 + 5,
                {"cpu_wait": 0.001, "lock": 0.050},
            )
            for i in range(n)
        ],
    )


def test_a_rank_starved_of_cpu_is_named_with_who_held_it() -> None:
    late_ms = 30.0
    hog = Instance("cpu_wait", 1234.5, T0 + 5_000_000, 29_000_000, "held by hog (pid 9)", 9)
    slow = rank(
        2,
        [
            collective(
                i,
                i * 100 + late_ms,
                i * 100 + late_ms + 5,
                {"cpu_wait": 0.001 + late_ms / 1e3, "lock": 0.020},
                {"hog (pid 9)": 0.028, "kworker/1:0 (pid 30)": 0.001},
                (hog,) if i == 3 else (),
            )
            for i in range(20)
        ],
    )
    v = compare([healthy(0), healthy(1), slow, healthy(3)])
    assert not v.within_noise and v.matched == 20
    [f] = v.stragglers
    assert (f.rank, f.kind, f.pid) == (2, "late", 102)
    assert f.seconds == pytest.approx(20 * 0.030)
    assert f.causes[0].cause == "cpu_wait"
    assert f.causes[0].seconds == pytest.approx(20 * 0.030)
    assert f.causes[0].detail == "the CPU was held by hog (pid 9) 97%, kworker/1:0 (pid 30) 3%"
    assert f.worst == (dataclasses.replace(hog, path=slow.path),)  # said where it is
    assert v.headline.startswith(
        "rank 2 on node held the job back: the other ranks waited 600.0 ms"
    )
    timing = {t.rank: t for t in v.ranks}
    assert timing[2].last == 20 and timing[2].lateness_seconds == pytest.approx(0.030)
    assert timing[0].last == 0 and timing[0].held_seconds == 0


def test_a_rank_late_but_never_last_is_not_named_beside_the_one_always_last() -> None:
    """From a CI run: rank 2 hogged and last to all 19 collectives; rank 1, on a CPU with
    two other ranks, after their median in most collectives and up to 245 ms in a few, but
    before rank 2 in every one. Only rank 2 held the job back."""
    slow = rank(
        2,
        [
            collective(i, i * 100 + 60, i * 100 + 65, {"cpu_wait": 0.061, "lock": 0.020})
            for i in range(20)
        ],
    )
    behind = rank(
        1,
        [
            collective(
                i,
                i * 100 + (50 if i % 4 == 0 else 3),
                i * 100 + 65,
                {"cpu_wait": 0.001, "lock": 0.050 + (0.047 if i % 4 == 0 else 0.0)},
            )
            for i in range(20)
        ],
    )
    v = compare([healthy(0), behind, slow, healthy(3)])
    timing = {t.rank: t for t in v.ranks}
    assert (timing[1].last, timing[2].last) == (0, 20)
    assert timing[1].held_seconds >= MIN_SHARE * 20 * 0.1  # enough to be named, were it last
    assert [(f.rank, f.kind) for f in v.stragglers] == [(2, "late")]


def test_what_no_cause_explains_is_said() -> None:
    """Late by 30 ms with nothing more off-CPU than the others: unexplained (compute)."""
    slow = rank(
        1, [collective(i, i * 100 + 30, i * 100 + 35, {"cpu_wait": 0.001}) for i in range(20)]
    )
    [f] = compare([healthy(0), slow, healthy(2)]).stragglers
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [("unexplained", 0.6)]


def test_ranks_within_noise_have_no_straggler() -> None:
    """Each rank late by 0.5 ms every other collective: jitter, not a straggler."""
    v = compare([healthy(r, jitter=0.5) for r in range(4)])
    assert v.within_noise and v.stragglers == ()
    assert v.headline.startswith("no straggler: the ranks are within noise")


def test_a_rank_late_only_once_is_not_a_straggler() -> None:
    """One 300 ms hiccup of rank 1 in 20 collectives: 13 % of the time compared (above
    `MIN_SHARE`), but not consistent (one collective): no straggler. The others wait in
    collective 5, which completes 300 ms late on every rank; the job goes on from there."""

    def member(r: int) -> RankEvidence:
        cs = []
        for i in range(20):
            t = i * 100 + (300 if i > 5 else 0)
            arrival = t + (300 if r == 1 and i == 5 else 0)
            cs.append(collective(i, arrival, t + (300 if i == 5 else 0) + 35))
        return rank(r, cs)

    v = compare([member(0), member(1), member(2)])
    timing = {t.rank: t for t in v.ranks}
    assert timing[1].held_seconds == pytest.approx(0.3)
    assert timing[1].held_seconds / v.compared_seconds > MIN_SHARE
    assert v.within_noise and v.stragglers == ()


def test_windows_that_start_a_collective_apart_are_aligned() -> None:
    """Rank 1's trace began one collective later: matched by time, not by index."""
    slow = rank(
        1,
        [
            collective(i, (i + 1) * 100 + 30, (i + 1) * 100 + 35, {"file_io": 0.031})
            for i in range(19)
        ],
    )
    v = compare([healthy(0), slow, healthy(2)])
    assert v.matched == 20  # rank 0's 20 (rank 1 takes part in 19 of them)
    [f] = v.stragglers
    assert (f.rank, f.causes[0].cause) == (1, "file_io")


def on_host(ev: RankEvidence, host: str, clock_ahead_ns: int) -> RankEvidence:
    """The same evidence read on a host whose clock is ``clock_ahead_ns`` ahead."""
    return dataclasses.replace(
        ev,
        host=host,
        window_start_unix_ns=ev.window_start_unix_ns + clock_ahead_ns,
        window_end_unix_ns=ev.window_end_unix_ns + clock_ahead_ns,
        collectives=tuple(
            dataclasses.replace(
                c,
                arrival_unix_ns=c.arrival_unix_ns + clock_ahead_ns,
                end_unix_ns=c.end_unix_ns + clock_ahead_ns,
            )
            for c in ev.collectives
        ),
    )


def late_by_30ms(r: int) -> RankEvidence:
    return rank(
        r, [collective(i, i * 100 + 30, i * 100 + 35, {"cpu_wait": 0.031}) for i in range(20)]
    )


def test_clock_offsets_far_from_zero_are_applied_with_their_sign() -> None:
    """Rank 1's host clock is 7.25 s ahead, rank 2's (the straggler, 30 ms late) 12.5 s
    behind: with the offsets the fan-out measured, rank 2 is named for exactly its 600 ms;
    with either offset's sign wrong, no collective completes together and nothing is said
    about any rank."""
    ahead, behind = 7_250_000_000, -12_500_000_000
    ranks = [healthy(0), on_host(healthy(1), "a", ahead), on_host(late_by_30ms(2), "b", behind)]
    v = compare(ranks, {"node": 0, "a": -ahead, "b": -behind})
    [f] = v.stragglers
    assert (f.rank, f.host, f.seconds) == (2, "b", pytest.approx(0.6))
    assert v.matched == 20
    for wrong in ({"node": 0, "a": ahead, "b": -behind}, {"node": 0, "a": -ahead, "b": behind}):
        v = compare(ranks, wrong)
        assert v.stragglers == () and v.headline.startswith("not compared:")


def test_a_small_clock_offset_is_applied_with_its_sign() -> None:
    """Rank 1's host clock is 20 ms ahead (less than the collectives' spacing): unaligned it
    looks 20 ms late in every collective; aligned, the ranks are within noise; with the
    sign wrong it looks 40 ms late."""
    ranks = [healthy(0), on_host(healthy(1), "a", 20_000_000), healthy(2)]
    [f] = compare(ranks, {"node": 0}).stragglers
    assert f.rank == 1 and f.seconds == pytest.approx(20 * 0.020)
    assert compare(ranks, {"node": 0, "a": -20_000_000}).within_noise
    [f] = compare(ranks, {"node": 0, "a": 20_000_000}).stragglers
    assert f.rank == 1 and f.seconds == pytest.approx(20 * 0.040)


def test_packet_loss_names_the_rank_on_every_lossy_connection() -> None:
    """Collectives with retransmits take 40 ms longer; every lost packet's connection has
    rank 2 at one end."""
    addrs = {r: f"10.0.0.{r + 1}:4000{r}" for r in range(3)}

    def lossy(r: int) -> RankEvidence:
        cs = [
            collective(i, i * 100, i * 100 + (45 if i % 4 == 0 else 5), loss=int(i % 4 == 0))
            for i in range(20)
        ]
        events = tuple(
            LossEvent("tcp_retransmit", 1e6 + i, T0 + i, addrs[r], addrs[2])
            for i in range(5)
            if r != 2
        ) + tuple(
            LossEvent("tcp_retransmit", 1e6 + i, T0 + i, addrs[2], addrs[0])
            for i in range(3)
            if r == 2
        )
        return rank(r, cs, local_addresses=(addrs[r],), loss_events=events)

    v = compare([lossy(0), lossy(1), lossy(2)])
    [f] = v.stragglers
    assert (f.rank, f.kind) == (2, "network")
    assert f.seconds == pytest.approx(5 * 0.040)
    assert f.causes[0].cause == "network_loss"
    assert "13 TCP retransmits;" in f.causes[0].detail
    assert "rank 2 is on 13 of the 13 lost packets' connections (peers: ranks 0, 1)" in (
        f.causes[0].detail
    )
    assert (f.worst[0].ts_us, f.worst[0].path) == (1e6, "/t/r0.json")


def test_one_rank_is_not_compared() -> None:
    v = compare([healthy(0)])
    assert v.within_noise and v.matched == 0
    assert v.headline == "one rank (rank 0 on node): nothing to compare it with"


def test_the_verdict_travels_through_protobuf() -> None:
    slow = rank(
        2, [collective(i, i * 100 + 30, i * 100 + 35, {"cpu_wait": 0.031}) for i in range(20)]
    )
    v = compare([healthy(0), healthy(1), slow])
    msg = to_pb(v)
    assert isinstance(msg, diagnosis_pb2.Verdict)
    assert msg.stragglers[0].rank == 2 and msg.stragglers[0].causes[0].cause == "cpu_wait"
    assert from_pb(Verdict, msg) == v
    ev = from_pb(RankEvidence, to_pb(slow))
    assert ev == slow


def test_files_of_different_traces_are_not_compared() -> None:
    """Two files whose windows do not overlap: not one trace of one job."""
    later = healthy(1)
    shift = 3_600_000_000_000
    later = dataclasses.replace(
        later,
        window_start_unix_ns=later.window_start_unix_ns + shift,
        window_end_unix_ns=later.window_end_unix_ns + shift,
        collectives=tuple(
            dataclasses.replace(
                c, arrival_unix_ns=c.arrival_unix_ns + shift, end_unix_ns=c.end_unix_ns + shift
            )
            for c in later.collectives
        ),
    )
    v = compare([healthy(0), later])
    assert v.stragglers == () and v.matched == 0
    assert v.headline.startswith("not compared: the files' windows do not overlap in time")


def test_the_verdict_as_printed() -> None:
    hog = Instance("cpu_wait", 1234.5, T0 + 5_000_000, 29_000_000, "held by hog (pid 9)", 9)
    slow = rank(
        2,
        [
            collective(
                i, i * 100 + 30, i * 100 + 35, {"cpu_wait": 0.031}, {"hog (pid 9)": 0.03},
                (hog,) if i == 3 else (),
            )
            for i in range(20)
        ],
    )  # fmt: skip
    text = verdict_text(compare([healthy(0), healthy(1), slow]))
    assert text.splitlines() == [
        "verdict: rank 2 on node held the job back: the other ranks waited 600.0 ms for it "
        "(31% of the 1.94 s compared); why: waiting for a CPU 600.0 ms (the CPU was held by "
        "hog (pid 9) 100%)",
        "  rank 2 on node (late to collectives): 600.0 ms lost, 31% of the 1.94 s compared",
        "    waiting for a CPU   600.0 ms  the CPU was held by hog (pid 9) 100%",
        "    worst: waiting for a CPU 29.0 ms at ts 1234.500 (held by hog (pid 9)) in /t/r2.json",
        "  20 collectives matched; per rank: reached last / kept the others waiting / median "
        "lateness",
        "    rank 0: 0/20, 0 µs, -15.0 ms",
        "    rank 1: 0/20, 0 µs, -15.0 ms",
        "    rank 2: 20/20, 600.0 ms, 30.0 ms",
    ]


def test_a_rank_late_because_its_packets_were_lost_is_the_network_s() -> None:
    """Packets on the way to rank 1 are lost in 3 collectives of 4: rank 1 leaves each of
    them 40 ms after the others (waiting for the retransmit) and, its run-up as long as
    theirs, reaches the next one 40 ms late. Those 40 ms are the network's, not rank 1's."""
    addrs = {r: f"10.0.0.{r + 1}:4000{r}" for r in range(3)}
    lossy = [i % 4 != 3 for i in range(20)]
    late = [40.0 if i and lossy[i - 1] else 0.0 for i in range(20)]

    def sender(i: int) -> int:  # who retransmits to rank 1: ranks 0 and 2 in turn
        return 0 if i % 2 == 0 else 2

    def member(r: int) -> RankEvidence:
        cs = []
        for i in range(20):
            arrival = i * 100 + (late[i] if r == 1 else 0.0)
            end = i * 100 + late[i] + 5 + (40 if r == 1 and lossy[i] else 0)
            cs.append(collective(i, arrival, end, loss=int(lossy[i] and sender(i) == r)))
        events = tuple(
            LossEvent(
                "tcp_retransmit", 1e6 + i, T0 + (i * 100 + 30) * 1_000_000, addrs[r], addrs[1]
            )
            for i in range(20)
            if lossy[i] and sender(i) == r
        )
        return rank(r, cs, local_addresses=(addrs[r],), loss_events=events)

    v = compare([member(0), member(1), member(2)])
    [f] = v.stragglers
    assert (f.rank, f.kind) == (1, "network")
    assert f.seconds == pytest.approx(15 * 0.040)  # last completion 45 ms after, not 5
    timing = {t.rank: t for t in v.ranks}
    assert timing[1].lateness_seconds == pytest.approx(0.040)  # it did arrive late...
    assert timing[1].held_seconds == pytest.approx(0, abs=1e-9)  # ...for the network's sake


def test_retransmits_the_peer_did_not_need_are_no_loss() -> None:
    """Collectives with a retransmit from rank 0 to rank 1 take 60 ms longer. Where rank 1
    dropped the retransmitted data as a duplicate (it had it: the ACK was late), no packet
    was lost; only the other retransmits are loss."""
    addrs = {r: f"10.0.0.{r + 1}:4000{r}" for r in range(3)}
    slow = [i % 2 == 0 for i in range(20)]

    def at(i: int, ms: float) -> int:
        return T0 + round((i * 100 + ms) * 1e6)

    def sender(i: int) -> int:  # who retransmits to rank 1
        return 0 if (i // 4) % 2 == 0 else 2

    def member(r: int, spurious: set[int]) -> RankEvidence:
        mine = [i for i in range(20) if slow[i] and sender(i) == r]
        cs = [
            collective(i, i * 100, i * 100 + (65 if slow[i] else 5), loss=int(i in mine))
            for i in range(20)
        ]
        events = tuple(
            LossEvent("tcp_retransmit", 1e6 + i, at(i, 30), addrs[r], addrs[1]) for i in mine
        )
        if r == 1:  # the copies it dropped: it had the data
            events = tuple(
                LossEvent("duplicate", 2e6 + i, at(i, 30.2), addrs[1], addrs[sender(i)])
                for i in sorted(spurious)
            )
        return rank(r, cs, local_addresses=(addrs[r],), loss_events=events)

    half = {i for i in range(20) if i % 4 == 0}  # 5 of the 10 retransmits were not needed
    v = compare([member(r, half) for r in range(3)])
    [f] = v.stragglers
    assert (f.rank, f.kind) == (1, "network")
    assert f.seconds == pytest.approx(5 * 0.060)
    assert f.causes[0].detail == (
        "5 TCP retransmits; rank 1 is on 5 of the 5 lost packets' connections (peers: ranks 0, 2)"
        "; 5 more retransmit(s) were not needed (the peer had the data): not counted"
    )
    assert [w.start_unix_ns for w in f.worst] == [at(i, 30) for i in (2, 6, 10, 14, 18)]

    every = {i for i in range(20) if slow[i]}
    assert compare([member(r, every) for r in range(3)]).within_noise


def test_a_rank_late_by_half_the_spacing_is_matched_with_its_own_collective() -> None:
    """Rank 2 arrives 55 ms into a 100 ms spacing: as near the others' next collective as
    their own, but it completes with its own (at +60), never with the next one."""
    slow = rank(2, [collective(i, i * 100 + 55, i * 100 + 60) for i in range(20)])
    fast = [rank(r, [collective(i, i * 100, i * 100 + 60) for i in range(20)]) for r in (0, 1)]
    v = compare([*fast, slow])
    assert v.matched == 20
    [f] = v.stragglers
    assert (f.rank, f.kind) == (2, "late")
    assert f.seconds == pytest.approx(20 * 0.055)


def test_an_interval_in_two_run_ups_is_one_worst_instance() -> None:
    """A run-up starts at the previous arrival, so an interval during one collective is also
    in the next one's run-up: it is listed once."""
    hog = Instance("cpu_wait", 1234.5, T0 + 5_000_000, 29_000_000, "held by hog (pid 9)", 9)
    slow = rank(
        2,
        [
            collective(i, i * 100 + 30, i * 100 + 35, {"cpu_wait": 0.031}, worst=(hog,))
            for i in range(20)
        ],
    )
    [f] = compare([healthy(0), healthy(1), slow]).stragglers
    assert f.worst == (dataclasses.replace(hog, path=slow.path),)  # said where it is


def test_the_first_cause_s_worst_instances_come_first() -> None:
    """Late by 30 ms reading, plus a little waiting for a CPU once for longer than any read:
    the reads are listed first."""
    read = Instance("io_wait", 100.0, T0 + 100_000, 30_000_000, "read", 7)
    wait = Instance("cpu_wait", 200.0, T0 + 200_000, 80_000_000, "held by x (pid 8)", 7)
    slow = rank(
        1,
        [
            collective(
                i,
                i * 100 + 30,
                i * 100 + 35,
                {"io_wait": 0.030, "cpu_wait": 0.001 + (0.080 if i == 5 else 0.0)},
                worst=(read,) if i != 5 else (read, wait),
            )
            for i in range(20)
        ],
    )
    [f] = compare([healthy(0), slow, healthy(2)]).stragglers
    assert [c.cause for c in f.causes] == ["io_wait", "cpu_wait"]
    assert f.worst == tuple(dataclasses.replace(w, path="/t/r1.json") for w in (read, wait))


def test_fabric_congestion_names_the_rank_whose_ports_counted_it() -> None:
    """Every other collective 40 ms slower while rank 3's RDMA port counted CNPs and a few
    errors (the fabric track); the others' fabric was quiet."""

    def node(r: int) -> RankEvidence:
        cs = [
            dataclasses.replace(
                collective(i, i * 100, i * 100 + (45 if i % 2 == 0 else 5)),
                fabric_congestion=120 if (r == 3 and i % 2 == 0) else 0,
                fabric_errors=2 if (r == 3 and i % 2 == 0) else 0,
            )
            for i in range(20)
        ]
        return dataclasses.replace(rank(r, cs), fabric_devices=(f"rdma mlx5_{r}:1",))

    v = compare([node(r) for r in range(4)])
    [f] = v.stragglers
    assert (f.rank, f.kind) == (3, "fabric")
    assert f.seconds == pytest.approx(10 * 0.040)
    assert [c.cause for c in f.causes] == ["fabric"]
    assert f.causes[0].detail == (
        "20 errors or drops and 1200 congestion signals (CNPs, ECN marks, transmit waits, "
        "pause frames) on rdma mlx5_3:1"
    )
    assert "  rank 3 on node (fabric): 400.0 ms lost" in verdict_text(v)


def test_interrupt_time_in_the_run_up_is_a_cause() -> None:
    slow = rank(
        1,
        [collective(i, i * 100 + 20, i * 100 + 25, {"interrupts": 0.019}) for i in range(20)],
    )
    [f] = compare([healthy(0), slow, healthy(2)]).stragglers
    assert (f.rank, f.causes[0].cause) == (1, "interrupts")
    assert f.causes[0].seconds == pytest.approx(20 * 0.019)


def window_of(
    r: int, first: int, n: int, late_ms: float = 0.0, jitter: float = 0.0
) -> RankEvidence:
    """Rank ``r`` traced collectives ``first`` to ``first + n - 1`` of a job whose collectives
    complete every 100 ms on every rank; it arrives ``late_ms`` late (± ``jitter``)."""
    cs = []
    for i in range(first, first + n):
        noise = jitter if (i + r) % 2 else -jitter
        cs.append(collective(i, i * 100 + late_ms + noise, i * 100 + 35, {"cpu_wait": 0.001}))
    return rank(r, cs)


@pytest.mark.parametrize("shift", [4, 10, 20])
def test_windows_shifted_by_many_collectives_are_paired_by_completion(shift: int) -> None:
    """Ranks 1 and 3 began tracing ``shift`` collectives after ranks 0 and 2 (30 each); rank 2
    is 30 ms late to every one: named, for exactly its 30 collectives, whatever the shift."""
    v = compare(
        [
            window_of(0, 0, 30),
            window_of(1, shift, 30),
            window_of(2, 0, 30, 30),
            window_of(3, shift, 30),
        ]
    )
    assert v.matched == 30 + shift
    [f] = v.stragglers
    assert (f.rank, f.kind) == (2, "late")
    assert f.seconds == pytest.approx(30 * 0.030)
    assert all(t.held_seconds <= v.compared_seconds for t in v.ranks)


@pytest.mark.parametrize("shift", [4, 10, 20])
def test_healthy_ranks_with_shifted_windows_have_no_straggler(shift: int) -> None:
    v = compare([window_of(r, shift * (r % 2), 30, jitter=0.5) for r in range(4)])
    assert v.within_noise and v.stragglers == ()
    assert max(t.held_seconds for t in v.ranks) <= 0.030 * v.compared_seconds


def test_healthy_ranks_traced_one_second_apart_have_no_straggler() -> None:
    """Two `gputrace` commands 1 s apart: ranks 0 and 1 trace 3.64 s from 0, ranks 2 and 3
    the same length from 1 s (10 collectives) later. No rank held the job back, and no
    rank's time can exceed the time compared."""
    v = compare([window_of(r, 10 * (r // 2), 35, jitter=0.5) for r in range(4)])
    assert v.within_noise and v.stragglers == ()
    assert v.matched == 45
    assert v.compared_seconds == pytest.approx(4.4355)  # 0.5 ms of jitter at the start
    assert all(0 <= t.held_seconds <= 0.005 * 45 for t in v.ranks)
    assert "overlap 2.63 s of 3.63 s" in " ".join(v.notes)


@pytest.mark.parametrize(("late_ms", "named"), [(8.0, False), (12.0, True)])
def test_the_share_threshold(late_ms: float, named: bool) -> None:
    """Late to every collective (consistently): by 8 ms in 100 it holds the job back 8 % of
    the time, under `MIN_SHARE` (10 %): within noise; by 12 ms, 12 %: a straggler."""
    v = compare([window_of(0, 0, 20), window_of(1, 0, 20, late_ms), window_of(2, 0, 20)])
    share = {t.rank: t.held_seconds for t in v.ranks}[1] / v.compared_seconds
    assert (share < MIN_SHARE) is not named
    assert [f.rank for f in v.stragglers] == ([1] if named else [])


def test_too_little_overlap_is_said_not_guessed() -> None:
    """Rank 1 began tracing 17 collectives after rank 0: their windows share 405 ms of
    2.105 s (rank 1's, the shorter), too little to tell a late rank from windows that began
    apart."""
    v = compare([window_of(0, 0, 20), window_of(1, 17, 20, 30)])
    assert v.stragglers == () and v.within_noise
    assert v.headline.startswith("not compared: too little overlap: 405.0 ms of 2.10 s")


def test_time_waited_in_two_groups_at_once_counts_once() -> None:
    """Two process groups run their collectives at the same moments; rank 1 reaches both 30
    ms late: the others waited 600 ms (20 x 30 ms), not 1.2 s, whatever the groups."""

    def two_groups(r: int, late_ms: float) -> RankEvidence:
        cs = [collective(i, i * 100 + late_ms, i * 100 + 35) for i in range(20)]
        other = [dataclasses.replace(c, group="second") for c in cs]
        return rank(r, sorted([*cs, *other], key=lambda c: c.arrival_unix_ns))

    v = compare([two_groups(0, 0), two_groups(1, 30), two_groups(2, 0)])
    assert v.matched == 40
    [f] = v.stragglers
    assert f.rank == 1 and f.seconds == pytest.approx(0.6) and f.share <= 1


def test_when_every_rank_is_slowed_alike_the_job_s_time_is_said() -> None:
    """Each collective takes 250 ms after every rank arrived together (a slow network for
    all): no straggler, but where the time went — 89 % of a 280 ms step in collectives —
    and what the collectives achieved for their bytes: 4 MiB per rank in 20 x 250 ms."""
    split = StepSplit(
        steps=20,
        step_seconds=0.280,
        parts=(
            CauseTime("collectives", 0.250),
            CauseTime("on_cpu", 0.025),
            CauseTime("data_loader", 0.004),  # under 5 % of the step: not said
        ),
    )

    def member(r: int) -> RankEvidence:
        cs = [collective(i, i * 280, i * 280 + 250) for i in range(20)]
        return dataclasses.replace(rank(r, cs), steps=split, collective_net_bytes=4 << 20)

    v = compare([member(r) for r in range(4)])
    assert v.within_noise and v.stragglers == ()
    assert v.headline.endswith("; where the time went: in collectives (89% of a 280.0 ms step)")
    assert v.job_time == (
        "a step takes 280.0 ms (median over 4 ranks): in collectives 250.0 ms (89%), "
        "main thread on a CPU 25.0 ms (9%); its collectives moved 4.0 MiB per rank over TCP "
        "(median) in 5.00 s after their last rank arrived: 819.2 KiB/s"
    )
    assert "  where the job's time went: a step takes 280.0 ms" in verdict_text(v)
    assert from_pb(Verdict, to_pb(v)) == v


def test_a_straggler_verdict_says_no_job_time() -> None:
    slow = rank(2, [collective(i, i * 100 + 30, i * 100 + 35) for i in range(20)])
    v = compare([healthy(0), healthy(1), slow])
    assert v.stragglers and v.job_time == ""


def test_a_new_cause_is_one_more_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extension points: a rule over the collectives returns its finding, a cause's
    detail is a function of the late rank; both are used as they are listed."""
    from bpfdyno.analysis import verdict

    def slow_link(seen: verdict.Comparison) -> Finding | None:
        return Finding(1, "node", 101, "latency", 0.1 * seen.span, 0.1, summary="slow link")

    monkeypatch.setattr(verdict, "COLLECTIVE_RULES", (*verdict.COLLECTIVE_RULES, slow_link))
    monkeypatch.setitem(verdict.CAUSE_DETAILS, "cpu_wait", lambda c: f"rank {c.rank.label}")
    v = compare([healthy(0), healthy(1), late_by_30ms(2)])
    assert [(f.rank, f.kind) for f in v.stragglers] == [(2, "late"), (1, "latency")]
    assert v.stragglers[0].causes[0].detail == "rank 2"
    assert v.headline.endswith("; slow link")


def test_a_short_window_inside_a_long_one_is_compared() -> None:
    """Rank 1 traced collectives 10-17 of rank 0's 40 (and was 60 ms late to each): its
    window lies inside rank 0's, so all of it is compared, whatever rank 0's length."""
    v = compare([window_of(0, 0, 40), window_of(1, 10, 8, 60), window_of(2, 0, 40)])
    assert not v.headline.startswith("not compared")
    [f] = v.stragglers
    assert f.rank == 1 and f.seconds == pytest.approx(8 * 0.060)
