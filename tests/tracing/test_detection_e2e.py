"""Detection without anyone asking, proven on the real 4-rank job (`straggler_job`): the agent
(only its tracing component and the detection collector, every 5 s at its default
thresholds, but for a hang named after 15 s of no bytes instead of 30) watches the job; a
healthy stretch emits nothing; a CPU hog started at a random moment on rank 2's CPU makes it
emit "suspected" then "confirmed" for rank 2 only, within a bound; once the hog is gone,
"cleared". Then three hangs, each named once with the right rank and state within 45 s: a
rank stopped by SIGSTOP, a rank blocked reading its batch FIFO, a rank spinning inside its
step (last: it never comes back).

The events are read as a client reads them: `Detection.WatchEvents` over the agent's socket.
Each test prints what it measured (time from the hog's start to each event: run with ``-s``).

The machine is shared: another process busy on a rank's CPU holds that rank back exactly as
the hog does (seen: a rank's CPU wait at 1.2 thread-seconds per second against the others'
0.1 for 15 s, the whole job's throughput down 2.5 times, with no fault injected), and the
agent rightly reports it. So the healthy test measures that other work (`ForeignLoad`: each
CPU's busy time from /proc/stat less the job's own processes' there) and requires that every
suspicion in a healthy stretch came while other work took at least a fifth of the rank's CPU;
on a quiet machine that means none at all.

CPUs as in `test_straggler_verdict`: rank 2 alone on CPU 1 (the hog is pinned there), ranks 0,
1 and 3 share CPU 0.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import pytest
from detection_job import (
    CLEAR_WITHIN_S,
    CONFIRM_WITHIN_S,
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
from detection_job import all_clear as all_clear  # the detection benchmarks import it from here
from straggler_job import JOB_ID, StragglerJob, wait_for

from bpfdyno.rpc.detection import DetectionEvent, DetectionKind

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

HOG_RANK = 2
#: How long a healthy job is watched for a false alarm: eight intervals, four times the
#: two outlier intervals a suspicion needs.
HEALTHY_S = 40.0
#: [detection] hang_after_s of the test's agent: half the default, so each hang test waits
#: half as long; a healthy job moves bytes every step (~40 ms), so it is still far longer
#: than any phase without I/O.
HANG_AFTER_S = 15.0


def _shorter_hang_watch(job: StragglerJob, text: str) -> str:
    assert "[detection]" not in text
    return text + f"\n[detection]\nhang_after_s = {HANG_AFTER_S}\n"


@pytest.fixture(scope="module")
def job() -> Iterator[StragglerJob]:
    with detection_job(edit=_shorter_hang_watch) as j:
        yield j


@pytest.fixture(scope="module")
def watcher(job: StragglerJob) -> Iterator[Watcher]:
    with watching(job) as w:
        yield w


def test_a_healthy_job_emits_nothing_unless_other_work_holds_a_rank_back(
    job: StragglerJob, watcher: Watcher
) -> None:
    # The job's start (imports, rendezvous, first steps; a rank was seen held back then) is
    # not a healthy stretch: it begins once no rank is suspected.
    wait_all_clear(watcher, CLEAR_WITHIN_S)
    before = watcher.since(0.0)
    foreign = ForeignLoad(job)
    start = time.monotonic()
    try:
        time.sleep(HEALTHY_S)
    finally:
        foreign.close()
    events = watcher.since(start)
    print(f"while the job started:\n{describe(before, start)}")
    # Each suspicion's rank had other work on its CPU in the three intervals before it.
    held = {
        (at, e.rank): foreign.share(CPUS[e.rank], at - 15.0, at)
        for at, e in events
        if e.kind is not DetectionKind.CLEARED
    }
    worst = {c: max((s[c] for _, s in foreign.shares), default=0.0) for c in foreign.pids}
    print(
        f"healthy: {HEALTHY_S:.0f} s of 4 ranks, {len(events)} events; other work's largest "
        f"share of a second per CPU: {worst}\n{describe(events, start)}"
    )
    unexplained = {k: v for k, v in held.items() if v < FOREIGN_SHARE}
    assert unexplained == {}, describe(events, start)
    # A clearing only ever follows a suspicion of the same rank.
    suspected = set()
    for _, e in events:
        if e.kind is DetectionKind.CLEARED:
            assert e.rank in suspected
        else:
            suspected.add(e.rank)


def test_a_cpu_hog_makes_its_rank_suspected_then_confirmed_then_cleared(
    job: StragglerJob, watcher: Watcher
) -> None:
    # A rank other work held back before is cleared first.
    wait_all_clear(watcher, CLEAR_WITHIN_S)
    random_moment()
    with job.cpu_hog(HOG_RANK):
        t0 = time.monotonic()
        watcher.wait(
            DetectionKind.CONFIRMED, t0, CONFIRM_WITHIN_S, "the hogged rank to be confirmed"
        )
        t_end = time.monotonic()
    during = watcher.since(t0)
    print(f"hog on rank {HOG_RANK}:\n{describe(during, t0)}")
    kinds = [(e.kind, e.rank) for _, e in during]
    assert kinds == [(DetectionKind.SUSPECTED, HOG_RANK), (DetectionKind.CONFIRMED, HOG_RANK)]
    suspected, confirmed_ = (e for _, e in during)
    assert suspected.job_id == confirmed_.job_id == str(JOB_ID)
    assert confirmed_.pid == job.rank_pids[HOG_RANK]
    # Its threads waited for a CPU; its main thread, busy or waiting for a CPU while its
    # peers slept in the all-reduce, and its waits for its peers in gloo, the least of the
    # job's since they waited for it, may stand out as well (the latter may decide an
    # interval on its own: the CPU wait is seen in the suspected or the confirmed event).
    named = [e for ev in (suspected, confirmed_) for e in ev.evidence]
    assert {e.name for e in named} <= {"cpu_wait_share", "main_busy_share", "peer_wait_share"}
    wait = next(e for e in named if e.name == "cpu_wait_share")
    assert wait.value > wait.job_median + 0.05

    watcher.wait(
        DetectionKind.CLEARED, t_end, CLEAR_WITHIN_S, "the rank to be cleared once the hog is gone"
    )
    after = watcher.since(t_end)
    print(f"after the hog:\n{describe(after, t_end)}")
    assert [(e.kind, e.rank) for _, e in after] == [(DetectionKind.CLEARED, HOG_RANK)]
    times = {e.kind.value: at - t0 for at, e in during}
    print(
        f"time to detect: suspected {times['suspected']:.1f} s, confirmed "
        f"{times['confirmed']:.1f} s; cleared {after[0][0] - t_end:.1f} s after the hog ended"
    )


#: A hang is named within this: `HANG_AFTER_S` plus two intervals and a loaded machine's slack.
HANG_WITHIN_S = HANG_AFTER_S + 30.0


def wait_hang(watcher: Watcher, since: float) -> tuple[float, DetectionEvent]:
    watcher.wait(DetectionKind.HANG, since, HANG_WITHIN_S, "the hang to be named")
    time.sleep(6.0)  # one interval more: a second hang event would show here
    hangs = [(at, e) for at, e in watcher.since(since) if e.kind is DetectionKind.HANG]
    assert len(hangs) == 1, describe(hangs, since)
    return hangs[0]


def test_a_rank_stopped_by_sigstop_is_named_stopped(job: StragglerJob, watcher: Watcher) -> None:
    pid = job.rank_pids[1]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        at, e = wait_hang(watcher, t0)
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"stopped rank 1: named after {at - t0:.1f} s: {e.summary}")
    assert (e.rank, e.pid, e.hang_state) == (1, pid, "stopped")
    assert e.threads[0].tid == pid and e.threads[0].state == "T"
    assert "ranks 0, 2, 3 wait" in e.summary


def test_a_rank_blocked_reading_its_fifo_is_named_blocked_read(
    job: StragglerJob, watcher: Watcher
) -> None:
    feeder = job.feeders[3]
    t0 = time.monotonic()
    feeder.send("hold")  # rank 3's batches stop: it blocks reading its FIFO
    feeder.answer("held")
    try:
        at, e = wait_hang(watcher, t0)
    finally:
        feeder.send("go")
    print(f"rank 3 blocked on its FIFO: named after {at - t0:.1f} s: {e.summary}")
    assert (e.rank, e.hang_state) == (3, "blocked_read")
    main = e.threads[0]
    assert (main.state, main.waiting_on) == ("S", "pipe")
    assert main.syscall in ("read", "readv")
    assert main.wchan.endswith("pipe_read")


def _io_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith(("rchar", "wchar")))


def wait_moving(job: StragglerJob, moved: int, seconds: float) -> None:
    """Until the ranks moved ``moved`` bytes together and ``seconds`` went by."""
    t0 = time.monotonic()
    start = sum(_io_bytes(pid) for pid in job.rank_pids.values())
    wait_for(
        lambda: sum(_io_bytes(pid) for pid in job.rank_pids.values()) - start >= moved,
        120,
        "the job to move again",
        step=0.5,
    )
    time.sleep(max(0.0, t0 + seconds - time.monotonic()))


#: CPU time the spinning rank computes in one step: far longer than the test watches it (it
#: gets a share of a CPU, on a loaded machine a quarter), so it never finishes in the test;
#: the job is closed after this module, whose last test this is.
SPIN_MS = 600_000.0


def test_a_rank_spinning_on_its_cpu_is_named_spinning(job: StragglerJob, watcher: Watcher) -> None:
    pid = job.rank_pids[0]
    # The job moves again after the previous test's hang (re-arming the agent's hang watch)
    # for at least two of its intervals before this one begins: a hang that changed shape
    # without the job ever moving is the same hang, named once.
    wait_moving(job, 1 << 20, 10.0)
    t0 = time.monotonic()
    # Rank 0 computes inside its step without end: it never reaches the all-reduce, its
    # peers wait there, and no rank moves a byte. Last in the module: the rank does not come
    # back from this step (the knob is read at a step's start).
    with job.more_work(0, SPIN_MS):
        at, e = wait_hang(watcher, t0)
    print(f"spinning rank 0: named after {at - t0:.1f} s: {e.summary}")
    assert (e.rank, e.pid, e.hang_state) == (0, pid, "spinning")
    main = e.threads[0]
    assert (main.tid, main.state, main.syscall) == (pid, "R", "")
    assert main.oncpu_share >= 0.1
    assert "ranks 1, 2, 3 wait" in e.summary
