"""A trace keeps its interrupt times while the overhead budget holds ``irq.softirq_detached``.

Everything real: the interrupt collector's programs in the kernel, the overhead budget
measuring this process's real BPF run statistics and CPU time under a budget far below what
they cost (0.01 % of a core), so it takes the interrupt programs' step by itself; softirqs
from UDP datagrams over loopback that the traced process sends to itself; the capture
manager recording its ``fabric`` track. The step must stay in force for the collector (its
series not known), while the trace records its interrupt time and its requester pays for it.
"""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from bpfdyno.core.budget import Costs, RequestedWork
from bpfdyno.core.config import BudgetSection, load
from bpfdyno.sources.budget.controller import WARMUP_S, BudgetCollector
from bpfdyno.sources.irq import collector as irq_mod
from bpfdyno.sources.irq.collector import IrqCollector
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import FabricDelta, KernelTrackRequest, Track

pytestmark = pytest.mark.root

FABRIC = KernelTrackRequest(frozenset({Track.FABRIC}), 0.0)
IRQ_FNS = {fn for _, fn in irq_mod.PROGRAMS}
#: A process that sends 64-byte UDP datagrams to itself over loopback, about 2000 a second
#: (a thread drains them): NET_RX softirqs on the CPUs it runs on, at a cost of about 1 % of
#: a core, so no interrupt storm for the machine. Prints "sending" once the first are out.
SELF_SENDER = r"""
import socket, threading, time
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
def drain():
    while True:
        rx.recv(2048)
threading.Thread(target=drain, daemon=True).start()
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.connect(rx.getsockname())
msg = bytes(64)
said = False
while True:
    for _ in range(20):
        tx.send(msg)
    if not said:
        print("sending", flush=True)
        said = True
    time.sleep(0.01)
"""


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not in {timeout:g} s: {what}"
        time.sleep(0.2)


@pytest.fixture
def irq(fresh_irq: IrqCollector) -> IrqCollector:
    return fresh_irq


@pytest.fixture
def sender() -> Iterator[subprocess.Popen[str]]:
    p = subprocess.Popen([sys.executable, "-c", SELF_SENDER], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "sending\n"
        yield p
    finally:
        p.kill()
        p.wait(10)


class Budget:
    """The overhead budget as the daemon wires it to the interrupt collector, its rounds on
    a thread of their own (as each window completes, every 0.2 s at most)."""

    def __init__(self, irq: IrqCollector) -> None:
        self.requested = RequestedWork()
        self.budget = BudgetCollector(
            BudgetSection(cpu_ratio=0.0001),
            [irq.reductions],
            requested=self.requested,
            clock=lambda: time.monotonic() + WARMUP_S,  # past its warm-up: it acts at once
        )
        self.budget.add_requested_programs(irq.requested_programs)
        self.costs: list[Costs] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._rounds)

    def _rounds(self) -> None:
        while not self._done.wait(0.2):
            self.budget.collect()
            costs = self.budget.state().costs
            if not self.costs or costs is not self.costs[-1]:
                self.costs.append(costs)

    def __enter__(self) -> Budget:
        self.budget.start()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        self.budget.close()

    def held(self) -> list[str]:
        return [h.step.name for h in self.budget.state().held]


def bpf_series(c: IrqCollector) -> list[float]:
    names = {"softirq_seconds_per_second", "hardirq_seconds_per_second"}
    return [s.value for s in c.collect() if s.spec.name in names]


def test_a_trace_records_interrupt_time_while_the_budget_holds_the_step(
    irq: IrqCollector, sender: subprocess.Popen[str]
) -> None:
    assert irq._program is not None
    manager = CaptureManager(
        load(None, [("capture.fabric_sample_hz", "20")]).capture, interrupts=irq
    )
    manager.start()
    try:
        assert manager.wait_loaded(120)
        with Budget(irq) as budget:
            wait_for(lambda: budget.held() == ["irq.softirq_detached"], 120, "the step taken")
            assert not any(irq._program.attached(fn) for fn in IRQ_FNS)
            assert irq.cpu_interrupt_times() is None
            irq.collect()

            key = CaptureKey("t", sender.pid, requester="uid 1234")
            manager.begin(key, FABRIC).result(30)
            assert all(irq._program.attached(fn) for fn in IRQ_FNS)
            # Recorded until the budget has measured a window while the trace ran (its
            # programs' cost then charged to the requester), and at least 2 s.
            start = time.monotonic()
            wait_for(
                lambda: (
                    time.monotonic() - start >= 2.0
                    and any("uid 1234" in c.requested_ns_s for c in budget.costs)
                ),
                120,
                "a window charged to the requester",
            )
            during = bpf_series(irq)
            cap = manager.end(key).result(60)
            held_after = budget.held()
            attached_after = any(irq._program.attached(fn) for fn in IRQ_FNS)
            times_after = irq.cpu_interrupt_times()
            charged = budget.requested.by_reader().get("uid 1234", 0)
            agent_threads_charged = budget.requested.total_ns()
            measured = [c for c in budget.costs if "uid 1234" in c.requested_ns_s]
    finally:
        manager.stop()

    # The trace has its interrupt time, every interval, NET_RX from its own datagrams.
    note = cap.stats[Track.FABRIC].note
    assert "interrupt" not in note, note
    intervals = [
        r for r in cap.records if isinstance(r, FabricDelta) and r.group == "interrupt time"
    ]
    assert len(intervals) >= 10, (len(intervals), note)
    assert sum(r.values.get("NET_RX", 0) for r in intervals) > 0
    assert all(r.device == "cpu" for r in intervals)
    # The step stayed in force for the collector: its series were not known meanwhile,
    # and once the trace ended the programs were detached again.
    assert held_after == ["irq.softirq_detached"]
    assert during and all(math.isnan(v) for v in during)
    assert not attached_after and times_after is None
    # Their cost while the trace ran was the requester's, never the agent's.
    assert charged > 0 and agent_threads_charged == 0
    for c in measured:
        assert not IRQ_FNS & set(c.bpf_ns_s), c.bpf_ns_s
