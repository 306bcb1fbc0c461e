"""The scheduler collector with its real BPF programs in the running kernel.

Each test drives the kernel path on purpose (known sleeps, CPU contention on one pinned CPU,
exec of /bin/true) and checks the numbers the collector reports.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.core.events import KernelEvent
from bpfdyno.core.metrics import Sample
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.introspect import programs_still_loaded
from bpfdyno.ebpf.program import BpfProgram, bpf_source_dir
from bpfdyno.sources.perf.perf_event import online_cpus
from bpfdyno.sources.sched import collector as sched_mod
from bpfdyno.sources.sched.collector import ProcSched, SchedCollector

pytestmark = pytest.mark.root


class Sink:
    def __init__(self) -> None:
        self.events: list[KernelEvent] = []

    def __call__(self, events: list[KernelEvent]) -> None:
        self.events.extend(events)


@pytest.fixture(scope="module")
def header_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kheaders")


@pytest.fixture(scope="module")
def sink() -> Sink:
    return Sink()


@pytest.fixture(scope="module")
def sched(header_cache: Path, sink: Sink) -> Iterator[SchedCollector]:
    c = SchedCollector(sink=sink, header_cache=header_cache, stats_on_s=0.2, stats_period_s=0.5)
    c.start()
    yield c
    c.close()


def _values(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in samples if s.spec.name == name}


def _python(code: str, *prefix: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", textwrap.dedent(code)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_sleeping_process_is_blocked_for_its_sleeps(sched: SchedCollector) -> None:
    # Sleeps 5 x 100 ms, then waits on stdin: that wait has not ended at collection time,
    # so only the sleeps (and start-up I/O, if any) count as blocked.
    child = _python(
        """
        import sys, time
        for _ in range(5):
            time.sleep(0.1)
        print("done", flush=True)
        sys.stdin.readline()
        """
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "done"
        sched.collect()
        proc = sched.per_process()[child.pid]
    finally:
        child.communicate("\n", timeout=10)
    assert 0.45e9 <= proc.offcpu_blocked_ns <= 0.7e9
    assert proc.switches >= 5
    assert proc.comm.startswith("python")
    assert 0 < proc.oncpu_ns < 0.5e9


SPINNER = """
import sys, time
start, end = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(start - time.monotonic(), 0))
while time.monotonic() < end:
    pass
"""


def test_cpu_contention_shows_runqueue_latency_and_runnable_wait(
    sched: SchedCollector,
) -> None:
    # Three spinners share CPU 0 for the same second: each is either running or waiting
    # runnable in the run queue, never blocked, so its runnable wait is ~1 s minus its share.
    start = time.monotonic() + 0.6
    end = start + 1.0
    code = SPINNER + "\nprint('done', flush=True)\nsys.stdin.readline()\n"
    spinners = [
        subprocess.Popen(
            ["taskset", "-c", "0", sys.executable, "-c", code, str(start), str(end)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    try:
        time.sleep(max(start - 0.1 - time.monotonic(), 0))
        sched.collect()
        before = {p.pid: sched.per_process()[p.pid] for p in spinners}
        for p in spinners:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "done"
        samples = list(sched.collect())
        after = {p.pid: sched.per_process()[p.pid] for p in spinners}
    finally:
        for p in spinners:
            p.communicate("\n", timeout=10)
    q = _values(samples, "sched_runqueue_latency_seconds")
    assert q[(("quantile", "0.99"),)] > 0
    assert q[(("quantile", "0.99"),)] >= q[(("quantile", "0.5"),)]
    assert _values(samples, "sched_runqueue_latency_mean_seconds")[()] > 0
    oncpu = [after[pid].oncpu_ns - before[pid].oncpu_ns for pid in before]
    # One CPU for one second: together at most ~1 s (less when other work shares CPU 0).
    assert sum(oncpu) < 1.1e9
    assert all(t > 0 for t in oncpu)
    for pid in before:
        runnable = after[pid].offcpu_runnable_ns - before[pid].offcpu_runnable_ns
        runq = after[pid].runq_wait_ns - before[pid].runq_wait_ns
        assert runnable > 0.4e9
        assert runq >= runnable


def test_exec_and_exit_of_bin_true_are_seen_with_its_pid(sched: SchedCollector, sink: Sink) -> None:
    t0 = time.time_ns()
    true = subprocess.Popen(["/bin/true"])
    true.wait()
    false = subprocess.Popen(["/bin/false"])
    false.wait()
    t1 = time.time_ns()
    sched.collect()
    by_pid: dict[tuple[int, str], KernelEvent] = {(e.pid, e.kind): e for e in sink.events}
    exec_true = by_pid[(true.pid, "exec")]
    assert exec_true.comm == "true"
    assert exec_true.tid == true.pid
    assert exec_true.attrs["filename"] == "/bin/true"
    assert exec_true.attrs["ppid"] == os.getpid()
    assert t0 <= exec_true.ts_ns <= t1
    exit_true = by_pid[(true.pid, "exit")]
    assert (exit_true.attrs["exit_status"], exit_true.attrs["signal"]) == (0, 0)
    assert exec_true.ts_ns <= exit_true.ts_ns <= t1
    assert by_pid[(false.pid, "exit")].attrs["exit_status"] == 1
    # Exited processes leave the per-process table (and the kernel maps).
    assert true.pid not in sched.per_process()


def test_killed_process_reports_the_signal(sched: SchedCollector, sink: Sink) -> None:
    child = subprocess.Popen(["sleep", "30"])
    time.sleep(0.1)
    child.send_signal(signal.SIGKILL)
    child.wait()
    sched.collect()
    (ev,) = [e for e in sink.events if e.pid == child.pid and e.kind == "exit"]
    assert ev.attrs["signal"] == signal.SIGKILL


def test_host_wide_metrics(sched: SchedCollector) -> None:
    online = {str(c) for c in online_cpus()}
    # An idle tickless CPU may not switch at all in a short interval: give each one work.
    for cpu in sorted(online):
        subprocess.run(["taskset", "-c", cpu, "sleep", "0.01"], check=True)
    time.sleep(0.2)
    samples = list(sched.collect())
    switches = _values(samples, "sched_context_switches_per_second")
    assert {dict(k)["cpu"] for k in switches} == online
    assert all(v > 0 for v in switches.values())
    busy = _values(samples, "sched_cpu_busy_ratio")
    assert all(0 <= v <= 1 for v in busy.values())
    assert _values(samples, "sched_oncpu_seconds_per_second")[()] <= len(online) + 0.05
    dropped = _values(samples, "sched_dropped_total")
    assert set(dropped) == {
        (("reason", "thread_map_full"),),
        (("reason", "process_map_full"),),
        (("reason", "ringbuf_full"),),
    }
    assert all(v == 0 for v in dropped.values())
    assert _values(samples, "sched_tracked_threads")[()] > 0


def test_bpf_program_costs_are_reported(sched: SchedCollector) -> None:
    time.sleep(0.6)  # at least one stats window (0.2 s on every 0.5 s)
    samples = list(sched.collect())
    ns = _values(samples, "bpf_program_run_ns_per_event")
    rate = _values(samples, "bpf_program_runs_per_second")
    switch = (("program", "bpfdyno_switch"),)
    assert 0 < ns[switch] < 100_000
    assert rate[switch] > 0
    assert {dict(k)["program"] for k in rate} == {fn for _, fn in sched_mod.PROGRAMS}


def test_sweep_removes_entries_of_vanished_threads(sched: SchedCollector) -> None:
    threads = sched._require().table("bpfdyno_sthread")
    ghost = 2**22 + 123  # above PID_MAX_LIMIT: no thread can have this id
    threads[threads.Key(ghost)] = threads.Leaf()
    assert sched.sweep() >= 1
    assert ghost not in {k.value for k in threads}


def test_tiny_maps_count_their_losses_and_keep_working(header_cache: Path) -> None:
    sink = Sink()
    c = SchedCollector(
        sink=sink, max_threads=16, max_procs=2, ringbuf_pages=1, header_cache=header_cache
    )
    c.start()
    try:
        ids = c._require().program_ids()
        # 300 fork+exec+exit of /bin/true: 600 events for a 4 KiB ring buffer (~20 fit).
        subprocess.run(["sh", "-c", "for i in $(seq 300); do /bin/true; done"], check=True)
        # 40 live threads that keep switching: more than the 16 slots of the thread map,
        # however quiet the rest of the machine is.
        threads_code = (
            "import threading, time\n"
            "def spin():\n"
            "    for _ in range(20): time.sleep(0.005)\n"
            "ts = [threading.Thread(target=spin) for _ in range(40)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]\n"
        )
        subprocess.run([sys.executable, "-c", threads_code], check=True)
        samples = list(c.collect())
        dropped = {dict(k)["reason"]: v for k, v in _values(samples, "sched_dropped_total").items()}
        got = sum(1 for e in sink.events if e.comm == "true")
        assert dropped["ringbuf_full"] > 0
        assert got + dropped["ringbuf_full"] >= 600
        assert dropped["thread_map_full"] > 0
        assert _values(samples, "sched_tracked_threads")[()] <= 16
        assert list(c.collect())  # still collecting
    finally:
        c.close()
        c.close()  # idempotent
    assert programs_still_loaded(ids.values()) == set()


def test_close_detaches_everything(header_cache: Path) -> None:
    c = SchedCollector(header_cache=header_cache)
    c.start()
    ids = c._require().program_ids()
    assert set(ids) == {fn for _, fn in sched_mod.PROGRAMS}
    c.close()
    assert programs_still_loaded(ids.values()) == set()
    assert c.per_process() is None  # "unknown" for the process table, not zeros
    with pytest.raises(RuntimeError, match="not started"):
        c.collect()


def test_a_crashed_agent_leaves_nothing_attached(header_cache: Path) -> None:
    code = f"""
        import json, sys, time
        from pathlib import Path
        from bpfdyno.sources.sched.collector import SchedCollector
        c = SchedCollector(header_cache=Path({str(header_cache)!r}))
        c.start()
        print(json.dumps(c._require().program_ids()), flush=True)
        time.sleep(60)
        """
    child = _python(code)
    assert child.stdout is not None
    ids = json.loads(child.stdout.readline())
    assert len(ids) == len(sched_mod.PROGRAMS)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert programs_still_loaded(ids.values()) == set()


def test_per_process_snapshot_is_a_copy(sched: SchedCollector) -> None:
    snap = sched.per_process()
    assert all(isinstance(v, ProcSched) and v.tgid == k for k, v in snap.items())
    snap.clear()
    assert sched.per_process() != {}


def test_the_program_refuses_to_compile_without_its_settings(header_cache: Path) -> None:
    with pytest.raises(
        BpfLoadError,
        match="SCHED_MAX_THREADS, SCHED_MAX_PROCS and SCHED_RINGBUF_PAGES must be set with -D",
    ):
        BpfProgram.load("sched.bpf.c", flavour="btf", header_cache=header_cache)


def test_python_constants_match_the_c_header() -> None:
    header = (bpf_source_dir() / "sched.h").read_text()
    values = {m[1]: int(m[2]) for m in re.finditer(r"\b(SCHED_\w+)\s*=\s*(\d+)", header)}
    hist = re.search(r"#define SCHED_HIST_SLOTS (\d+)", header)
    assert hist is not None
    assert int(hist[1]) == sched_mod.SCHED_HIST_SLOTS
    for name in (
        "SCHED_EV_EXEC",
        "SCHED_EV_EXIT",
        "SCHED_ERR_THREAD_FULL",
        "SCHED_ERR_PROC_FULL",
        "SCHED_ERR_RINGBUF",
    ):
        assert values[name] == getattr(sched_mod, name), name
