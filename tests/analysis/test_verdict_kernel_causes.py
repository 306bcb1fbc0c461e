"""The verdict's rules on what the kernel measured beyond arrivals: slow links (the net
track's TCP round trips), one-way loss (which end of a lossy connection retransmitted), and
CPU-quota throttling (the sched track's cgroup counters) — on evidence whose answer is known;
then the evidence read from a trace file holding those tracks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.analysis.verdict import compare
from bpfdyno.rpc.diagnosis import (
    CauseTime,
    CollectiveEvidence,
    ConnectionRtt,
    CpuQuota,
    Instance,
    LossEvent,
    RankEvidence,
)

T0 = 1_800_000_000_000_000_000  # ns
STEP = 200  # ms between collectives
RANKS = 4


def address(r: int, peer: int) -> str:
    """Rank r's end of its connection with ``peer`` (one connection per pair)."""
    return f"10.18.0.{10 + r}:{40000 + peer}"


def mesh(
    rtt_ms: dict[frozenset[int], float], only: set[int] | None = None
) -> dict[int, tuple[ConnectionRtt, ...]]:
    """Each rank's connections with every other rank, with the pair's round trip (0.05 ms
    when not given); ``only``: the ranks whose ends were sampled."""
    out: dict[int, tuple[ConnectionRtt, ...]] = {}
    for r in range(RANKS):
        conns = []
        for p in range(RANKS):
            if p == r:
                continue
            ms = rtt_ms.get(frozenset((r, p)), 0.05)
            conns.append(ConnectionRtt(address(r, p), address(p, r), ms, ms * 1.2, 30))
        out[r] = tuple(conns)
    return out


def collective(
    i: int, arrival_ms: float, end_ms: float, before: dict[str, float] | None = None,
    worst: tuple[Instance, ...] = (), loss: int = 0,
) -> CollectiveEvidence:  # fmt: skip
    return CollectiveEvidence(
        op="allreduce",
        source="gloo",
        group="gloo",
        index=i,
        step=i,
        size_bytes=4096,
        arrival_unix_ns=T0 + round(arrival_ms * 1e6),
        end_unix_ns=T0 + round(end_ms * 1e6),
        before=tuple(CauseTime(c, s) for c, s in (before or {}).items()),
        worst=worst,
        loss_events=loss,
    )


def rank(r: int, collectives: list[CollectiveEvidence], **kw: object) -> RankEvidence:
    return RankEvidence(
        path=f"/t/r{r}.json",
        host="node",
        pid=100 + r,
        rank=r,
        world_size=RANKS,
        window_start_unix_ns=collectives[0].arrival_unix_ns - STEP * 1_000_000,
        window_end_unix_ns=collectives[-1].end_unix_ns + STEP * 1_000_000,
        collectives=tuple(collectives),
        local_addresses=tuple(address(r, p) for p in range(RANKS) if p != r),
        **kw,  # type: ignore[arg-type]
    )


def slow_collectives_job(
    conns: dict[int, tuple[ConnectionRtt, ...]], late_rank: int = -1, n: int = 20
) -> list[RankEvidence]:
    """Every collective takes 120 ms from the last arrival (a slow link: everyone waits inside
    it); ``late_rank`` leaves each one 40 ms after the others and so arrives 40 ms late at
    the next (what the ring's last hop on a slow link does)."""
    out = []
    for r in range(RANKS):
        cs = []
        for i in range(n):
            late = 40.0 if r == late_rank and i > 0 else 0.0
            extra = 40.0 if r == late_rank else 0.0
            cs.append(collective(i, i * STEP + late, i * STEP + 40 + 120 + extra, {"lock": 0.1}))
        out.append(rank(r, cs, connections=conns[r]))
    return out


def test_a_slow_link_of_one_rank_names_that_rank() -> None:
    """Rank 2's connections take 20 ms a round trip, the others 0.05 ms: the collectives'
    time is the slow link's; rank 2, late only for the link's sake, is not a late straggler."""
    slow = {frozenset((2, p)): 20.0 for p in (0, 1, 3)}
    v = compare(slow_collectives_job(mesh(slow), late_rank=2))
    [f] = v.stragglers
    assert (f.rank, f.kind, f.pid) == (2, "latency", 102)
    assert f.causes[0].cause == "network_latency"
    # From the last arrival (rank 2's, 40 ms late but for the first) to the last completion
    # (rank 2's, 40 ms after the others): 200 ms in the first collective, 160 ms in the 19
    # others, each moment once; the share of it the slow round trips added.
    assert f.seconds == pytest.approx((0.200 + 19 * 0.160) * (1 - 0.05 / 20.0))
    assert f.share <= 1.0
    assert f.causes[0].detail.startswith(
        "round trips of 20.0 ms on rank 2 on node's connections against 0.05 ms typical "
        "(3 slow connections; peers: ranks 0, 1, 3)"
    )
    assert v.headline.startswith("slow network on rank 2 on node's connections slowed the")


def test_a_slow_link_seen_from_the_delayed_rank_s_end_only() -> None:
    """Of rank 1's connections only its own ends were sampled (its peers never called on
    those sockets in the window): they still name it."""
    slow = {frozenset((1, p)): 12.0 for p in (0, 2, 3)}
    conns = mesh(slow)
    for r in (0, 2, 3):
        conns[r] = tuple(c for c in conns[r] if not c.peer.startswith("10.18.0.11:"))
    [f] = compare(slow_collectives_job(conns)).stragglers
    assert (f.rank, f.kind) == (1, "latency")


def test_a_busy_receiver_is_no_slow_link() -> None:
    """Rank 2 starved of CPU acknowledges late: its peers' round trips to it are 4.7 ms, its
    own are fast (seen on the real job with a CPU hog). Not a link: no latency finding."""
    conns = mesh({})
    for r in (1, 3):
        conns[r] = tuple(
            ConnectionRtt(c.local, c.peer, 4.7, 10.0, 30) if c.peer == address(2, r) else c
            for c in conns[r]
        )
    v = compare(slow_collectives_job(conns))
    assert all(f.kind != "latency" for f in v.stragglers), v.headline


def test_a_slow_link_between_two_ranks_is_said_as_such() -> None:
    conns = mesh({frozenset((1, 3)): 8.0})
    [f] = compare(slow_collectives_job(conns)).stragglers
    assert f.kind == "latency" and f.rank in (1, 3)
    assert "the link between ranks 1 and 3" in f.causes[0].detail


@pytest.mark.parametrize("spread_ms", [0.3, 0.9])
def test_round_trips_of_a_healthy_lan_are_no_finding(spread_ms: float) -> None:
    """Round trips from 0.05 ms to ``spread_ms`` (a busy receiver's delayed ACK): below
    `SLOW_RTT_MS`, nothing is said of the links; the healthy job has no straggler."""
    rtt = {frozenset((a, b)): 0.05 + spread_ms * (a + b) / 5 for a in range(4) for b in range(a)}
    cs = mesh(rtt)
    job = [
        rank(r, [collective(i, i * STEP, i * STEP + 5) for i in range(20)], connections=cs[r])
        for r in range(RANKS)
    ]
    v = compare(job)
    assert v.within_noise and v.stragglers == ()


def test_slow_links_everywhere_name_no_rank() -> None:
    """Every connection slow alike: no one rank's link; not a straggler's."""
    slow = {frozenset((a, b)): 20.0 for a in range(4) for b in range(a)}
    v = compare(slow_collectives_job(mesh(slow)))
    assert all(f.kind != "latency" for f in v.stragglers)


def one_way_loss(sender: int, receiver: int) -> list[RankEvidence]:
    """Packets from ``sender`` to ``receiver`` lost on the wire: only the sender sees them
    (it retransmits); every other collective takes 200 ms more than it should."""
    out = []
    for r in range(RANKS):
        cs = []
        for i in range(20):
            lossy = i % 2 == 1
            end = i * 400 + 5 + (200 if lossy else 0)
            cs.append(collective(i, i * 400, end, loss=int(r == sender and lossy)))
        losses: tuple[LossEvent, ...] = ()
        if r == sender:
            losses = tuple(
                LossEvent("tcp_retransmit", 0.0, T0 + (i * 400 + 100) * 1_000_000,
                          address(sender, receiver), address(receiver, sender))
                for i in range(1, 20, 2)
            )  # fmt: skip
        out.append(rank(r, cs, loss_events=losses))
    return out


@pytest.mark.parametrize(("sender", "receiver"), [(1, 3), (3, 1)])
def test_one_way_loss_names_the_sender_of_the_lost_packets(sender: int, receiver: int) -> None:
    """Both ends are on every lossy connection (a tie): the end that retransmitted is named."""
    [f] = compare(one_way_loss(sender, receiver)).stragglers
    assert (f.rank, f.kind) == (sender, "network")
    assert f"as many on rank(s) {receiver}: the link between them" in f.causes[0].detail
    assert f"rank {sender}'s packets lost on the way (it retransmitted them)" in f.causes[0].detail


def throttled_job(quota: CpuQuota | None) -> list[RankEvidence]:
    """Rank 1 arrives 30 ms late at every collective, runnable for those 30 ms more than the
    others (its threads held off the CPU), with python of another rank on its CPU then."""
    held = Instance("cpu_wait", 5.0, T0, 88_000_000, "held by python (pid 100)", 101)
    out = []
    for r in range(RANKS):
        late = 30.0 if r == 1 else 0.0
        cs = [
            collective(i, i * STEP + late, i * STEP + 40, {"cpu_wait": 0.001 + late / 1e3},
                       (held,) if r == 1 and i == 4 else ())
            for i in range(20)
        ]  # fmt: skip
        out.append(rank(r, cs, cpu_quotas=(quota,) if quota and r == 1 else ()))
    return out


def test_a_rank_throttled_by_its_cpu_quota_is_named_so_and_no_one_else_is_blamed() -> None:
    quota = CpuQuota("/kubepods/pod7/rank1", 10000, 100000, 41, 39, 3.43)
    [f] = compare(throttled_job(quota)).stragglers
    assert (f.rank, f.kind) == (1, "late")
    assert [(c.cause, round(c.seconds, 6)) for c in f.causes] == [("cpu_quota", 0.6)]
    assert f.causes[0].detail == (
        "cgroup /kubepods/pod7/rank1: 39 periods of 41 throttled, 3.43 s; quota 10 ms per 100 ms"
    )
    assert [(w.cause, w.detail) for w in f.worst] == [
        ("cpu_quota", "throttled: cgroup /kubepods/pod7/rank1")
    ]
    assert "held by" not in f.summary and "python" not in f.summary
    assert "throttled by its CPU quota 600.0 ms (cgroup /kubepods/pod7/rank1" in f.summary


def test_without_throttling_the_wait_for_a_cpu_names_who_held_it() -> None:
    """The same lateness without a quota (or a quota never reached): a CPU wait."""
    for quota in (None, CpuQuota("/x", 50000, 100000, 41, 0, 0.0)):
        [f] = compare(throttled_job(quota)).stragglers
        assert f.causes[0].cause == "cpu_wait"


def test_the_evidence_reads_round_trips_and_quota_from_the_file(tmp_path: Path) -> None:
    """Per connection, the median and largest round trip of its samples in the window (the
    one written at the window's start counts, the one after it does not); the info slice's
    quota totals."""
    pid, base = 41, 1_700_000_000_000_000_000
    conn = "kernel net tcp: TCP 10.18.0.11:40000 -> 10.18.0.12:29500"

    def tcp(ts: float, srtt: float) -> dict[str, object]:
        return {"ph": "C", "cat": "bpfdyno.net", "name": conn, "pid": pid, "ts": ts,
                "args": {"srtt_ms": srtt, "rto_ms": 204.0, "cwnd": 10}}  # fmt: skip

    info = {
        "tracks": ["net", "sched"],
        "sched_cpu_quota": [{"cgroup": "/job/r1", "quota_us": 10000, "period_us": 100000,
                             "periods": 11, "throttled_periods": 10, "throttled_ms": 880.5}],
    }  # fmt: skip
    events = [
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "x",
         "ts": 1000.0, "dur": 1000.0},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": pid, "tid": 7,
         "ts": 1100.0, "dur": 100.0, "args": {}},
        {"ph": "X", "cat": "bpfdyno.info", "name": "bpfdyno kernel tracks", "pid": pid,
         "tid": 1000000001, "ts": 1000.0, "dur": 1000.0, "args": info},
        tcp(1000.0, 21.5), tcp(1300.0, 20.25), tcp(1600.0, 30.0), tcp(2500.0, 99.0),
        {"ph": "C", "cat": "bpfdyno.net", "name": "kernel net bytes", "pid": pid, "ts": 1200.0,
         "args": {"sent": 5, "received": 7}},
    ]  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"baseTimeNanoseconds": base, "traceEvents": events}))
    ev = summarize_file(str(path)).evidence
    assert ev is not None
    assert ev.connections == (ConnectionRtt("10.18.0.11:40000", "10.18.0.12:29500", 21.5, 30.0, 3),)
    assert ev.cpu_quotas == (CpuQuota("/job/r1", 10000, 100000, 11, 10, 0.8805),)


def ring(rtt_ms: dict[tuple[int, int], float]) -> dict[int, tuple[ConnectionRtt, ...]]:
    """Each rank's connections with its two ring neighbours; ``rtt_ms[(r, p)]``: the round
    trip r's end measured."""
    out: dict[int, list[ConnectionRtt]] = {r: [] for r in range(RANKS)}
    for (r, p), ms in rtt_ms.items():
        out[r].append(ConnectionRtt(address(r, p), address(p, r), ms, ms * 1.2, 400))
    return {r: tuple(c) for r, c in out.items()}


def test_a_slow_link_beside_a_cpu_hog_on_another_rank_names_the_link_s_rank() -> None:
    """The round trips of a matrix run (20 ms on rank 0's link, a CPU hog at nice -20 on
    rank 2's CPU): rank 0's two connections 20.7-22.6 ms; the hog delayed rank 2's
    acknowledgements, so its connection with rank 1 read 2.8-3.1 ms, slow too against the
    0.47 ms typical, and no rank was on nearly every slow connection: the link went unnamed.
    Far slower than the rest of the slow ones, rank 0's connections are its link."""
    conns = ring({
        (0, 1): 20.95, (1, 0): 22.55, (0, 3): 21.4, (3, 0): 20.67,
        (1, 2): 2.79, (2, 1): 3.09, (2, 3): 0.47, (3, 2): 3.12,
    })  # fmt: skip
    v = compare(slow_collectives_job(conns))
    [f] = [f for f in v.stragglers if f.kind == "latency"]
    assert (f.rank, f.causes[0].cause) == (0, "network_latency")
    assert f.causes[0].detail.startswith(
        "round trips of 20.8 ms on rank 0 on node's connections against 0.47 ms typical "
        "(2 slow connections; peers: ranks 1, 3)"
    )
    assert f.seconds == pytest.approx((0.160 * 19 + 0.160) * (1 - 0.47 / 20.81))


def test_slow_connections_without_a_wide_gap_name_no_link() -> None:
    """The same round trips with rank 0's connections at 8 ms: under `SLOW_RTT_FACTOR` times
    the hog's 2.8-3.1 ms, not far slower than the rest of the slow ones, and no rank is on
    nearly every slow connection: no link is named."""
    conns = ring({
        (0, 1): 8.0, (1, 0): 8.5, (0, 3): 8.2, (3, 0): 8.1,
        (1, 2): 2.79, (2, 1): 3.09, (2, 3): 0.47, (3, 2): 3.12,
    })  # fmt: skip
    v = compare(slow_collectives_job(conns))
    assert all(f.kind != "latency" for f in v.stragglers), v.headline
