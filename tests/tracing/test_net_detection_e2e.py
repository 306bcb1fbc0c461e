"""The network scores proven on the real 4-rank job (`straggler_job`): the agent runs the net
collector and the detection at their defaults; 20 ms of latency added to what one rank sends
(its link replaced by a wire that holds each frame: `StragglerJob.slow_link`), at a random
moment, makes that rank "suspected" then "confirmed" with the network RTT as its evidence,
and no other rank stands out in a network score; once the wire is gone, "cleared".

A rank held back by its link sleeps in the all-reduce like its peers: before the network
scores the detection found none of these injections (docs/detection.md).

The machine is shared: another process busy on a rank's CPU holds that rank back, and the
CPU scores rightly say so (see test_detection_e2e.py). Such an event for another rank is
allowed only with CPU evidence alone and while other work took at least a fifth of its CPU.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from detection_job import (
    CLEAR_WITHIN_S,
    CONFIRM_WITHIN_S,
    CPUS,
    FOREIGN_SHARE,
    ForeignLoad,
    describe,
    detection_job,
    random_moment,
    wait_all_clear,
    watching,
)
from straggler_job import JOB_ID, StragglerJob

from bpfdyno.rpc.detection import DetectionKind

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

#: The rank whose link is slowed (it shares CPU 0 with ranks 0 and 3).
SLOW_RANK = 1
DELAY_MS = 20.0
NETWORK_SCORES = {"net_rtt_ms", "net_retransmits"}


@pytest.fixture(scope="module")
def job() -> Iterator[StragglerJob]:
    # The net collector and the detection, both at their defaults.
    with detection_job(("net", "detection")) as j:
        yield j


def test_latency_on_one_rank_s_link_makes_it_confirmed_and_no_other_rank(
    job: StragglerJob,
) -> None:
    with watching(job) as watcher, ForeignLoad(job) as foreign:
        # The job's start-up (a rank was seen held back then) is over once none is suspected.
        wait_all_clear(watcher, 120)
        random_moment()
        with job.slow_link(SLOW_RANK, DELAY_MS):
            t0 = time.monotonic()
            watcher.wait(
                DetectionKind.CONFIRMED,
                t0,
                CONFIRM_WITHIN_S,
                "the slowed rank to be confirmed",
                rank=SLOW_RANK,
            )
            t_end = time.monotonic()
        during = watcher.since(t0)
        print(f"{DELAY_MS:g} ms on rank {SLOW_RANK}'s link:\n{describe(during, t0)}")
        mine = [e for _, e in during if e.rank == SLOW_RANK]
        assert [e.kind for e in mine][-1] is DetectionKind.CONFIRMED
        confirmed_ = mine[-1]
        assert confirmed_.job_id == str(JOB_ID)
        assert confirmed_.pid == job.rank_pids[SLOW_RANK]
        evidence = {e.name: e for e in confirmed_.evidence}
        assert "net_rtt_ms" in evidence, confirmed_.summary
        # The link's RTT is the added delay and more (the wire forwards frames from a
        # process); the job's median rank has its other links, not delayed.
        rtt = evidence["net_rtt_ms"]
        assert rtt.value >= DELAY_MS, confirmed_.summary
        assert rtt.job_median < DELAY_MS / 2, confirmed_.summary
        # No other rank stands out in a network score; CPU scores only where other work held
        # its CPU.
        for at, e in during:
            if e.rank == SLOW_RANK or e.kind is DetectionKind.CLEARED:
                continue
            names = {v.name for v in e.evidence}
            assert not names & NETWORK_SCORES, describe(during, t0)
            share = foreign.share(CPUS[e.rank], at - 15.0, at)
            assert share >= FOREIGN_SHARE, f"other work {share:.2f}:\n{describe(during, t0)}"

        watcher.wait(
            DetectionKind.CLEARED,
            t_end,
            CLEAR_WITHIN_S,
            "the rank to be cleared once the wire is gone",
            rank=SLOW_RANK,
        )
        times = {e.kind.value: at - t0 for at, e in during if e.rank == SLOW_RANK}
        cleared_at = (
            next(
                at
                for at, e in watcher.since(t_end)
                if e.rank == SLOW_RANK and e.kind is DetectionKind.CLEARED
            )
            - t_end
        )
        print(
            f"time to detect: suspected {times.get('suspected', float('nan')):.1f} s, "
            f"confirmed {times['confirmed']:.1f} s; RTT {rtt.value:.1f} ms against the "
            f"job's median {rtt.job_median:.1f} ms; cleared {cleared_at:.1f} s after "
            "the wire was removed"
        )
