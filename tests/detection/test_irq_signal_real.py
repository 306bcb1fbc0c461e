"""The interrupt share of real ranks, from the real interrupt collector's BPF program: a
loopback UDP flood pinned to one CPU runs its NET_RX softirqs there (loopback delivers through
the sending CPU's backlog), and the rank pinned to that CPU sees its share rise while the rank
pinned to the other CPU does not."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from test_signals import Child, children

from bpfdyno.core.status import PartState
from bpfdyno.detection.collector import DetectionCollector
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.irq_signal import FROM_TICKS
from bpfdyno.detection.signals import RankProcess, RankSignals, SignalSampler
from bpfdyno.sources.irq.collector import IrqCollector

pytestmark = pytest.mark.root

#: A sender pinned to CPU argv[1] flooding a socket that nobody reads with 1400-byte datagrams
#: over loopback for argv[2] seconds (the socket's queue fills: the rest are dropped in the
#: softirq, which still runs).
FLOOD = r"""
import os, socket, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r.bind(("127.0.0.1", 0))
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
addr, data = r.getsockname(), bytes(1400)
print("started", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    for _ in range(100):
        s.sendto(data, addr)
"""
STORM_CPU, QUIET_CPU = 1, 0


@pytest.fixture(scope="module")
def irq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IrqCollector]:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.fail("this test needs two CPUs (one flooded, one not)")
    c = IrqCollector(header_cache=tmp_path_factory.mktemp("kheaders"))
    c.start()
    try:
        yield c
    finally:
        c.close()


def interval(sampler: SignalSampler, ranks: list[Child], seconds: float) -> dict[int, RankSignals]:
    """Each rank's signal over ``seconds`` in which every rank runs briefly every 20 ms (a
    1 MiB write: its threads' CPU time says where it ran, and it leaves the flood its CPU)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for c in ranks:
            c.send(b"w")
        for c in ranks:
            c.done()
        time.sleep(0.02)
    return {s.rank: s for s in sampler.sample(refs(ranks), time.monotonic())}


def refs(ranks: list[Child]) -> list[RankProcess]:
    return [RankProcess(c.pid, "7") for c in ranks]


@pytest.fixture(scope="module")
def irq_without_bpf() -> Iterator[IrqCollector]:
    """The interrupt collector without its BPF part, as while the budget detaches it."""
    c = IrqCollector(load_bpf=False)
    c.start()
    try:
        yield c
    finally:
        c.close()


@pytest.mark.parametrize("books", ["bpf", "ticks"])
def test_a_rank_on_a_flooded_cpu_sees_its_interrupt_share_rise_and_one_elsewhere_not(
    books: str, irq: IrqCollector, irq_without_bpf: IrqCollector
) -> None:
    """From the collector's books, and from /proc/stat's tick-counted ones when the
    collector has none (the budget detached its programs: the storm must still be seen)."""
    sampler = SignalSampler(interrupts=irq if books == "bpf" else irq_without_bpf)
    assert sampler.interrupts is not None
    with children(0, cpu=QUIET_CPU) as (quiet,), children(1, cpu=STORM_CPU) as (stormed,):
        ranks = [quiet, stormed]
        sampler.sample(refs(ranks), time.monotonic())  # the base
        before = interval(sampler, ranks, 2.0)
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, str(STORM_CPU), "30"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert flood.stdout is not None and flood.stdout.readline() == "started\n"
            sampler.sample(refs(ranks), time.monotonic())  # from the flood's start
            during = interval(sampler, ranks, 2.0)
        finally:
            flood.kill()
            flood.wait()
    assert sampler.interrupts.estimated == ("" if books == "bpf" else FROM_TICKS)
    for s in (*before.values(), *during.values()):
        cpu = QUIET_CPU if s.rank == 0 else STORM_CPU
        assert s.interrupt_cpu == cpu
    # The flood runs its NET_RX softirqs on CPU 1: about 0.3 of its time when measured alone
    # (less when other work shares the CPU with the sender). CPU 0 keeps its own
    # interrupts (timers, and other users' loads on a shared machine): it may not rise by
    # as much as the flooded one in any case.
    rise_stormed = during[1].interrupt_share - before[1].interrupt_share
    rise_quiet = during[0].interrupt_share - before[0].interrupt_share
    assert rise_stormed > 0.08, (before, during)
    assert rise_quiet < rise_stormed / 2, (before, during)
    assert during[1].interrupt_share > during[0].interrupt_share + 0.05


def test_the_detection_part_reports_the_share_as_a_metric_and_when_it_is_not_known(
    irq: IrqCollector, irq_without_bpf: IrqCollector
) -> None:
    with children(2, cpu=STORM_CPU) as (rank,):
        part = DetectionCollector(
            lambda: [RankProcess(rank.pid, "7")], EventLog(16), "node-a", interrupts=irq
        )
        part.collect()
        rank.send(b"w")
        rank.done()
        shares = [s for s in part.collect() if s.spec.name == "rank_interrupt_ratio"]
        assert [dict(s.labels) for s in shares] == [{"job_id": "7", "rank": "2"}]
        assert 0.0 <= shares[0].value <= 1.0
        (record,) = part.rank_signals()
        assert record.interrupt_cpu == STORM_CPU
        assert record.interrupt_seconds == pytest.approx(shares[0].value * record.interval_seconds)
        assert part.health() is None
        # Without the collector's programs the share is the kernel's tick-counted estimate
        # (/proc/stat), and the part says so (with neither: tests/detection/test_irq_signal.py).
        part = DetectionCollector(
            lambda: [RankProcess(rank.pid, "7")],
            EventLog(16),
            "node-a",
            interrupts=irq_without_bpf,
        )
        part.collect()
        rank.send(b"w")
        rank.done()
        shares = [s for s in part.collect() if s.spec.name == "rank_interrupt_ratio"]
        assert [dict(s.labels) for s in shares] == [{"job_id": "7", "rank": "2"}]
        assert 0.0 <= shares[0].value <= 1.0
        (record,) = part.rank_signals()
        assert record.interrupt_cpu == STORM_CPU
        assert record.interrupt_seconds == pytest.approx(shares[0].value * record.interval_seconds)
        assert part.health() == (
            PartState.DEGRADED,
            "interrupt share estimated from /proc/stat's irq and softirq ticks: the irq "
            "collector's softirq and interrupt-handler times are not known",
        )
