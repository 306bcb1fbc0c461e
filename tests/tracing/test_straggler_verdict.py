"""The verdict proven with real faults: a 4-rank DDP job on gloo over TCP (one ``torchrun``
per rank, each rank in its own network namespace), traced by iterations through a real
agent with the net and sched kernel tracks, once healthy and once per fault, each fault on
one rank only (`straggler_job`):

- a busy process on the rank's CPU: that rank, late, waiting for a CPU, held by that process;
- packet loss on the rank's link: that rank, network loss;
- a data step that blocks on a slow read: that rank, late, blocked in readv(2) on its FIFO;
- a link that delays what the rank sends by 20 ms: that rank, slow network links (its
  connections' round trips);
- a CPU quota of 2 ms per 100 ms on the rank's process: that rank, throttled by its CPU
  quota, with no other task blamed;
- 40 ms more CPU work per step on a rank that shares its CPU with two others: that rank, its
  own work on a CPU, no other rank blamed for its waits;
- a rank reading 1 MiB a step past the page cache from a disk throttled to 5 MiB/s: that
  rank, uninterruptible disk reads (pread64);
- a rank in a memory cgroup of its own limited to 16 MiB while it reads samples of its
  64 MiB data file through the page cache: that rank, memory pressure, with its cgroup,
  limit hits and pages read again after reclaim;
- no fault: no straggler.

The wider matrix of faults, strengths and ranks is `tests/bench/bench_verdict_matrix.py`.

The job is started once for the module and every scenario runs against it in turn. Each
test prints the evidence behind its verdict (`describe`: run with ``-s`` to see the
margins of a healthy run).

CPUs: rank 2 alone on CPU 1 (the hog is pinned there), ranks 0, 1 and 3 share CPU 0. Their
steps are light (a tiny model, a 30 ms sleep), so sharing a CPU costs the healthy ranks a
few percent of each other's time at most, on a machine that other work loads too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from straggler_job import HOG_NAME, StragglerJob, Trace, describe, short_base

from bpfdyno.rpc.diagnosis import Finding

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

RANKS = 4
CPUS = (0, 0, 1, 0)
HOG_RANK, LOSS_RANK, READ_RANK = 2, 1, 3
LATENCY_RANK, QUOTA_RANK = 3, 1
WORK_RANK, DISK_RANK = 1, 3
MEMORY_RANK = 2
#: Its memory cgroup's limit, and the 64 KiB samples of its 64 MiB file it reads a step.
MEMORY_LIMIT, MEMORY_SAMPLES = 16 << 20, 300
#: The extra CPU time the working rank computes per step.
WORK_MS = 40.0
#: The throttled disk's read rate for its rank.
DISK_BYTES_PER_SECOND = 5 << 20
#: What the slow link adds to every packet the rank sends.
DELAY_MS = 20.0
#: The quota: CPU time per 100 ms period. At 5 ms the rank was late 12-17 % of the time in
#: 4 runs on rank 1, but not at all in 4 runs of the fault matrix on other ranks: its light
#: steps nearly fit in it. At 2 ms it cannot keep up.
QUOTA_US = 2000
#: Steps traced per scenario: one gloo all-reduce each.
ITERATIONS = 60
#: Packets the lossy rank receives that are dropped, per mille.
LOSS_PER_MILLE = 50


@pytest.fixture(scope="module")
def job() -> Iterator[StragglerJob]:
    if len(os.sched_getaffinity(0)) < 2 or not {0, 1} <= os.sched_getaffinity(0):
        pytest.fail("the straggler job pins its ranks to CPUs 0 and 1: it needs both")
    base = short_base()
    j = StragglerJob(base, RANKS, CPUS)
    try:
        j.start()
        yield j
    finally:
        j.close()
        shutil.rmtree(base, ignore_errors=True)


def the_straggler(trace: Trace) -> Finding:
    """The one rank the verdict names (failing with the evidence otherwise)."""
    print(describe(trace))
    assert len(trace.verdict.stragglers) == 1, describe(trace)
    return trace.verdict.stragglers[0]


def assert_every_rank_compared(trace: Trace) -> None:
    """Every rank's file read, with one gloo all-reduce per traced step, all matched.

    A rank's window may hold one all-reduce more, at its edge: seen once in a full CI run
    (the throttled-disk test, 61 in one file), where the file itself was not kept, so which
    edge is not known. The steps' collectives are still all matched across the ranks."""
    assert sorted(trace.evidence) == list(range(RANKS)), describe(trace)
    for ev in trace.evidence.values():
        assert ev.kernel_tracks == ("net", "sched")
        kinds = [(c.op, c.source) for c in ev.collectives]
        assert set(kinds) == {("allreduce", "gloo")}, (ev.path, kinds)
        assert ITERATIONS <= len(kinds) <= ITERATIONS + 1, (ev.path, len(kinds), describe(trace))
    assert trace.verdict.matched == ITERATIONS, describe(trace)


def assert_worst_inside_windows(trace: Trace, finding: Finding) -> None:
    """Each worst instance is a moment of the traced window, in its file's time base."""
    evs = trace.evidence.values()
    lo = min(ev.window_start_unix_ns for ev in evs)
    hi = max(ev.window_end_unix_ns for ev in evs)
    assert finding.worst, describe(trace)
    for w in finding.worst:
        assert lo <= w.start_unix_ns <= hi, (w, lo, hi)
    if finding.kind == "late":  # the rank's own file
        ev = trace.evidence[finding.rank]
        for w in finding.worst:
            assert abs(ev.base_ns + w.ts_us * 1000 - w.start_unix_ns) < 1000, w


def test_healthy_ranks_are_within_noise(job: StragglerJob) -> None:
    trace = job.trace("healthy", ITERATIONS)
    print(describe(trace))
    assert_every_rank_compared(trace)
    assert trace.verdict.within_noise and trace.verdict.stragglers == (), describe(trace)
    assert trace.verdict.headline.startswith("no straggler: the ranks are within noise")


def test_a_busy_process_on_a_rank_s_cpu(job: StragglerJob) -> None:
    with job.cpu_hog(HOG_RANK) as hog:
        trace = job.trace("cpu-hog", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (HOG_RANK, "late", job.rank_pids[HOG_RANK])
    assert f.causes[0].cause == "cpu_wait"
    # Of the tasks outside the rank that held its CPU while it waited, the hog held it most.
    # (The rank's own threads — gloo's loops, starved beside the hog — may come first on a
    # loaded machine: they are the rank's own work, not who held it back.)
    held = re.findall(r"([^,]+?) \(pid (\d+)\) \d+%", f.causes[0].detail.split(" held by ", 1)[1])
    outside = [(name.strip(), int(pid)) for name, pid in held if int(pid) != f.pid]
    assert outside and outside[0] == (HOG_NAME, hog.pid), f.causes[0].detail
    # (A worst interval names the task that ran just before the thread got its CPU back:
    # mostly the hog, sometimes the softirq thread that woke it.)
    assert f.worst[0].cause == "cpu_wait" and f.worst[0].detail.startswith("held by ")
    assert_worst_inside_windows(trace, f)


def test_packet_loss_on_a_rank_s_link(job: StragglerJob) -> None:
    with job.packet_loss(LOSS_RANK, LOSS_PER_MILLE):
        trace = job.trace("loss", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (LOSS_RANK, "network", job.rank_pids[LOSS_RANK])
    assert f.causes[0].cause == "network_loss"
    # Only this rank's packets were dropped: the lost packets' connections are its own. (A
    # retransmit between two other ranks counts too if the kernel did not report the copy
    # its peer dropped: never seen in 13 runs, allowed for 1 in 20.)
    detail = f.causes[0].detail
    m = re.search(r"rank (\d+) is on (\d+) of the (\d+) lost packets' connections", detail)
    assert m is not None and int(m[1]) == LOSS_RANK, detail
    assert int(m[2]) >= 0.95 * int(m[3]), detail
    assert_worst_inside_windows(trace, f)


def test_a_data_step_blocked_on_a_slow_read(job: StragglerJob) -> None:
    with job.slow_batches(READ_RANK):
        trace = job.trace("slow-read", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (READ_RANK, "late", job.rank_pids[READ_RANK])
    # Its main thread blocked reading the FIFO: readv(2) on a pipe.
    assert (f.causes[0].cause, f.causes[0].detail) == ("io_wait", "readv")
    w = f.worst[0]
    assert (w.cause, w.detail, w.tid) == ("io_wait", "readv", job.rank_pids[READ_RANK])
    assert_worst_inside_windows(trace, f)

    # The same files through the command line: the ranks side by side, the blocked one's
    # "io wait" standing out, and the same verdict.
    r = subprocess.run(
        [sys.executable, "-m", "bpfdyno", "trace-summary", *trace.paths],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    heads = [f"rank {rank} / pid {job.rank_pids[rank]}" for rank in range(RANKS)]
    assert re.fullmatch(r"\s+" + r"\s+".join(map(re.escape, heads)), lines[0]), r.stdout
    [io_wait] = [line for line in lines if line.startswith("  blocked: io wait")]
    cells = re.split(r"\s{2,}", io_wait.strip())[1:]
    assert [c.endswith(" !") for c in cells] == [rank == READ_RANK for rank in range(RANKS)], (
        r.stdout
    )
    assert f"verdict: {trace.verdict.headline}" in lines, r.stdout


def test_added_latency_on_a_rank_s_link(job: StragglerJob) -> None:
    with job.slow_link(LATENCY_RANK, DELAY_MS):
        trace = job.trace("latency", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (LATENCY_RANK, "latency", job.rank_pids[LATENCY_RANK])
    assert f.causes[0].cause == "network_latency"
    # Its connections' round trips: the link's 20 ms and more (the wire's own turn).
    m = re.match(
        r"round trips of ([0-9.]+) ms on rank (\d+)(?: on \S+)?'s connections", f.causes[0].detail
    )
    assert m is not None and int(m[2]) == LATENCY_RANK, f.causes[0].detail
    assert DELAY_MS <= float(m[1]) <= 3 * DELAY_MS, f.causes[0].detail
    assert 0 < f.share <= 1


def test_a_cpu_quota_on_a_rank(job: StragglerJob) -> None:
    with job.cpu_quota(QUOTA_RANK, QUOTA_US) as cgroup:
        trace = job.trace("cpu-quota", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (QUOTA_RANK, "late", job.rank_pids[QUOTA_RANK])
    assert f.causes[0].cause == "cpu_quota"
    assert re.match(
        rf"cgroup /{cgroup.name}: (\d+) periods of (\d+) throttled, .*; quota 2 ms per 100 ms",
        f.causes[0].detail,
    ), f.causes[0].detail
    # The waits were the quota's: no task that ran meanwhile is named for them.
    assert all(c.cause != "cpu_wait" or "held by" not in c.detail for c in f.causes)
    assert all(not w.detail.startswith("held by") for w in f.worst), f.worst
    assert_worst_inside_windows(trace, f)


def test_more_work_per_step_on_a_rank(job: StragglerJob) -> None:
    with job.more_work(WORK_RANK, WORK_MS):
        trace = job.trace("more-work", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (WORK_RANK, "late", job.rank_pids[WORK_RANK])
    assert f.causes[0].cause == "on_cpu", describe(trace)
    m = re.match(r"ran ([0-9.]+) (ms|s) longer than the other ranks", f.causes[0].detail)
    assert m is not None, f.causes[0].detail
    ran = float(m[1]) * (1.0 if m[2] == "s" else 1e-3)
    # At least the extra work of most traced steps (the first may predate the window).
    assert ran >= 0.8 * ITERATIONS * WORK_MS / 1000, f.causes[0].detail
    # No rank of the job (the others, taking the CPU in turn, or its own threads) is named
    # as holding its CPU.
    waits = " ".join(c.detail for c in f.causes if c.cause == "cpu_wait")
    assert not any(f"(pid {pid})" in waits for pid in job.rank_pids.values()), waits
    assert 0 < f.share <= 1


def test_a_throttled_disk_under_a_rank_s_reads(job: StragglerJob) -> None:
    with job.throttled_disk(DISK_RANK, DISK_BYTES_PER_SECOND):
        trace = job.trace("throttled-disk", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (DISK_RANK, "late", job.rank_pids[DISK_RANK])
    cause = f.causes[0]
    syscall, _, said = cause.detail.partition(", ")
    assert (cause.cause, syscall) == ("disk", "pread64"), describe(trace)
    # The kernel's work on its CPU in the reads (reading past the page cache), and under load
    # the reads' wake-ups' waits for the CPU the job's own threads hold: said beside the
    # system call, in that order, and counted with the disk (the reads' own sake).
    time = r"[0-9.]+ (µs|ms|s)"
    said = re.sub(rf"^{time} of it on its CPU in the reads(, |$)", "", said)
    assert not said or re.fullmatch(rf"waited {time} for the CPU held by .+", said), cause.detail
    # 1 MiB a step at 5 MiB/s: 200 ms of each step in the disk's queue, most of the time lost.
    assert f.causes[0].seconds >= 0.5 * f.seconds, describe(trace)
    assert_worst_inside_windows(trace, f)


def test_a_memory_limit_below_a_rank_s_working_set(job: StragglerJob) -> None:
    with job.memory_limit(MEMORY_RANK, MEMORY_LIMIT, MEMORY_SAMPLES) as cgroup:
        trace = job.trace("memory-limit", ITERATIONS)
    assert_every_rank_compared(trace)
    f = the_straggler(trace)
    assert (f.rank, f.kind, f.pid) == (MEMORY_RANK, "late", job.rank_pids[MEMORY_RANK])
    first = f.causes[0]
    assert first.cause == "memory", describe(trace)
    # The rank's own cgroup, its limit, and the kernel's counts: the limit hit and pages
    # read again after reclaim evicted them (the file's 64 MiB through 16 MiB).
    m = re.match(
        rf"cgroup /{cgroup.name} at its 16.0 MiB limit (\d+) times: (\d+) pages read again "
        r"after reclaim",
        first.detail,
    )
    assert m is not None, first.detail
    assert int(m[1]) > 0 and int(m[2]) > 0, first.detail
    assert first.seconds >= 0.5 * f.seconds, describe(trace)
    assert 0 < f.share <= 1
