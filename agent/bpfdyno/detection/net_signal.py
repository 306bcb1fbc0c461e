"""Per-rank network scores: the rank common to the job's slow or lossy links.

A rank held back by its link (added latency, a bandwidth cap, loss at its receiver or on its
wire) sleeps in its collectives like its peers, so neither CPU score sees it. What does see it
is the kernel's view of the job's TCP connections, which the net collector already keeps per
socket (`bpfdyno.sources.net`): the smoothed RTT from the sampled ``tcp_probe``, the
retransmits, the bytes moved. A fault on one rank's link shows on *every* connection of that
rank, but on only one connection of each healthy rank: the one to it.

So the connections are joined into **links between addresses** (a rank's address is the local
address of its connections; a connection belongs to the job when its remote address is another
of the job's ranks'; both ends' sockets of a link, and every connection between the same two
addresses, make one link), each link is judged over the interval, and a rank's score is its
*best* link that moved bytes (the least RTT, the fewest retransmits per second): only a rank
whose every active link is slow or lossy scores high. The best, not the median: in a ring
all-reduce a rank moves data on two links only, one of them to its faulted neighbour, and the
median of two is half the fault (measurements in docs/detection.md).

- **RTT** of a link: the least smoothed RTT among its sockets that sent data in the interval
  (at least a quarter of what the link's busiest sender sent). A socket's RTT samples come
  from the ACKs of what it sends: one that only acknowledges keeps the RTT of its handshake,
  one that sent little lags behind its link. The least, because a fault on the link (delay
  or a queue at either end) lengthens every sender's round trip, while a healthy link can
  read long on one side only: a receiver that holds its ACK until it has data to send back
  (delayed ACK) puts its own wait into its peer's RTT. On the real 4-rank job, 5 ms on rank
  3's link made rank 1's socket to rank 0 read up to 6.3 ms (3.3-4.6 in most intervals)
  while rank 0's read 0.1-0.2 ms; the largest made rank 0 score nearly as slow as rank 3 and
  hid rank 3 in 8 of 9 intervals, the least found it in all 9 (docs/detection.md). Links
  from an agent that does not say what its sockets sent are judged by their largest RTT.
- **Retransmits** of a link: the sum over its sockets, per second. Loss on the way *to* a rank
  makes its senders retransmit; the ACKs it loses make its own sends' tail probes fire: both
  count on the rank's links. A socket whose interval began while the overhead budget kept the
  retransmit program detached has only a lower bound, and so would the link's sum: that link
  has no retransmit score for the interval, nor have the ranks at its ends (NaN, as for no
  data: their best link might be the one not judged).

Ranks that share an address (several ranks of one node talking to other nodes through its
NIC) share its links and its score: the fault is then the node's link, and every rank behind
it is held back alike. Connections within one address (loopback, ranks of one node) are not
links. A rank without net data (the collector off, a job on RDMA without TCP connections to
its peers) scores NaN, never 0.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from bpfdyno.rpc.detection import NetLink
from bpfdyno.sources.net.decode import TcpConnection

NAN = float("nan")
ESTABLISHED = "ESTABLISHED"


class ConnectionSource(Protocol):
    """The net collector's latest reading of some processes' TCP connections."""

    def connections_of(self, pids: Collection[int]) -> tuple[float, list[TcpConnection]] | None:
        """(when the socket map was read, monotonic seconds; the connections), None while
        the collector is not running."""
        ...

    def retransmits_counted_since(self) -> float:
        """Since when (monotonic seconds) every retransmit has been counted (inf: not now)."""
        ...


_Key = tuple[int, str, int, str, int]  # pid, local address and port, remote address and port


class LinkSampler:
    """Each interval, every rank's connections with what they did since the last reading.

    It reads what the net collector read last (no second copy of the collection); when that
    reading has not changed since the last call (the collector runs less often than the
    detection), the last interval's links are given again.
    """

    def __init__(self, source: ConnectionSource) -> None:
        self._source = source
        self._read_at = -1.0
        self._counters: dict[_Key, tuple[int, int, int]] = {}  # retransmits, bytes, sent
        self._links: dict[int, tuple[NetLink, ...]] = {}
        #: Why there are no links ("" while the collector gives them).
        self.error = ""

    def sample(self, pids: Collection[int]) -> dict[int, tuple[NetLink, ...]] | None:
        """Per pid, its established connections' links (a pid with none: empty); None when
        the collector gives nothing."""
        reading = self._source.connections_of(pids)
        if reading is None:
            self.error = "the net collector is not running"
            return None
        self.error = ""
        at, conns = reading
        if at == self._read_at:
            return {pid: self._links.get(pid, ()) for pid in pids}
        seconds = at - self._read_at if self._read_at >= 0 else 0.0
        # An interval that began before the retransmit program was last attached again (the
        # overhead budget detached it) missed some: a lower bound, not the link's loss.
        retransmits_unknown = self._source.retransmits_counted_since() > self._read_at
        counters: dict[_Key, tuple[int, int, int]] = {}
        links: dict[int, list[NetLink]] = {pid: [] for pid in pids}
        for c in conns:
            if c.state != ESTABLISHED or c.pid not in links:
                continue
            key = (c.pid, c.saddr, c.sport, c.daddr, c.dport)
            now = (c.retransmits, c.tx_bytes + c.rx_bytes, c.tx_bytes)
            counters[key] = now
            before = self._counters.get(key)
            if before is None or seconds <= 0:
                continue  # first seen: its counters are the base of the next interval
            links[c.pid].append(
                NetLink(
                    local_address=c.saddr,
                    remote_address=c.daddr,
                    srtt_seconds=None if math.isnan(c.srtt_s) else c.srtt_s,
                    retransmits=max(0, now[0] - before[0]),
                    moved_bytes=max(0, now[1] - before[1]),
                    seconds=seconds,
                    retransmits_unknown=retransmits_unknown,
                    sent_bytes=max(0, now[2] - before[2]),
                )
            )
        self._read_at, self._counters = at, counters
        self._links = {pid: tuple(v) for pid, v in links.items()}
        return dict(self._links)


@dataclass(frozen=True, slots=True)
class LinkScores:
    """A rank's network scores over one interval (NaN: no active link of the job)."""

    rtt_s: float = NAN  # the least RTT of its active links
    retransmits_per_s: float = NAN  # the fewest retransmits per second of its active links


def link_scores(ranks: Mapping[int, Iterable[NetLink] | None]) -> dict[int, LinkScores]:
    """Each rank's scores from the job's ranks' links (None: that rank's are not known)."""
    addresses: dict[int, set[str]] = {}
    for rank, links in ranks.items():
        if links is not None:
            addresses[rank] = {link.local_address for link in links}
    known = set().union(*addresses.values()) if addresses else set()
    # Per link between two of the job's addresses (unordered), its sockets that moved bytes.
    active: dict[frozenset[str], list[NetLink]] = {}
    for links in ranks.values():
        for link in links or ():
            if link.remote_address not in known or link.remote_address == link.local_address:
                continue
            if link.moved_bytes <= 0 and link.retransmits <= 0:
                continue  # idle: its RTT is an old one
            active.setdefault(frozenset((link.local_address, link.remote_address)), []).append(link)
    judged = {pair: _judge(sockets) for pair, sockets in active.items()}
    out: dict[int, LinkScores] = {}
    for rank in ranks:
        mine = [v for pair, v in judged.items() if pair & addresses.get(rank, set())]
        if not mine:
            out[rank] = LinkScores()
            continue
        rtts = [rtt for rtt, _ in mine if not math.isnan(rtt)]
        retransmits = [r for _, r in mine]
        out[rank] = LinkScores(
            rtt_s=min(rtts) if rtts else NAN,
            # The best of some links only could be the lossy neighbour's link: not judged.
            retransmits_per_s=NAN if any(map(math.isnan, retransmits)) else min(retransmits),
        )
    return out


#: A socket that sent less than this share of what its link's busiest sender sent has too few
#: RTT samples in the interval for its smoothed RTT (a new sample weighs 1/8) to be the link's.
FEW_SAMPLES_SHARE = 0.25


def _link_rtt(sockets: list[NetLink]) -> float:
    """The RTT of one link from its sockets that moved bytes (NaN: none sampled)."""
    if any(s.sent_bytes is None for s in sockets):
        # An agent that does not say what its sockets sent: the largest, the data sender's.
        rtts = [s.srtt_seconds for s in sockets if s.srtt_seconds is not None]
        return max(rtts) if rtts else NAN
    senders = [(s.sent_bytes or 0, s.srtt_seconds) for s in sockets if s.srtt_seconds is not None]
    most = max((sent for sent, _ in senders), default=0)
    if most <= 0:
        return NAN  # no socket with an RTT sent anything: its RTT is the handshake's
    return min(rtt for sent, rtt in senders if sent >= FEW_SAMPLES_SHARE * most)


def _judge(sockets: list[NetLink]) -> tuple[float, float]:
    """(RTT, retransmits per second) of one link from its sockets that moved bytes
    (retransmits NaN when one of them missed some of its interval's)."""
    rtt = _link_rtt(sockets)
    # Both ends' sockets and every connection between the two addresses: one link. Their
    # intervals are the same readings (one collector), so the rates add. With one end's
    # count a lower bound the sum is too, and a link that reads healthier than it is would
    # hide its rank's loss (a rank scores its best link): not judged.
    if any(s.retransmits_unknown for s in sockets):
        return rtt, NAN
    return rtt, sum(s.retransmits / s.seconds for s in sockets if s.seconds > 0)
