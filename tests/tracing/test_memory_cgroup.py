"""Memory pressure on traced processes (`bpfdyno.tracing.capture.memory_cgroup`): the reclaim
counters of a process's memory cgroups with a limit, from fixture trees of both cgroup
versions (exact values), what the window added as the trace's info slice says it, and the
rank's evidence read back from such a file."""

from __future__ import annotations

import json
from pathlib import Path

from test_cpu_quota import files, tree

from bpfdyno.analysis.summary import summarize_file
from bpfdyno.rpc.diagnosis import MemoryCgroup
from bpfdyno.tracing.capture.memory_cgroup import MemoryCgroupReader
from bpfdyno.tracing.capture.records import (
    KernelTrackRequest,
    MemoryCgroupSample,
    ProcessCapture,
    Track,
)
from bpfdyno.tracing.capture.tracks import Window, build_tracks

V1_STAT = (
    "cache 1\nrss 2\nworkingset_refault_anon 0\nworkingset_refault_file 7\npgmajfault 1\n"
    "total_cache 3\ntotal_workingset_refault_anon 2\ntotal_workingset_refault_file 4100\n"
    "total_pgmajfault 35\n"
)


def test_v1_the_memory_controller_s_hierarchy(tmp_path: Path) -> None:
    mnt = tmp_path / "memory"
    # The job's cgroup has no limit (the kernel's "unlimited"), the rank's has 48 MiB.
    files(mnt / "job", memory_limit_in_bytes="9223372036854771712\n", memory_failcnt="0\n",
          memory_stat=V1_STAT)  # fmt: skip
    files(mnt / "job" / "rank1", memory_limit_in_bytes=f"{48 << 20}\n",
          memory_failcnt="5230\n", memory_stat=V1_STAT)  # fmt: skip
    proc = tree(
        tmp_path,
        f"32 31 0:29 / {mnt} rw,relatime - cgroup cgroup rw,memory\n",
        "4:memory:/job/rank1\n1:cpu:/\n0::/\n",
    )
    [s] = MemoryCgroupReader(proc).sample(77)
    # v1's total_* counters: the cgroup's own and its children's.
    assert s == MemoryCgroupSample(s.ts_ns, "/job/rank1", 48 << 20, 5230, 4102, 35, 0)
    assert MemoryCgroupReader(proc).sample(78) == []  # no such process


def test_v2_memory_high_events_and_pressure(tmp_path: Path) -> None:
    mnt = tmp_path / "cg2"
    files(mnt, cgroup_controllers="cpuset cpu io memory pids\n")
    files(mnt / "pod", memory_high="max\n", memory_max="max\n", memory_stat="pgmajfault 9\n",
          memory_events="low 0\nhigh 0\nmax 0\noom 0\n",
          memory_pressure="some avg10=0.00 avg60=0.00 avg300=0.00 total=10\n")  # fmt: skip
    files(
        mnt / "pod" / "c1",
        memory_high=f"{64 << 20}\n",
        memory_max=f"{80 << 20}\n",
        memory_stat="anon 5\nworkingset_refault_anon 3\nworkingset_refault_file 900\n"
        "pgmajfault 12\n",
        memory_events="low 0\nhigh 1400\nmax 2\noom 0\noom_kill 0\n",
        memory_pressure="some avg10=1.50 avg60=0.40 avg300=0.10 total=2500000\n"
        "full avg10=1.00 avg60=0.20 avg300=0.05 total=1900000\n",
    )
    proc = tree(tmp_path, f"41 31 0:38 / {mnt} rw - cgroup2 cgroup2 rw\n", "0::/pod/c1\n")
    [s] = MemoryCgroupReader(proc).sample(77)
    # The lower of memory.high and memory.max; high + max events; "some" stall time.
    assert s == MemoryCgroupSample(s.ts_ns, "/pod/c1", 64 << 20, 1402, 903, 12, 2_500_000_000)


def test_the_trace_holds_what_the_window_added_and_the_evidence_reads_it(tmp_path: Path) -> None:
    def at(ms: int, hits: int, refaults: int, majors: int) -> MemoryCgroupSample:
        return MemoryCgroupSample(ms * 1_000_000, "/job/r1", 48 << 20, hits, refaults, majors, 0)

    cap = ProcessCapture(
        pid=5, request=KernelTrackRequest(frozenset({Track.SCHED})), begin_ns=0,
        end_ns=10**9, begin_wall_ns=0, offset_ns=0, drift_ns=0,
        records=[at(0, 100, 10, 1), at(100, 150, 400, 2), at(300, 900, 5000, 4),
                 at(500, 1600, 9000, 6), at(700, 2000, 12000, 9)],
        stats={}, dropped_over_cap=0, cap=100,
    )  # fmt: skip
    built = build_tracks(cap, 0, Window(150_000_000, 450_000_000, "kineto"), [Track.SCHED])
    # From the last sample before the window (100 ms) to the first after it (500 ms).
    assert built.info["sched_memory_cgroups"] == [
        {"cgroup": "/job/r1", "limit_bytes": 48 << 20, "limit_hits": 1450, "refaults": 8600,
         "major_faults": 4, "stall_ms": 0.0}
    ]  # fmt: skip
    span = {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
            "tid": "x", "ts": 0.0, "dur": 300_000.0}  # fmt: skip
    doc = {"baseTimeNanoseconds": 150_000_000,
           "traceEvents": [span, *(json.loads(e) for e in built.events)]}  # fmt: skip
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    s = summarize_file(str(path))
    assert s.evidence is not None
    assert s.evidence.memory_cgroups == (MemoryCgroup("/job/r1", 48 << 20, 1450, 8600, 4, 0.0),)
