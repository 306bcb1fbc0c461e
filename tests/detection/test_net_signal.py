"""The network scores: a rank's connections over an interval (`LinkSampler`) and the job's
links joined into per-rank scores (`link_scores`), with exact values."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import replace

import pytest

from bpfdyno.detection.detector import SCORES
from bpfdyno.detection.net_signal import LinkSampler, LinkScores, link_scores
from bpfdyno.detection.outliers import outliers
from bpfdyno.rpc.detection import NetLink
from bpfdyno.sources.net.decode import TcpConnection

NAN = float("nan")


def conn(
    pid: int,
    local: str,
    remote: str,
    sport: int = 40000,
    dport: int = 50000,
    tx: int = 0,
    rx: int = 0,
    retx: int = 0,
    srtt: float = NAN,
    state: str = "ESTABLISHED",
) -> TcpConnection:
    return TcpConnection(
        pid=pid, comm="python", family="ipv4", saddr=local, sport=sport, daddr=remote,
        dport=dport, state=state, tx_bytes=tx, rx_bytes=rx, retransmits=retx, srtt_s=srtt,
        snd_cwnd=10, established_ts_ns=0, passive=False,
    )  # fmt: skip


class Readings:
    """A net collector's successive readings, as `connections_of` gives them."""

    def __init__(self) -> None:
        self.at = 0.0
        self.conns: list[TcpConnection] = []
        self.running = True
        self.asked: list[set[int]] = []
        self.counted_since = 0.0  # every retransmit counted from the start

    def connections_of(self, pids: Collection[int]) -> tuple[float, list[TcpConnection]] | None:
        self.asked.append(set(pids))
        if not self.running:
            return None
        return self.at, [c for c in self.conns if c.pid in pids]

    def retransmits_counted_since(self) -> float:
        return self.counted_since


def test_the_sampler_gives_each_connection_s_interval_from_the_collector_s_readings() -> None:
    src = Readings()
    sampler = LinkSampler(src)
    src.at, src.conns = (
        10.0,
        [
            conn(1, "10.0.0.1", "10.0.0.2", tx=1000, rx=200, retx=1, srtt=0.001),
            conn(2, "10.0.0.2", "10.0.0.1", sport=50000, dport=40000, tx=200, rx=1000),
        ],
    )
    # The first reading is the base: known connections, no interval yet.
    assert sampler.sample({1, 2}) == {1: (), 2: ()}
    src.at, src.conns = (
        15.0,
        [
            conn(1, "10.0.0.1", "10.0.0.2", tx=6000, rx=700, retx=4, srtt=0.021),
            conn(2, "10.0.0.2", "10.0.0.1", sport=50000, dport=40000, tx=200, rx=6000),
            conn(2, "10.0.0.2", "10.0.0.3", sport=50001, tx=300),  # new: a base only
            conn(2, "10.0.0.2", "10.0.0.4", sport=50002, tx=300, state="SYN_SENT"),
        ],
    )
    assert sampler.sample({1, 2}) == {
        1: (NetLink("10.0.0.1", "10.0.0.2", 0.021, 3, 5500, 5.0, sent_bytes=5000),),
        2: (NetLink("10.0.0.2", "10.0.0.1", None, 0, 5000, 5.0, sent_bytes=0),),
    }
    # The collector has not read its maps again: the same interval once more.
    again = sampler.sample({1, 2})
    assert again[1][0].moved_bytes == 5500 and again[2][0].moved_bytes == 5000
    src.at, src.conns[0] = 17.5, conn(1, "10.0.0.1", "10.0.0.2", tx=6000, rx=700, retx=4)
    assert sampler.sample({1}) == {
        1: (NetLink("10.0.0.1", "10.0.0.2", None, 0, 0, 2.5, sent_bytes=0),)
    }


def test_an_interval_that_began_before_retransmits_were_counted_again_has_a_lower_bound() -> None:
    """The overhead budget detached the retransmit program and attached it again: the
    intervals that began before that say their retransmits are not all counted; the first
    one that began after it is exact again."""
    src = Readings()
    sampler = LinkSampler(src)
    c = conn(1, "10.0.0.1", "10.0.0.2", tx=0, retx=0)
    src.at, src.conns = 10.0, [c]
    sampler.sample({1})

    def interval(at: float, tx: int, retx: int) -> NetLink:
        src.at, src.conns = at, [replace(c, tx_bytes=tx, retransmits=retx)]
        (got,) = sampler.sample({1})[1]
        return got

    src.counted_since = math.inf  # detached now
    assert interval(15.0, 100, 1) == NetLink(
        "10.0.0.1", "10.0.0.2", None, 1, 100, 5.0, retransmits_unknown=True, sent_bytes=100
    )
    src.counted_since = 17.0  # attached again at 17 s: the interval 15-20 s missed some
    assert interval(20.0, 200, 2).retransmits_unknown
    assert interval(25.0, 300, 9) == NetLink(
        "10.0.0.1", "10.0.0.2", None, 7, 100, 5.0, sent_bytes=100
    )
    src.counted_since = 25.0  # attached again at the very reading the next interval begins
    assert not interval(30.0, 400, 9).retransmits_unknown


def test_without_the_net_collector_the_links_are_not_known_and_it_says_why() -> None:
    src = Readings()
    src.running = False
    sampler = LinkSampler(src)
    assert sampler.sample({1}) is None
    assert sampler.error == "the net collector is not running"
    src.running = True
    assert sampler.sample({1}) == {1: ()}
    assert sampler.error == ""


ADDR = {r: f"10.18.0.{10 + r}" for r in range(4)}


def link(
    a: int, b: int, srtt: float | None, retx: int = 0, moved: int = 4000, sent: int = -1
) -> NetLink:
    """Rank ``a``'s socket to rank ``b`` over a 5 s interval (``sent``: of ``moved``, what
    it sent; half unless given)."""
    sent = moved // 2 if sent < 0 else sent
    return NetLink(ADDR[a], ADDR[b], srtt, retx, moved, 5.0, sent_bytes=sent)


def ring(
    rtt: dict[tuple[int, int], float], retx: dict[tuple[int, int], int]
) -> dict[int, list[NetLink]]:
    """A 4-rank ring (0 -> 1 -> 2 -> 3 -> 0): each rank sends data to the next (its socket
    has RTT samples) and acknowledges the previous (its socket keeps its handshake's RTT,
    1 ms); idle connections to the rank across (no bytes moved)."""
    out: dict[int, list[NetLink]] = {r: [] for r in range(4)}
    for a in range(4):
        b, prev, across = (a + 1) % 4, (a - 1) % 4, (a + 2) % 4
        out[a].append(link(a, b, rtt.get((a, b), 0.002), retx.get((a, b), 0), sent=4000))
        out[a].append(link(a, prev, 0.001, retx.get((a, prev), 0), sent=0))
        out[a].append(link(a, across, 0.5, moved=0))  # idle: its RTT is not counted
    return out


def test_the_rank_whose_every_active_link_is_slow_scores_its_rtt_its_neighbours_do_not() -> None:
    # 20 ms more on what rank 1 sends: its data to rank 2, its ACKs to rank 0 (rank 0's RTT).
    scores = link_scores(ring({(1, 2): 0.022, (0, 1): 0.0215}, {}))
    assert {r: s.rtt_s for r, s in scores.items()} == {0: 0.002, 1: 0.0215, 2: 0.002, 3: 0.002}


def test_loss_counts_on_both_ends_links_the_fewest_per_second_is_the_rank_s_score() -> None:
    # 15 % of what rank 1 receives dropped: rank 0 re-sends its data to it (60 in 5 s), rank 1
    # re-sends (tail probes) what rank 2's lost ACKs left unacknowledged (10), and the link
    # 2-3 had 5 (noise).
    scores = link_scores(ring({}, {(0, 1): 60, (1, 2): 10, (2, 3): 5}))
    assert {r: s.retransmits_per_s for r, s in scores.items()} == {0: 0.0, 1: 2.0, 2: 1.0, 3: 0.0}


def test_connections_outside_the_job_within_one_address_or_idle_are_not_links() -> None:
    links = {
        0: [
            link(0, 1, 0.002),
            NetLink(ADDR[0], "192.0.2.7", 0.3, moved_bytes=100, seconds=5.0),  # not a rank's
            NetLink(ADDR[0], ADDR[0], 0.9, moved_bytes=100, seconds=5.0),  # within its address
        ],
        1: [link(1, 0, None), link(1, 2, 0.7, moved=0)],
        2: [link(2, 1, 0.7, moved=0)],
    }
    scores = link_scores(links)
    assert scores[0] == LinkScores(rtt_s=0.002, retransmits_per_s=0.0)
    assert scores[1] == LinkScores(rtt_s=0.002, retransmits_per_s=0.0)
    assert math.isnan(scores[2].rtt_s) and math.isnan(scores[2].retransmits_per_s)


def test_a_rank_without_net_data_scores_nan_never_zero() -> None:
    scores = link_scores({0: [link(0, 1, 0.002)], 1: [link(1, 0, 0.002)], 2: None})
    assert scores[0] == LinkScores(0.002, 0.0)
    assert math.isnan(scores[2].rtt_s) and math.isnan(scores[2].retransmits_per_s)
    # A link whose sockets were never sampled for RTT: retransmits known, RTT not.
    only = link_scores({0: [link(0, 1, None)], 1: [link(1, 0, None)]})
    assert math.isnan(only[0].rtt_s) and only[0].retransmits_per_s == 0.0


def test_a_link_with_a_lower_bound_of_retransmits_leaves_its_ends_without_a_loss_score() -> None:
    """15 % loss at rank 1's receiver, while rank 2's agent had its retransmit program
    detached for part of the interval: rank 2's links (to 1 and to 3) have only a lower bound
    of retransmits (here 0), which as rank 2's or rank 3's best link would score them
    healthy and, as rank 1's, hide its loss. So ranks 1, 2 and 3 have no retransmit score
    this interval (NaN), every RTT is still judged, and rank 0, whose links were counted
    (to 1 and 3), scores as before."""
    links = ring({}, {(0, 1): 60, (1, 2): 10, (2, 3): 5})
    links[2] = [replace(x, retransmits_unknown=True) for x in links[2]]
    scores = link_scores(links)
    assert {r: s.rtt_s for r, s in scores.items()} == {r: 0.002 for r in range(4)}
    assert scores[0].retransmits_per_s == 0.0
    assert all(math.isnan(scores[r].retransmits_per_s) for r in (1, 2, 3))
    # Counted on every socket again: rank 1 is the lossy one, as in the test above.
    assert link_scores(ring({}, {(0, 1): 60, (1, 2): 10, (2, 3): 5}))[1].retransmits_per_s == 2.0


def test_ranks_sharing_an_address_share_its_links() -> None:
    # Two nodes, two ranks each: every rank's connection to the other node is the nodes' link.
    # Node a's ranks send; node b's only acknowledge (their RTT is their handshake's).
    a, b = "10.1.0.1", "10.1.0.2"
    links = {
        0: [NetLink(a, b, 0.030, moved_bytes=10, seconds=5.0, sent_bytes=10)],
        1: [NetLink(a, b, 0.031, moved_bytes=10, seconds=5.0, sent_bytes=10)],
        2: [NetLink(b, a, 0.001, moved_bytes=10, seconds=5.0, sent_bytes=0)],
        3: [NetLink(b, a, 0.001, retransmits=5, moved_bytes=10, seconds=5.0, sent_bytes=0)],
    }
    scores = link_scores(links)
    assert {r: (s.rtt_s, s.retransmits_per_s) for r, s in scores.items()} == {
        r: (0.030, 1.0) for r in range(4)
    }


def measured(rtts_ms: dict[tuple[int, int], float]) -> dict[int, list[NetLink]]:
    """Each rank's sockets to its two ring neighbours, both sending alike (gloo's ring moves
    data both ways), at the RTTs given in ms."""
    out: dict[int, list[NetLink]] = {r: [] for r in range(4)}
    for (a, b), ms in rtts_ms.items():
        out[a].append(link(a, b, ms / 1000, moved=36_000, sent=18_000))
    return out


#: One interval of the real 4-rank job with 5 ms added on rank 3's link (the detection
#: matrix's run in docs/detection.md), each socket's RTT in ms: rank 3's links read 5.8-6.4
#: ms on both ends; rank 1's socket to rank 0 4.6 ms, rank 0's to rank 1 0.1 ms (a receiver
#: holding its ACK for its reply counts its own wait into its peer's RTT).
RANK_3_SLOW = {
    (0, 1): 0.11, (0, 3): 6.41, (1, 0): 4.62, (1, 2): 0.60,
    (2, 1): 0.20, (2, 3): 6.04, (3, 2): 5.94, (3, 0): 5.83,
}  # fmt: skip


def test_a_link_reads_its_senders_least_rtt_so_one_slow_side_does_not_make_it_slow() -> None:
    # Each rank's `net_rtt_ms`: its best link's RTT in ms.
    ms = {r: s.rtt_s * 1000 for r, s in link_scores(measured(RANK_3_SLOW)).items()}
    assert ms == pytest.approx({0: 0.11, 1: 0.11, 2: 0.20, 3: 5.83}, abs=1e-9)
    rtt = next(s for s in SCORES if s.name == "net_rtt_ms")
    assert outliers(ms, 3.0, rtt.floor, rtt.relative) == {3}
    # The largest of each link (the rule before senders were told apart) made rank 0 score
    # 4.62 ms, and the spread hid rank 3: what the matrix missed.
    old = {r: [replace(x, sent_bytes=None) for x in v] for r, v in measured(RANK_3_SLOW).items()}
    old_ms = {r: s.rtt_s * 1000 for r, s in link_scores(old).items()}
    assert old_ms == pytest.approx({0: 4.62, 1: 0.60, 2: 0.60, 3: 6.04}, abs=1e-9)
    assert outliers(old_ms, 3.0, rtt.floor, rtt.relative) == set()


def test_a_socket_that_sent_little_does_not_speak_for_its_link() -> None:
    """Rank 0 sent 40 kB to rank 1 at 6 ms; rank 1 sent back less than a quarter of that:
    its few RTT samples leave its smoothed RTT behind, so the link reads 6 ms. From a
    quarter on, its samples count."""
    for sent, expected in ((9_999, 0.006), (10_000, 0.0002), (40_000, 0.0002)):
        links = {
            0: [link(0, 1, 0.006, moved=40_000 + sent, sent=40_000)],
            1: [link(1, 0, 0.0002, moved=40_000 + sent, sent=sent)],
        }
        assert link_scores(links)[0].rtt_s == expected
    # No socket with an RTT sent anything: no RTT for the link, not a handshake's.
    quiet = {0: [link(0, 1, 0.0002, moved=900, sent=0)], 1: [link(1, 0, None, moved=900)]}
    assert math.isnan(link_scores(quiet)[0].rtt_s)
    assert link_scores(quiet)[0].retransmits_per_s == 0.0


def test_links_from_an_agent_that_does_not_say_what_its_sockets_sent_read_their_largest() -> None:
    links = {0: [link(0, 1, 0.006, sent=2000)], 1: [replace(link(1, 0, 0.0002), sent_bytes=None)]}
    assert link_scores(links)[0].rtt_s == 0.006
    assert link_scores(links)[1].rtt_s == 0.006
