"""The scheduler collector with its real BPF programs in the running kernel.

Each test drives the kernel path on purpose (known sleeps, CPU contention on one pinned CPU,
threads that burn CPU and exit, exec of /bin/true) and checks the numbers the collector
reports, against the workload and against the kernel's own per-task accounting
(``/proc/PID/task/TID/schedstat``: on-CPU ns, run-queue wait ns, timeslices). At the end, the
overhead budget's steps: with exec/exit detached a process's times never go down and the
exec/exit rates are not known; the switch program held off counts nothing and, attached
again, credits no task with the gap it did not see.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bpfdyno.core.budget import Reduction
from bpfdyno.core.events import KernelEvent
from bpfdyno.core.metrics import Sample
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.introspect import programs_still_loaded
from bpfdyno.ebpf.program import BpfProgram, bpf_source_dir
from bpfdyno.ebpf.reductions import SampledFunctions
from bpfdyno.sources.perf.perf_event import online_cpus
from bpfdyno.sources.sched import collector as sched_mod
from bpfdyno.sources.sched.collector import ProcSched, SchedCollector

pytestmark = pytest.mark.root

ALL_PROGRAMS = {fn for _, fn in sched_mod.PROGRAMS} | {sched_mod.ITERATOR}


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
    # A ring buffer for ~6000 events: other test suites on a shared machine may start
    # thousands of processes a second, and this module's events must not be crowded out.
    c = SchedCollector(
        sink=sink,
        header_cache=header_cache,
        ringbuf_pages=256,
        stats_on_s=0.2,
        stats_period_s=0.5,
    )
    c.start()
    yield c
    c.close()


def _values(samples: list[Sample], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in samples if s.spec.name == name}


def _python(code: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*prefix, sys.executable, "-c", textwrap.dedent(code), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.01)


def asleep(pid: int) -> bool:
    """Every thread of ``pid`` is sleeping (its books are at rest)."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes()
        except FileNotFoundError:
            return False  # a thread is exiting: not at rest yet
        states.append(raw[raw.rfind(b")") + 2 : raw.rfind(b")") + 3])
    return all(s == b"S" for s in states)


def kernel_books(pid: int) -> tuple[int, int, int]:
    """(on-CPU ns, run-queue wait ns, timeslices) summed over the live threads of ``pid``."""
    total = [0, 0, 0]
    for tid in os.listdir(f"/proc/{pid}/task"):
        for i, v in enumerate(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()):
            total[i] += int(v)
    return total[0], total[1], total[2]


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of ``pid``'s live threads (/proc status)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                total += int(line.split()[1])
    return total


def reading(sched: SchedCollector, pid: int) -> tuple[ProcSched, float, float]:
    """One collection: ``pid``'s times and the monotonic interval the reading was taken in."""
    t0 = time.monotonic()
    sched.collect()
    t1 = time.monotonic()
    procs = sched.per_process()
    assert procs is not None
    return procs[pid], t0, t1


def lifetime(p: ProcSched) -> int:
    return p.oncpu_ns + p.runq_wait_ns + p.offcpu_blocked_ns


SLEEPER = """
import sys, time
sys.stdin.readline()
for _ in range(5):
    time.sleep(0.1)
print("done", flush=True)
sys.stdin.readline()
"""


def test_sleeping_process_is_blocked_for_its_sleeps(sched: SchedCollector) -> None:
    child = _python(SLEEPER)
    try:
        assert child.stdout is not None and child.stdin is not None
        wait_for(lambda: asleep(child.pid))
        a, a0, a1 = reading(sched, child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        wait_for(lambda: asleep(child.pid))
        b, b0, b1 = reading(sched, child.pid)
        books = kernel_books(child.pid)
        switches = context_switches(child.pid)
    finally:
        child.communicate("\n", timeout=10)
    blocked = b.offcpu_blocked_ns - a.offcpu_blocked_ns
    # Five sleeps of 100 ms, plus the two short waits on stdin around them.
    assert blocked >= 0.5e9
    # The three parts add up to the time between the readings, to the collection's duration.
    assert (b0 - a1) * 1e9 - 1e6 <= lifetime(b) - lifetime(a) <= (b1 - a0) * 1e9 + 1e6
    # At rest, the on-CPU time and the waits are the kernel's own books, to the nanosecond.
    assert (b.oncpu_ns, b.runq_wait_ns) == books[:2]
    assert b.offcpu_runnable_ns == b.runq_wait_ns
    assert b.switches - a.switches >= 5  # one per sleep at least
    assert b.switches == switches
    assert b.comm.startswith("python")
    assert b.threads == 1
    assert 0 < b.oncpu_ns < 0.5e9


SPINNER = """
import sys, time
start, end = float(sys.argv[1]), float(sys.argv[2])
time.sleep(max(start - time.monotonic(), 0))
while time.monotonic() < end:
    pass
print("done", flush=True)
sys.stdin.readline()
"""


def test_cpu_contention_shows_runqueue_latency_and_runnable_wait(
    sched: SchedCollector,
) -> None:
    # Three spinners share CPU 0 for the same second: each is either running or waiting in
    # the run queue, so it waits for about the two thirds of the second it does not run.
    start = time.monotonic() + 1.0
    end = start + 1.0
    spinners = [
        _python(SPINNER, str(start), str(end), prefix=("taskset", "-c", "0")) for _ in range(3)
    ]
    try:
        for p in spinners:
            wait_for(lambda p=p: asleep(p.pid))  # type: ignore[misc]
        assert time.monotonic() < start, "the machine is too slow for this test's schedule"
        sched.collect()
        before = {p.pid: sched.per_process()[p.pid] for p in spinners}  # type: ignore[index]
        for p in spinners:
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "done"
            wait_for(lambda p=p: asleep(p.pid))  # type: ignore[misc]
        samples = list(sched.collect())
        after = {p.pid: sched.per_process()[p.pid] for p in spinners}  # type: ignore[index]
        books = {p.pid: kernel_books(p.pid) for p in spinners}
    finally:
        for p in spinners:
            p.communicate("\n", timeout=10)
    q = _values(samples, "sched_runqueue_latency_seconds")
    assert q[(("quantile", "0.99"),)] > 0
    assert q[(("quantile", "0.99"),)] >= q[(("quantile", "0.5"),)]
    assert _values(samples, "sched_runqueue_latency_mean_seconds")[()] > 0
    assert _values(samples, "sched_runqueue_waits_per_second")[()] > 0
    assert _values(samples, "sched_offcpu_seconds_per_second")[(("state", "runnable"),)] > 0.8
    oncpu = [after[pid].oncpu_ns - before[pid].oncpu_ns for pid in before]
    # One CPU for one second: together at most about 1 s (less when other work shares it).
    assert sum(oncpu) < 1.1e9
    assert all(t > 0 for t in oncpu)
    for pid in before:
        wait = after[pid].runq_wait_ns - before[pid].runq_wait_ns
        assert wait > 0.4e9
        assert after[pid].offcpu_runnable_ns - before[pid].offcpu_runnable_ns == wait
        assert (after[pid].oncpu_ns, after[pid].runq_wait_ns) == books[pid][:2]


BURNERS = """
import sys, threading, time
def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
sys.stdin.readline()
threads = [threading.Thread(target=burn, args=(0.1,)) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(time.process_time_ns(), flush=True)
sys.stdin.readline()
"""


def test_exited_threads_keep_their_times_in_their_process(sched: SchedCollector) -> None:
    # Four threads each burn 100 ms of CPU and exit; the process lives on. Its on-CPU time
    # must still include theirs (CLOCK_PROCESS_CPUTIME_ID, which counts dead threads too).
    child = _python(BURNERS)
    try:
        assert child.stdout is not None and child.stdin is not None
        wait_for(lambda: asleep(child.pid))
        a, _, _ = reading(sched, child.pid)
        child.stdin.write("go\n")
        child.stdin.flush()
        process_cpu_ns = int(child.stdout.readline())
        wait_for(lambda: asleep(child.pid) and len(os.listdir(f"/proc/{child.pid}/task")) == 1)
        b, b0, b1 = reading(sched, child.pid)
        c, c0, c1 = reading(sched, child.pid)
    finally:
        child.communicate("\n", timeout=10)
    assert b.oncpu_ns - a.oncpu_ns >= 0.4e9
    # The child read its clock a few instructions before it went to sleep; the kernel's
    # count also has the few microseconds each thread ran after its exit was recorded.
    assert abs(b.oncpu_ns - process_cpu_ns) < 5e6
    assert b.threads == 1
    # At rest only the blocked time moves, with the clock.
    assert (c.oncpu_ns, c.runq_wait_ns, c.switches) == (b.oncpu_ns, b.runq_wait_ns, b.switches)
    assert (
        (c0 - b1) * 1e9 - 1e6 <= c.offcpu_blocked_ns - b.offcpu_blocked_ns <= (c1 - b0) * 1e9 + 1e6
    )


CHURN = """
import sys, threading, time
end = time.monotonic() + float(sys.argv[1])
def work():
    x = 0
    for i in range(20000):
        x += i
    time.sleep(0.001)
while time.monotonic() < end:
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
"""


def test_process_times_never_go_down_under_thread_churn(sched: SchedCollector) -> None:
    # Threads start and exit all the time while the collector reads: each thread's times
    # move from the live count to the exited count without being counted twice or lost.
    child = _python(CHURN, "3")
    seen: list[ProcSched] = []
    try:
        while child.poll() is None:
            sched.collect()
            p = (sched.per_process() or {}).get(child.pid)
            if p is not None:
                seen.append(p)
            time.sleep(0.02)
    finally:
        child.communicate(timeout=30)
    assert len(seen) > 10
    for earlier, later in itertools.pairwise(seen):
        for field in ("oncpu_ns", "runq_wait_ns", "offcpu_blocked_ns", "switches"):
            assert getattr(later, field) >= getattr(earlier, field), (field, earlier, later)


def test_exec_and_exit_of_bin_true_are_seen_with_its_pid(sched: SchedCollector, sink: Sink) -> None:
    sched.collect()  # an empty ring buffer
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
    assert 0 < int(exit_true.attrs["oncpu_ns"]) < 1e9
    assert int(exit_true.attrs["offcpu_ns"]) >= 0
    assert by_pid[(false.pid, "exit")].attrs["exit_status"] == 1
    # Exited processes leave the per-process table.
    assert true.pid not in sched.per_process()  # type: ignore[operator]


#: Two processes with the same pid one after the other: the first is forked and reaped, the
#: second made with clone3(set_tid) at the first one's pid (root may choose a free pid).
SAME_PID_TWICE = r"""
#define _GNU_SOURCE
#include <linux/sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
int main(void) {
    pid_t first = fork();
    if (first == 0) _exit(0);
    waitpid(first, 0, 0);
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.exit_signal = SIGCHLD;
    args.set_tid = (uint64_t)(uintptr_t)&first;
    args.set_tid_size = 1;
    long second = syscall(SYS_clone3, &args, sizeof args);
    if (second == 0) _exit(0);
    if (second < 0) { perror("clone3"); return 1; }
    waitpid(second, 0, 0);
    printf("%d %ld\n", first, second);
    return 0;
}
"""


def test_a_pid_used_twice_between_two_drains_keeps_both_exits(
    header_cache: Path, tmp_path: Path
) -> None:
    # Under thread churn a tid comes back within seconds (pid_max 32768 by default): the
    # exited threads' books are kept by tid and start time, so the second thread's books
    # do not overwrite the first's.
    (tmp_path / "twice.c").write_text(SAME_PID_TWICE)
    subprocess.run(
        ["gcc", "-O2", "-o", str(tmp_path / "twice"), str(tmp_path / "twice.c")], check=True
    )
    c = SchedCollector(header_cache=header_cache)
    c.start()
    try:
        out = subprocess.run([str(tmp_path / "twice")], capture_output=True, text=True, check=True)
        first, second = (int(x) for x in out.stdout.split())
        assert first == second
        mine = [r for r in sched_mod.TASK_RECORD.iter_unpack(c._drain_exits()) if r[0] == first]
    finally:
        c.close()
    assert len(mine) == 2
    assert mine[0][7] != mine[1][7]  # two start times


def test_killed_process_reports_the_signal(sched: SchedCollector, sink: Sink) -> None:
    sched.collect()  # an empty ring buffer
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
    assert _values(samples, "sched_offcpu_seconds_per_second")[(("state", "blocked"),)] > 0
    dropped = _values(samples, "sched_dropped_total")
    assert set(dropped) == {
        (("reason", "exit_map_full"),),
        (("reason", "ringbuf_full"),),
        (("reason", "task_storage"),),
    }
    threads = 0
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
        with contextlib.suppress(FileNotFoundError):  # exited meanwhile
            threads += len(os.listdir(f"/proc/{pid}/task"))
    # Other processes' exec/exit storms can fill the ring buffer on a shared machine; the
    # losses are counted (see the tiny-maps test). Task storage is refused only rarely (under
    # memory pressure, or while another task-storage call runs on that CPU: seen once in
    # about ten runs of the suite); a storage that did not work would miss for every thread,
    # walk after walk.
    assert dropped[(("reason", "task_storage"),)] < 0.01 * threads
    assert 0.5 * threads < _values(samples, "sched_tracked_threads")[()] < 2 * threads
    counts = sched.cpu_switch_counts()
    assert counts is not None and {str(c) for c in counts} == online
    assert all(n > 0 for n in counts.values())


def test_bpf_program_costs_are_reported(sched: SchedCollector) -> None:
    time.sleep(0.6)  # at least one stats window (0.2 s on every 0.5 s)
    samples = list(sched.collect())
    ns = _values(samples, "bpf_program_run_ns_per_event")
    rate = _values(samples, "bpf_program_runs_per_second")
    switch = (("program", "bpfdyno_switch"),)
    assert 0 < ns[switch] < 100_000
    assert rate[switch] > 0
    assert {dict(k)["program"] for k in rate} == ALL_PROGRAMS


def test_tiny_maps_count_their_losses_and_keep_working(header_cache: Path) -> None:
    sink = Sink()
    c = SchedCollector(sink=sink, max_exits=2, ringbuf_pages=1, header_cache=header_cache)
    c.start()
    try:
        ids = c._require().program_ids()
        # 300 fork+exec+exit of /bin/true between two collections: 300 thread exits for a
        # ring buffer of one page (51 fit), and 600 events for a 4 KiB ring buffer (~20 fit).
        subprocess.run(["sh", "-c", "for i in $(seq 300); do /bin/true; done"], check=True)
        samples = list(c.collect())
        dropped = {dict(k)["reason"]: v for k, v in _values(samples, "sched_dropped_total").items()}
        got = sum(1 for e in sink.events if e.comm == "true")
        assert dropped["ringbuf_full"] > 0
        assert got + dropped["ringbuf_full"] >= 600
        assert dropped["exit_map_full"] >= 300 - 4096 // (sched_mod.TASK_RECORD.size + 8)
        assert list(c.collect())  # still collecting
    finally:
        c.close()
        c.close()  # idempotent
    assert programs_still_loaded(ids.values()) == set()


def test_exit_records_come_whole_across_the_ring_buffers_end(header_cache: Path) -> None:
    # A one-page ring buffer (51 records) drained after every 16 exits of ours: 96 records go
    # through it, so the drains read across its end twice; each exit is read once, whole.
    c = SchedCollector(max_exits=16, header_cache=header_cache)
    c.start()
    try:
        for _ in range(6):
            pids = set()
            for _ in range(16):
                child = subprocess.Popen(["/bin/true"])
                child.wait()
                pids.add(child.pid)
            got = list(sched_mod.TASK_RECORD.iter_unpack(c._drain_exits()))
            mine = [r for r in got if r[1] in pids]
            assert sorted(r[0] for r in mine) == sorted(pids)
            assert all(r[-1].rstrip(b"\0") == b"true" for r in mine)
    finally:
        c.close()


def test_close_detaches_everything(header_cache: Path) -> None:
    c = SchedCollector(header_cache=header_cache)
    c.start()
    ids = c._require().program_ids()
    assert set(ids) == ALL_PROGRAMS
    c.close()
    assert programs_still_loaded(ids.values()) == set()
    assert c.per_process() is None  # "unknown" for the process table, not zeros
    assert c.cpu_switch_counts() is None
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
    assert set(ids) == ALL_PROGRAMS
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert programs_still_loaded(ids.values()) == set()


def test_per_process_snapshot_is_a_copy(sched: SchedCollector) -> None:
    snap = sched.per_process()
    assert snap is not None
    assert all(isinstance(v, ProcSched) and v.tgid == k for k, v in snap.items())
    snap.clear()
    assert sched.per_process() != {}


def test_the_program_refuses_to_compile_without_its_settings(header_cache: Path) -> None:
    with pytest.raises(
        BpfLoadError, match="SCHED_EXIT_PAGES and SCHED_RINGBUF_PAGES must be set with -D"
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
        "SCHED_ERR_EXIT_FULL",
        "SCHED_ERR_RINGBUF",
        "SCHED_ERR_MARK",
    ):
        assert values[name] == getattr(sched_mod, name), name
    task_size = re.search(r"sizeof\(struct sched_task\) == (\d+)", header)
    assert task_size is not None and int(task_size[1]) == sched_mod.TASK_RECORD.size
    cpu_size = re.search(r"sizeof\(struct sched_cpu\) == 64 \+ 8 \* SCHED_HIST_SLOTS", header)
    assert cpu_size is not None and sched_mod.CPU_WORDS * 8 == 64 + 8 * sched_mod.SCHED_HIST_SLOTS


# --- the overhead budget's steps ------------------------------------------------------------


def step(collector: SchedCollector, name: str) -> Reduction:
    (found,) = [r for r in collector.reductions() if r.name == name]
    return found


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


THREADS = """
import sys, threading, time
def burn(release):
    end = time.thread_time() + 0.1
    while time.thread_time() < end:
        pass
    release.wait()
sys.stdin.readline()
release = threading.Event()
threads = [threading.Thread(target=burn, args=(release,)) for _ in range(3)]
for t in threads:
    t.start()
print("burning", flush=True)
sys.stdin.readline()
release.set()
for t in threads:
    t.join()
print("joined", flush=True)
sys.stdin.readline()
"""


def test_exits_detached_keep_the_last_walked_books_and_say_the_rates_are_unknown(
    sched: SchedCollector, sink: Sink
) -> None:
    exits = step(sched, "sched.exits_detached")
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(THREADS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    exits.apply()
    try:
        assert not sched._require().attached("bpfdyno_exit")
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "burning\n"
        wait_for(lambda: threads_of(child.pid) == 4 and asleep(child.pid))
        sched.collect()
        walked = (sched.per_process() or {})[child.pid]
        assert walked.threads == 4 and walked.oncpu_ns >= 0.3e9
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.stdout.readline() == "joined\n"
        wait_for(lambda: threads_of(child.pid) == 1 and asleep(child.pid))
        samples = sched.collect()
        after = (sched.per_process() or {})[child.pid]
    finally:
        exits.undo()
        child.communicate("\n", timeout=10)
    assert after.threads == 1
    # Nothing recorded the exits: the three threads keep what the last walk read; the few
    # microseconds each ran after it (and the main thread's) are all that may be missing.
    assert walked.oncpu_ns <= after.oncpu_ns < walked.oncpu_ns + 5e6
    assert walked.switches <= after.switches
    for name in ("sched_execs_per_second", "sched_process_exits_per_second"):
        (rate,) = [s.value for s in samples if s.spec.name == name]
        assert math.isnan(rate), name
    # Attached again, exits are seen again.
    assert sched._require().attached("bpfdyno_exit")
    sched.collect()  # room in the ring buffer (other processes on the machine fill it)
    true = subprocess.Popen(["/bin/true"])
    true.wait()

    def exit_seen() -> bool:
        sched.collect()
        return any(e.kind == "exit" and e.pid == true.pid for e in sink.events)

    wait_for(exit_seen)


def test_switch_program_held_off_counts_nothing_and_credits_no_gap(sched: SchedCollector) -> None:
    sampled = step(sched, "sched.switch_sampled")
    assert isinstance(sampled, SampledFunctions) and sampled.flag is None
    sampled.target.set_off(True)  # the off phase: detached
    try:
        off0 = sched._read_totals()
        time.sleep(0.5)  # the machine switches hundreds of times meanwhile
        off1 = sched._read_totals()
    finally:
        sampled.target.set_off(False)
    on0 = sched._read_totals()
    time.sleep(0.3)
    on1 = sched._read_totals()
    assert off1.switches == off0.switches and off1.busy_ns == off0.busy_ns
    assert sum(on1.switches) > sum(on0.switches)
    # Attached again, each CPU starts its busy time afresh: no task is credited with the
    # half second the program did not see.
    for b0, b1 in zip(on0.busy_ns, on1.busy_ns, strict=True):
        assert b1 - b0 <= (on1.t - on0.t) * 1e9 * 1.02 + 1e6


def test_threads_are_walked_only_while_someone_reads_the_processes(header_cache: Path) -> None:
    # Nobody reads the per-process times: no walk (on a big node the walk is what grows),
    # but the exits and events are drained every round, each exit event with its totals.
    reading = [False]
    sink = Sink()
    c = SchedCollector(
        sink=sink,
        header_cache=header_cache,
        ringbuf_pages=256,
        walk_demand=lambda: reading[0],
        idle_walk_s=3600,
    )
    c.start()
    child = _python("import sys; sys.stdin.readline()")
    try:
        wait_for(lambda: asleep(child.pid))
        c.collect()  # room in the ring buffer (other processes on the machine fill it)
        true = subprocess.Popen(["/bin/true"])
        true.wait()

        def exit_seen() -> bool:
            c.collect()
            return any(e.kind == "exit" and e.pid == true.pid for e in sink.events)

        wait_for(exit_seen)
        (ev,) = [e for e in sink.events if e.kind == "exit" and e.pid == true.pid]
        assert ev.attrs["oncpu_ns"] > 0  # the exited thread's books, drained without a walk
        assert child.pid not in (c.per_process() or {})  # started after the only walk
        reading[0] = True
        c.collect()
        assert child.pid in (c.per_process() or {})
    finally:
        child.communicate("\n", timeout=10)
        c.close()


def test_per_cpu_series_every_few_rounds_on_a_big_node(header_cache: Path) -> None:
    # Past [daemon] per_cpu_series_max CPUs: each CPU's switches and busy share every
    # second round (over both), the host-wide rates every round.
    c = SchedCollector(header_cache=header_cache, per_cpu_every=2)
    c.start()
    try:
        rounds = []
        for _ in range(4):
            time.sleep(0.1)
            rounds.append(c.collect())
    finally:
        c.close()
    per_cpu = [
        {s.labels for s in r if s.spec.name == "sched_context_switches_per_second"} for r in rounds
    ]
    online = {(("cpu", str(cpu)),) for cpu in online_cpus()}
    assert per_cpu == [set(), online, set(), online]
    assert all(any(s.spec.name == "sched_runqueue_waits_per_second" for s in r) for r in rounds)
