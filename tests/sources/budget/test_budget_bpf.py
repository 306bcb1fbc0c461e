"""The budget's steps on the real BPF programs: what each does in the kernel, exactly.

* net: per-call accounting in its off phase keeps the host-wide byte counts exact and skips
  the per-process ones; a sampled interval's per-process counts are scaled by its share;
  the stronger step after it detaches the byte programs in that phase (nothing counted,
  host-wide rates scaled up and labelled estimates); a detached rare-event program's
  metrics are not known (NaN), never 0.

The scheduler's steps are tested beside its other tests (tests/sources/sched).

Needs root (BPF).
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Iterator

import pytest

from bpfdyno.core.budget import Reduction
from bpfdyno.core.status import PartState
from bpfdyno.detection.net_signal import LinkSampler
from bpfdyno.ebpf.reductions import DetachedFunctions, SampledFunctions
from bpfdyno.sources.net.collector import NetCollector
from bpfdyno.sources.net.decode import ProcNet

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root"),
]


def step(collector: NetCollector, name: str) -> Reduction:
    (found,) = [r for r in collector.reductions() if r.name == name]
    return found


# --- net ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def net() -> Iterator[NetCollector]:
    c = NetCollector()
    c.start()
    c.collect()
    yield c
    c.close()


def udp_roundtrip(count: int, size: int) -> None:
    """``count`` datagrams of ``size`` bytes sent and received by this process."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with rx, tx:
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        rx.bind(("127.0.0.1", 0))
        for _ in range(count):
            tx.sendto(b"b" * size, rx.getsockname())
        for _ in range(count):
            assert len(rx.recv(65536)) == size


def udp_of(net: NetCollector) -> tuple[int, int]:
    net.collect()
    p = net.per_process().get(os.getpid(), ProcNet(0, 0, 0, 0, 0, 0, 0))
    return p.udp_tx_bytes, p.udp_rx_bytes


def test_net_off_phase_counts_host_bytes_exactly_and_skips_per_process(net: NetCollector) -> None:
    sampled = step(net, "net.bytes_sampled")
    assert isinstance(sampled, SampledFunctions) and sampled.flag is not None
    before = udp_of(net)
    host0 = net.counter("NET_C_UDP_TX_BYTES"), net.counter("NET_C_UDP_RX_BYTES")
    sampled.target.set_off(True)  # the off phase the duty cycler would set
    try:
        udp_roundtrip(50, 1000)
        during = udp_of(net)
        host1 = net.counter("NET_C_UDP_TX_BYTES"), net.counter("NET_C_UDP_RX_BYTES")
    finally:
        sampled.target.set_off(False)
    udp_roundtrip(40, 1000)
    after = udp_of(net)
    assert during == before  # per-process accounting skipped
    # Host-wide counts go on at every call (other processes may add their own traffic).
    assert host1[0] - host0[0] >= 50_000 and host1[1] - host0[1] >= 50_000
    assert (after[0] - during[0], after[1] - during[1]) == (40_000, 40_000)


def test_a_sampled_intervals_per_process_bytes_are_scaled_by_its_share(net: NetCollector) -> None:
    # What the collector does with an interval in which per-call accounting was on a share
    # of the time: the bytes it saw, divided by that share (exact arithmetic here).
    raw0 = {7: ProcNet(1000, 0, 200, 0, 0, 0, 3)}
    raw1 = {7: ProcNet(1500, 80, 260, 0, 0, 0, 4), 8: ProcNet(10, 0, 0, 0, 0, 0, 0)}
    net._raw_procs, net._extra = {}, {}
    assert net._scaled_procs(raw0, 1.0) == raw0  # exact while never sampled
    scaled = net._scaled_procs(raw1, 0.25)
    assert scaled[7] == ProcNet(1000 + 500 * 4, 80 * 4, 200 + 60 * 4, 0, 0, 0, 4)
    assert scaled[8] == ProcNet(40, 0, 0, 0, 0, 0, 0)
    # Back to exact accounting: the bytes added stay, new ones count once.
    raw2 = {7: ProcNet(1600, 80, 260, 0, 0, 0, 4)}
    assert net._scaled_procs(raw2, 1.0)[7] == ProcNet(3100, 320, 440, 0, 0, 0, 4)
    net._raw_procs, net._extra = {}, {}


def test_the_stronger_step_detaches_the_byte_programs_in_the_off_phase(net: NetCollector) -> None:
    sampled, detached = step(net, "net.bytes_sampled"), step(net, "net.bytes_detached")
    assert isinstance(detached, SampledFunctions) and detached.after is sampled
    assert detached.flag is None and detached.fns == sampled.fns
    program = net._require()
    detached.target.set_off(True)  # the off phase the duty cycler would set
    try:
        assert not any(program.attached(fn) for fn in detached.fns)
        host0 = net.counter("NET_C_UDP_TX_BYTES"), net.counter("NET_C_UDP_RX_BYTES")
        before = udp_of(net)
        udp_roundtrip(30, 1000)
        # Nothing is counted, host-wide or per process: the calls do not enter them.
        assert udp_of(net) == before
        assert (net.counter("NET_C_UDP_TX_BYTES"), net.counter("NET_C_UDP_RX_BYTES")) == host0
    finally:
        detached.target.set_off(False)
    assert all(program.attached(fn) for fn in detached.fns)
    udp_roundtrip(20, 1000)
    after = udp_of(net)
    assert (after[0] - before[0], after[1] - before[1]) == (20_000, 20_000)


def test_a_sampled_intervals_host_byte_rates_are_scaled_and_labelled(net: NetCollector) -> None:
    # What the collector does with an interval whose byte programs were attached a quarter of
    # it: the host-wide bytes seen, divided by that share, labelled; exact otherwise.
    counters = net._counters
    prev, cur = [0] * len(net._prev_totals or []), [0] * len(net._prev_totals or [])
    cur[counters["NET_C_UDP_TX_BYTES"]] = 6_000
    cur[counters["NET_C_TCP_RX_BYTES"]] = 1_000
    kept = net._prev_totals
    net._prev_totals = prev
    try:
        rates = {
            (s.spec.name, s.labels): s.value
            for s in net._rate_samples(cur, {}, 2.0, 0.25)
            if "bytes" in s.spec.name and not math.isnan(s.value)
        }
        exact = {
            (s.spec.name, s.labels): s.value
            for s in net._rate_samples(cur, {}, 2.0)
            if "bytes" in s.spec.name and not math.isnan(s.value)
        }
    finally:
        net._prev_totals = kept
    est = (("estimate", "sampled"),)
    assert rates == {
        ("net_tcp_sent_bytes_per_second", est): 0.0,
        ("net_tcp_received_bytes_per_second", est): 2_000.0,
        ("net_udp_sent_bytes_per_second", est): 12_000.0,
        ("net_udp_received_bytes_per_second", est): 0.0,
    }
    assert exact == {
        ("net_tcp_sent_bytes_per_second", ()): 0.0,
        ("net_tcp_received_bytes_per_second", ()): 500.0,
        ("net_udp_sent_bytes_per_second", ()): 3_000.0,
        ("net_udp_received_bytes_per_second", ()): 0.0,
    }


def test_while_the_rtt_program_is_detached_connections_have_no_rtt(net: NetCollector) -> None:
    """The socket map keeps the RTT the program last wrote: while it is detached that would
    read as current (a link slowed since would look healthy to the straggler detection), so
    the connections say not known (NaN); attached again, the RTT is read as before."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    with server, client, peer:
        for _ in range(50):  # acknowledged data: the kernel samples the RTT
            client.sendall(b"r" * 1000)
            peer.recv(65536)
            peer.sendall(b"a")
            client.recv(16)
        pid = {os.getpid()}

        def rtts() -> list[float]:
            net.collect()
            reading = net.connections_of(pid)
            assert reading is not None
            return [c.srtt_s for c in reading[1] if c.dport == server.getsockname()[1]]

        before = rtts()
        assert len(before) == 1 and not math.isnan(before[0]) and before[0] > 0, before
        rtt = step(net, "net.rtt_detached")
        rtt.apply()
        try:
            during = rtts()
            assert len(during) == 1 and math.isnan(during[0]), during
            assert all(math.isnan(c.srtt_s) for c in net.connections())
        finally:
            rtt.undo()
        assert rtts() == before


def test_retransmits_are_known_again_from_the_interval_after_their_program_is_back(
    net: NetCollector,
) -> None:
    """While the retransmit program is detached the connections' counts stand still, so the
    collector says since when it has counted every retransmit (inf while detached, the
    moment it was attached again after) and the detection's per-interval links say which
    intervals hold a lower bound: every one that began before it was attached again."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    with server, client, peer:
        sampler = LinkSampler(net)

        def interval() -> bool:
            """Whether the next interval (1000 bytes moved) holds a lower bound."""
            client.sendall(b"x" * 1000)
            peer.recv(65536)
            net.collect()
            got = sampler.sample({os.getpid()})
            assert got is not None
            # Both ends are this process's: the same interval, the same answer.
            flags = {link.retransmits_unknown for link in got[os.getpid()] if link.moved_bytes}
            assert len(flags) == 1, got
            return flags.pop()

        assert net.retransmits_counted_since() < time.monotonic()  # counted now
        net.collect()
        sampler.sample({os.getpid()})  # the base
        assert interval() is False
        tcp_events = step(net, "net.tcp_events_detached")
        assert isinstance(tcp_events, DetachedFunctions)
        tcp_events.apply()
        try:
            assert not net._require().attached("bpfdyno_nretx")
            assert net.retransmits_counted_since() == math.inf
            assert interval() is True
        finally:
            before_undo = time.monotonic()
            tcp_events.undo()
        assert net._require().attached("bpfdyno_nretx")
        assert before_undo <= net.retransmits_counted_since() <= time.monotonic()
        assert interval() is True  # began while detached
        assert interval() is False


def test_detached_rare_event_programs_report_nan_not_zero(net: NetCollector) -> None:
    drops = step(net, "net.drops_detached")
    assert isinstance(drops, DetachedFunctions)
    drops.apply()
    try:
        assert not net._require().attached("bpfdyno_ndrop")
        samples = net.collect()
        assert all(math.isnan(s.value) for s in samples if s.spec.name == "net_drops_per_second")
        state, reason = net.health() or (None, "")
        assert state is PartState.DEGRADED
        assert "the bpfdyno_ndrop program(s) detached" in reason
    finally:
        drops.undo()
    assert net._require().attached("bpfdyno_ndrop")
    assert net.health() is None
