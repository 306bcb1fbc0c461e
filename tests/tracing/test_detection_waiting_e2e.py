"""Detection of a rank held back by its *input* on the real 4-rank job (`straggler_job`): its
feeder delivers each batch late, so the rank sleeps in read(2) while its peers sleep in gloo's
all-reduce waiting for it. Neither CPU wait nor the main thread's busy share tells it apart
(every rank sleeps); the time each rank's threads wait for their peers in gloo does: the late
rank waits least (`peer_wait_share`, docs/detection.md).

The agent runs the detection at its defaults (every 5 s, its thresholds, gloo's peer-wait
probes); the events are read as a client reads them (`WatchEvents`). The fault is started at
a random moment once no rank is suspected; it causes what the test measures whatever the
machine's load (the feeder sleeps 120 ms before each batch: the rank's wait, not its CPU).
Other work on a rank's CPU holds that rank back exactly as a fault does and the agent rightly
reports it (see `test_detection_e2e`): an event naming another rank is accepted only while
other work took at least a fifth of that rank's CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from detection_job import (
    CLEAR_WITHIN_S,
    CPUS,
    FOREIGN_SHARE,
    ForeignLoad,
    Watcher,
    describe,
    detection_job,
    random_moment,
    wait_all_clear,
    watching,
)
from straggler_job import StragglerJob

from bpfdyno.rpc.detection import DetectionKind

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

#: The rank whose feeder is slowed: it shares CPU 0 with two other ranks.
LATE_RANK = 1
#: The feeder's wait before each batch.
LATE_MS = 120.0
#: The bound from the fault's start to "confirmed": 3 outlier intervals of 5 s, the part of
#: an interval before the fault, gloo's probes' first interval, and a loaded machine's slack.
CONFIRM_WITHIN_S = 60.0
ALARMS = (DetectionKind.SUSPECTED, DetectionKind.CONFIRMED)


@pytest.fixture(scope="module")
def job() -> Iterator[StragglerJob]:
    with detection_job() as j:
        yield j


@pytest.fixture(scope="module")
def watcher(job: StragglerJob) -> Iterator[Watcher]:
    with watching(job) as w:
        yield w


def test_a_rank_whose_batches_come_late_is_confirmed_and_no_other(
    job: StragglerJob, watcher: Watcher
) -> None:
    # The job's start-up (imports, rendezvous, first steps) is over once no rank is suspected.
    wait_all_clear(watcher, 120)
    with ForeignLoad(job) as foreign:
        random_moment()
        with job.slow_batches(LATE_RANK, LATE_MS):
            t0 = time.monotonic()
            watcher.wait(
                DetectionKind.CONFIRMED,
                t0,
                CONFIRM_WITHIN_S,
                "the late rank to be confirmed",
                rank=LATE_RANK,
            )
            t_end = time.monotonic()
        during = watcher.since(t0)
        print(f"batches {LATE_MS:.0f} ms late on rank {LATE_RANK}:\n{describe(during, t0)}")
        mine = [(e.kind, e.rank) for _, e in during if e.rank == LATE_RANK]
        assert mine == [
            (DetectionKind.SUSPECTED, LATE_RANK),
            (DetectionKind.CONFIRMED, LATE_RANK),
        ]
        # Another rank named meanwhile only where other work held its CPU.
        others = {
            (round(at - t0, 1), e.rank): foreign.share(CPUS[e.rank], at - 15.0, at)
            for at, e in during
            if e.rank != LATE_RANK and e.kind in ALARMS
        }
        assert {k: v for k, v in others.items() if v < FOREIGN_SHARE} == {}, describe(during, t0)
        confirmed_ = next(e for _, e in during if e.kind is DetectionKind.CONFIRMED)
        assert confirmed_.pid == job.rank_pids[LATE_RANK]
        # It stood out by waiting least for its peers in gloo: more than the absolute floor
        # (0.1 thread-seconds per second) under the job's median in the deciding interval.
        evidence = {e.name: e for e in confirmed_.evidence}
        assert "peer_wait_share" in evidence, confirmed_.summary
        wait = evidence["peer_wait_share"]
        assert wait.job_median - wait.value > 0.1, confirmed_.summary
        assert "its peers waited for it" in confirmed_.summary

        watcher.wait(
            DetectionKind.CLEARED,
            t_end,
            CLEAR_WITHIN_S,
            "the rank to be cleared once its feeder is fast",
            rank=LATE_RANK,
        )
    times = {e.kind.value: at - t0 for at, e in during if e.rank == LATE_RANK}
    print(
        f"time to detect: suspected {times['suspected']:.1f} s, confirmed "
        f"{times['confirmed']:.1f} s"
    )
