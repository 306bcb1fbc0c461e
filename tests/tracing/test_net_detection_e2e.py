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

import random
import shutil
import time
from collections.abc import Iterator

import pytest
from straggler_job import JOB_ID, StragglerJob, short_base, wait_for
from test_detection_e2e import (
    CLEAR_WITHIN_S,
    CONFIRM_WITHIN_S,
    CPUS,
    FOREIGN_SHARE,
    RANKS,
    ForeignLoad,
    Watcher,
    all_clear,
    describe,
)

from bpfdyno.rpc.detection import DetectionKind

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

#: The rank whose link is slowed (it shares CPU 0 with ranks 0 and 3).
SLOW_RANK = 1
DELAY_MS = 20.0
NETWORK_SCORES = {"net_rtt_ms", "net_retransmits"}


@pytest.fixture(scope="module")
def job() -> Iterator[StragglerJob]:
    base = short_base()
    j = StragglerJob(base, RANKS, CPUS)
    # The harness's agent runs no collector; this one runs the net collector and the
    # detection, both at their defaults.
    text = j.agent.config.read_text()
    enabled = text
    for name in ("net", "detection"):
        enabled = enabled.replace(
            f"[collectors.{name}]\nenabled = false", f"[collectors.{name}]\nenabled = true"
        )
    assert enabled.count("enabled = true") == text.count("enabled = true") + 2
    j.agent.config.write_text(enabled)
    try:
        j.start()
        yield j
    finally:
        j.close()
        shutil.rmtree(base, ignore_errors=True)


def test_latency_on_one_rank_s_link_makes_it_confirmed_and_no_other_rank(
    job: StragglerJob,
) -> None:
    watcher = Watcher(str(job.agent.sock))
    foreign = ForeignLoad(job)
    try:
        # The job's start-up (a rank was seen held back then) is over once none is suspected.
        wait_for(lambda: all_clear(watcher), 120, "no rank suspected", step=0.5)
        time.sleep(random.uniform(0.0, 5.0))  # a random moment within the detection's interval
        with job.slow_link(SLOW_RANK, DELAY_MS):
            t0 = time.monotonic()

            def confirmed() -> bool:
                return any(
                    e.kind is DetectionKind.CONFIRMED and e.rank == SLOW_RANK
                    for _, e in watcher.since(t0)
                )

            wait_for(confirmed, CONFIRM_WITHIN_S, "the slowed rank to be confirmed", step=0.2)
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

        def cleared() -> bool:
            return any(
                e.kind is DetectionKind.CLEARED and e.rank == SLOW_RANK
                for _, e in watcher.since(t_end)
            )

        wait_for(cleared, CLEAR_WITHIN_S, "the rank to be cleared once the wire is gone", step=0.2)
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
    finally:
        watcher.close()
        foreign.close()
