"""CPU-quota throttling of traced processes (`bpfdyno.tracing.capture.cpu_quota`): the
counters of a process's cgroups with a quota, from fixture trees of both cgroup versions
(exact values), then a real cgroup v1 quota on a busy process of this machine, and the
counters and totals it becomes in the trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.core.config import load
from bpfdyno.tracing.capture.cpu_quota import CpuQuotaReader
from bpfdyno.tracing.capture.manager import CaptureKey, CaptureManager
from bpfdyno.tracing.capture.records import (
    CpuQuotaSample,
    KernelTrackRequest,
    OffCpu,
    ProcessCapture,
    Track,
)
from bpfdyno.tracing.capture.tracks import Window, build_tracks


def tree(tmp_path: Path, mount_line: str, cgroup_line: str) -> Path:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(
        "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n" + mount_line
    )
    (proc / "77").mkdir()
    (proc / "77" / "cgroup").write_text(cgroup_line)
    return proc


def files(d: Path, **contents: str) -> None:
    d.mkdir(parents=True, exist_ok=True)
    for name, text in contents.items():
        (d / name.replace("_", ".", 1)).write_text(text)


def test_v2_the_process_s_cgroup_and_an_ancestor_with_quotas(tmp_path: Path) -> None:
    mnt = tmp_path / "cg2"
    files(mnt, cgroup_controllers="cpuset cpu io memory pids\n")
    # The pod has a quota, its container too, the slice above them none.
    files(mnt / "kubepods", cpu_max="max 100000\n")
    files(
        mnt / "kubepods" / "pod1",
        cpu_max="200000 100000\n",
        cpu_stat="usage_usec 9\nnr_periods 40\nnr_throttled 12\nthrottled_usec 950000\n",
    )
    files(
        mnt / "kubepods" / "pod1" / "c2",
        cpu_max="50000 100000\n",
        cpu_stat="usage_usec 5\nnr_periods 30\nnr_throttled 25\nthrottled_usec 2175000\n"
        "nr_bursts 0\nburst_usec 0\n",
    )
    proc = tree(
        tmp_path,
        f"41 31 0:38 / {mnt} rw - cgroup2 cgroup2 rw\n",
        "0::/kubepods/pod1/c2\n",
    )
    r = CpuQuotaReader(proc)
    assert r.cgroup_of(77) == "/kubepods/pod1/c2"
    got = [(s.cgroup, s.quota_us, s.period_us, s.periods, s.throttled_periods, s.throttled_ns)
           for s in r.sample(77)]  # fmt: skip
    assert got == [
        ("/kubepods/pod1/c2", 50000, 100000, 30, 25, 2_175_000_000),
        ("/kubepods/pod1", 200000, 100000, 40, 12, 950_000_000),
    ]
    assert r.sample(78) == []  # no such process


def test_v1_the_cpu_controller_s_hierarchy(tmp_path: Path) -> None:
    mnt = tmp_path / "cpu"
    files(mnt / "job", cpu_cfs_quota_us="-1\n", cpu_cfs_period_us="100000\n")
    files(
        mnt / "job" / "rank1",
        cpu_cfs_quota_us="10000\n",
        cpu_cfs_period_us="100000\n",
        cpu_stat="nr_periods 11\nnr_throttled 10\nthrottled_time 880000123\nnr_bursts 0\n",
    )
    proc = tree(
        tmp_path,
        f"32 31 0:29 / {mnt} rw,relatime - cgroup cgroup rw,cpu\n",
        "4:memory:/other\n1:cpu:/job/rank1\n0::/\n",
    )
    [s] = CpuQuotaReader(proc).sample(77)
    assert (s.cgroup, s.quota_us, s.period_us, s.periods, s.throttled_periods, s.throttled_ns) == (
        "/job/rank1",
        10000,
        100000,
        11,
        10,
        880_000_123,
    )


def test_no_cpu_controller_no_samples(tmp_path: Path) -> None:
    proc = tree(tmp_path, "", "0::/\n")
    assert CpuQuotaReader(proc).sample(77) == []


def sample(ts_ms: int, periods: int, throttled: int, ms: int) -> CpuQuotaSample:
    return CpuQuotaSample(ts_ms * 1_000_000, "/job/r1", 10000, 100000, periods, throttled,
                          ms * 1_000_000)  # fmt: skip


def test_the_trace_holds_what_the_window_added() -> None:
    """Counters from the last sample before the window (zero there) to the first after it;
    the info slice's totals are the difference."""
    cap = ProcessCapture(
        pid=5, request=KernelTrackRequest(frozenset({Track.SCHED})), begin_ns=0,
        end_ns=10**9, begin_wall_ns=0, offset_ns=0, drift_ns=0,
        records=[sample(0, 3, 1, 50), sample(100, 4, 2, 140), sample(300, 6, 4, 320),
                 sample(500, 8, 6, 500), sample(700, 10, 8, 690)],
        stats={}, dropped_over_cap=0, cap=100,
    )  # fmt: skip
    built = build_tracks(cap, 0, Window(150_000_000, 450_000_000, "kineto"), [Track.SCHED])
    evs = [json.loads(e) for e in built.events]
    counters = [(e["ts"], e["args"]) for e in evs if e["ph"] == "C"]
    assert counters == [
        (150000.0, {"periods": 0, "throttled_periods": 0, "throttled_ms": 0.0}),
        (300000.0, {"periods": 2, "throttled_periods": 2, "throttled_ms": 180.0}),
        (450000.0, {"periods": 4, "throttled_periods": 4, "throttled_ms": 360.0}),
    ]
    assert built.info["sched_cpu_quota"] == [
        {"cgroup": "/job/r1", "quota_us": 10000, "period_us": 100000, "periods": 4,
         "throttled_periods": 4, "throttled_ms": 360.0}
    ]  # fmt: skip


SPIN = "import sys\nprint('spinning', flush=True)\nwhile True:\n    pass\n"


@pytest.fixture
def quota_cgroup() -> Iterator[Path]:
    """A cgroup v1 cpu cgroup of this test with 10 ms of CPU per 100 ms period."""
    root = Path("/sys/fs/cgroup/cpu")
    if not (root / "cpu.cfs_quota_us").exists():
        pytest.fail("this test needs the cgroup v1 cpu controller at /sys/fs/cgroup/cpu")
    d = root / f"bdq{os.getpid()}"
    d.mkdir()
    try:
        (d / "cpu.cfs_period_us").write_text("100000")
        (d / "cpu.cfs_quota_us").write_text("10000")
        yield d
    finally:
        for pid in (d / "cgroup.procs").read_text().split():
            (root / "cgroup.procs").write_text(pid)
        d.rmdir()


@pytest.mark.root
def test_a_busy_process_under_a_quota_is_throttled_every_period(quota_cgroup: Path) -> None:
    """A spinning process with 10 ms of CPU per 100 ms: nearly every period of the second it
    is traced is throttled, for about 90 ms each (less when the loaded machine gives it its
    10 ms late); its threads' preempted intervals show the period's signature."""
    spinner = subprocess.Popen([sys.executable, "-c", SPIN], stdout=subprocess.PIPE, text=True)
    m = CaptureManager(load(None).capture)
    m.start()
    try:
        assert spinner.stdout is not None and spinner.stdout.readline() == "spinning\n"
        (quota_cgroup / "cgroup.procs").write_text(str(spinner.pid))
        assert m.wait_loaded(120)
        key = CaptureKey("t", spinner.pid)
        m.begin(key, KernelTrackRequest(frozenset({Track.SCHED}))).result(30)
        time.sleep(1.0)
        cap = m.end(key).result(60)
    finally:
        m.stop()
        spinner.kill()
        spinner.wait(10)
    samples = [r for r in cap.records if isinstance(r, CpuQuotaSample)]
    name = f"/{quota_cgroup.name}"
    assert {(s.cgroup, s.quota_us, s.period_us) for s in samples} == {(name, 10000, 100000)}
    assert len(samples) >= 5  # at the start, every drain (0.1 s), at the end
    first, last = samples[0], samples[-1]
    periods = last.periods - first.periods
    throttled = last.throttled_periods - first.throttled_periods
    assert 8 <= periods <= 13, samples
    assert throttled >= periods - 2, samples
    assert last.throttled_ns - first.throttled_ns >= throttled * 50_000_000, samples
    # The quota's signature on the sched track: preempted (runnable) for most of a period.
    waits = [r.on_ns - r.off_ns for r in cap.records if isinstance(r, OffCpu) and r.runnable]
    assert sum(70_000_000 <= w <= 100_000_000 for w in waits) >= throttled // 2, sorted(waits)
