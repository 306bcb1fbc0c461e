"""While the detection watches a job, the budget must not blind it: the net parts its network
scores read are needed (`bpfdyno.app.assembly.detection_needs`), and the daemon's slower
collection leaves its interval alone."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from bpfdyno.app.assembly import Assembly, bind_daemon, detection_needs
from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon, SlowerCollection
from bpfdyno.core.config import load
from bpfdyno.detection.collector import DetectionCollector
from bpfdyno.detection.events import EventLog
from bpfdyno.detection.signals import RankProcess
from bpfdyno.sources.budget.controller import BudgetCollector


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    # Ranks as the detection knows them: RANK in their environment.
    procs = [
        subprocess.Popen(["sleep", "120"], env={**os.environ, "RANK": str(r)}) for r in range(3)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_the_net_parts_are_needed_while_ranks_are_watched_and_only_then(
    sleepers: list[int],
) -> None:
    watched: list[RankProcess] = []
    detection = DetectionCollector(lambda: watched, EventLog(), "node-a")
    detection.collect()
    assert detection.watching() == ""
    assert detection_needs(detection) == {}
    watched += [RankProcess(pid, "1818") for pid in sleepers[:2]]
    watched.append(RankProcess(sleepers[2], "77"))
    detection.collect()  # a rank's signals are over an interval: from its second round on
    assert detection.watching() == ""
    time.sleep(0.05)
    detection.collect()
    who = "detection watching jobs 1818, 77 (3 ranks)"
    assert detection.watching() == who
    assert detection_needs(detection) == {
        "net.rtt_detached": who,
        "net.tcp_events_detached": who,
        "net.connections_detached": who,
    }
    watched.clear()
    detection.collect()
    assert detection_needs(detection) == {}


async def test_the_slower_collection_leaves_the_detection_s_interval() -> None:
    """The budget's last resort makes every collector's interval 4x longer: the detection's
    5 s became 20 s, and a straggler under a storm was noticed that much later."""
    cfg = load(None)
    detection = DetectionCollector(lambda: [], EventLog(), "node-a")
    sched = DetectionCollector(lambda: [], EventLog(), "node-a")
    sched.name = "sched"
    budget = BudgetCollector(cfg.budget)
    asm = Assembly(collectors=[detection, sched, budget], budget=budget)
    daemon = Daemon(cfg, asm.collectors, catalog=CATALOG)
    bind_daemon(asm, daemon)
    [slower] = [s for s in budget._steps() if s.name == "daemon.slower_collection"]
    slower.apply()
    factors = {r.name: r.interval_factor for r in daemon.runners}
    assert factors == {"detection": 1, "sched": SlowerCollection.FACTOR, "budget": 1}
    slower.undo()
    assert {r.interval_factor for r in daemon.runners} == {1}
