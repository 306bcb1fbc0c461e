"""`BpfProgram` (load, attach, unload), the map reader, BPF run statistics and the
leftover-program check.

Real bcc, real kernel: small programs written to a temporary source directory stand in for
the package's ``bpf/`` directory, attached to uprobes on libc's ``labs`` so the test decides
exactly how often they run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.ebpf import duty, runstats
from bpfdyno.ebpf import program as bpfload
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.introspect import loaded_maps, loaded_programs, programs_still_loaded
from bpfdyno.ebpf.maps import map_items, percpu_sums, percpu_values
from bpfdyno.ebpf.program import BpfProgram
from bpfdyno.ebpf.runstats import BpfRunStats, run_stats_samples

pytestmark = pytest.mark.root

LIBC = ctypes.CDLL("libc.so.6")

_PROGRAM = r"""
#include <uapi/linux/ptrace.h>
#include "probe.h"
BPF_ARRAY(bpfdyno_tseen, struct probe_value, 1);
BPF_HASH(bpfdyno_ttable, u32, u64, 4096);
BPF_PERCPU_ARRAY(bpfdyno_tcount, u64, 4);
BPF_RINGBUF_OUTPUT(bpfdyno_tevents, 1);
int bpfdyno_t_labs(struct pt_regs *ctx)
{
	int k = 0;
	struct probe_value v = { .arg = PT_REGS_PARM1(ctx), .setting = PROBE_SETTING };
	bpfdyno_tseen.update(&k, &v);
	/* labs(-n) counts in slot n % 4 and streams n */
	u32 slot = (u32)(0 - v.arg) % 4;
	u64 *c = bpfdyno_tcount.lookup(&slot);
	if (c)
		*c += 1;
	struct probe_value *e = bpfdyno_tevents.ringbuf_reserve(sizeof(struct probe_value));
	if (e) {
		e->arg = 0 - v.arg;
		e->setting = PROBE_SETTING;
		bpfdyno_tevents.ringbuf_submit(e, 0);
	}
	return 0;
}
int bpfdyno_t_sysenter(void *ctx)
{
	return 0;
}
"""
_HEADER = "struct probe_value { u64 arg; u64 setting; };\n"


@pytest.fixture()
def src_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bpf"
    d.mkdir()
    (d / "probe.bpf.c").write_text(_PROGRAM)
    (d / "probe.h").write_text(_HEADER)
    (d / "broken.bpf.c").write_text("int bpfdyno_broken(void *ctx) { return undeclared_x; }\n")
    monkeypatch.setattr(bpfload, "bpf_source_dir", lambda: d)
    return d


@pytest.fixture()
def probe(src_dir: Path, tmp_path: Path) -> Iterator[BpfProgram]:
    prog = BpfProgram.load(
        "probe.bpf.c", defines={"PROBE_SETTING": 77}, header_cache=tmp_path / "kh"
    )
    prog.attach_uprobe("c", "labs", "bpfdyno_t_labs", pid=os.getpid())
    yield prog
    prog.close()


def _stats_fds() -> list[int]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:bpf-stats":
                out.append(int(name))
        except OSError:
            pass
    return out


def test_load_uses_package_headers_and_cflags(probe: BpfProgram) -> None:
    LIBC.labs(ctypes.c_long(-31337))
    value = probe.table("bpfdyno_tseen")[0]
    assert (value.arg, value.setting) == (2**64 - 31337, 77)


def test_load_leaves_the_environment_as_it_was(src_dir: Path, tmp_path: Path) -> None:
    before = os.environ.get("BCC_KERNEL_SOURCE")
    BpfProgram.load(
        "probe.bpf.c", defines={"PROBE_SETTING": 1}, header_cache=tmp_path / "kh"
    ).close()
    assert os.environ.get("BCC_KERNEL_SOURCE") == before


def test_compile_error_is_explained(src_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BpfLoadError) as err:
        BpfProgram.load("broken.bpf.c", header_cache=tmp_path / "kh")
    msg = str(err.value)
    assert msg.startswith("compiling broken.bpf.c against generated-minimal kernel headers")
    assert "use of undeclared identifier 'undeclared_x'" in msg


def test_attach_failure_is_explained(src_dir: Path, tmp_path: Path) -> None:
    with BpfProgram.load(
        "probe.bpf.c", defines={"PROBE_SETTING": 1}, header_cache=tmp_path / "kh"
    ) as prog:
        with pytest.raises(
            BpfLoadError,
            match=r"attaching bpfdyno_t_labs of probe.bpf.c to tracepoint nosuch:event "
            r"failed \(.*\); run as root",
        ):
            prog.attach_tracepoint("nosuch:event", "bpfdyno_t_labs")
        with pytest.raises(BpfLoadError, match="to uprobe c:no_such_symbol_x failed"):
            prog.attach_uprobe("c", "no_such_symbol_x", "bpfdyno_t_labs")


def test_close_is_idempotent_and_final(src_dir: Path, tmp_path: Path) -> None:
    prog = BpfProgram.load(
        "probe.bpf.c", defines={"PROBE_SETTING": 1}, header_cache=tmp_path / "kh"
    )
    prog.attach_uprobe("c", "labs", "bpfdyno_t_labs", pid=os.getpid())
    prog.start_run_stats(on_s=0.1, period_s=0.2)
    ids = prog.program_ids()
    prog.close()
    prog.close()
    assert prog.closed
    assert _stats_fds() == []
    assert programs_still_loaded(ids.values()) == set()
    with pytest.raises(RuntimeError, match=r"the BPF program probe\.bpf\.c is closed"):
        prog.table("bpfdyno_tseen")


def test_ring_buffer_records_are_decoded_in_order(probe: BpfProgram) -> None:
    ring = probe.open_ring_buffer("bpfdyno_tevents", lambda r: (int(r.arg), int(r.setting)))
    for n in (5, 6, 7):
        LIBC.labs(ctypes.c_long(-n))
    assert ring.drain() == [(5, 77), (6, 77), (7, 77)]
    assert ring.drain() == []


def test_percpu_array_reads(probe: BpfProgram) -> None:
    for n in (1, 2, 2, 3, 3, 3, 7):
        LIBC.labs(ctypes.c_long(-n))
    table = probe.table("bpfdyno_tcount")
    assert percpu_sums(table) == [0, 1, 2, 4]
    assert sum(percpu_values(table, 3)) == 4
    assert len(percpu_values(table, 3)) == table.total_cpu


def test_percpu_sums_add_every_cpus_value_of_every_slot(probe: BpfProgram) -> None:
    # Distinct values on each CPU and slot (written from user space), large enough to need
    # all 64 bits: the sums must pair each slot's words, not a neighbour's.
    table = probe.table("bpfdyno_tcount")
    ncpu = table.total_cpu
    for slot in range(int(table.max_entries)):
        table[table.Key(slot)] = table.Leaf(*((slot + 1) * 2**40 + cpu for cpu in range(ncpu)))
    expected = [
        sum((slot + 1) * 2**40 + cpu for cpu in range(ncpu))
        for slot in range(int(table.max_entries))
    ]
    assert percpu_sums(table) == expected


def test_uretprobe_runs_once_per_return(src_dir: Path, tmp_path: Path) -> None:
    with BpfProgram.load(
        "probe.bpf.c", defines={"PROBE_SETTING": 1}, header_cache=tmp_path / "kh"
    ) as prog:
        prog.attach_uprobe("c", "labs", "bpfdyno_t_labs", pid=os.getpid(), retprobe=True)
        for _ in range(3):
            LIBC.labs(ctypes.c_long(-1))
        assert sum(percpu_sums(prog.table("bpfdyno_tcount"))) == 3


def test_map_ids_name_every_map_as_the_kernel_does(probe: BpfProgram) -> None:
    ids = probe.map_ids()
    assert set(ids) == {"bpfdyno_tseen", "bpfdyno_ttable", "bpfdyno_tcount", "bpfdyno_tevents"}
    kernel = {m.id: m for m in loaded_maps()}
    assert {name: kernel[i].name for name, i in ids.items()} == {name: name for name in ids}
    assert kernel[ids["bpfdyno_ttable"]].max_entries == 4096
    assert kernel[ids["bpfdyno_tevents"]].max_entries == os.sysconf("SC_PAGE_SIZE")


def test_unknown_program_is_explained(src_dir: Path) -> None:
    with pytest.raises(BpfLoadError, match=r"no BPF program 'nope.bpf.c' in .*; reinstall"):
        BpfProgram.load("nope.bpf.c")


def test_programs_are_listed_by_prefix_and_gone_after_cleanup(
    src_dir: Path, tmp_path: Path
) -> None:
    prog = BpfProgram.load(
        "probe.bpf.c", defines={"PROBE_SETTING": 1}, header_cache=tmp_path / "kh"
    )
    prog.attach_uprobe("c", "labs", "bpfdyno_t_labs", pid=os.getpid())
    ids = prog.program_ids()
    assert list(ids) == ["bpfdyno_t_labs"]
    listed = {p.id: p.name for p in loaded_programs()}
    assert listed[ids["bpfdyno_t_labs"]] == "bpfdyno_t_labs"
    prog.close()
    assert programs_still_loaded(ids.values()) == set()


def test_run_stats_count_every_run(probe: BpfProgram) -> None:
    stats = BpfRunStats(probe.program_fds())
    fd = runstats.enable_bpf_stats()
    try:
        before = stats.read_counters()
        for _ in range(1000):
            LIBC.labs(ctypes.c_long(-1))
        after = stats.read_counters()
    finally:
        os.close(fd)
    runs = after["bpfdyno_t_labs"][0] - before["bpfdyno_t_labs"][0]
    run_ns = after["bpfdyno_t_labs"][1] - before["bpfdyno_t_labs"][1]
    assert runs == 1000
    assert 0 < run_ns / runs < 100_000


@contextlib.contextmanager
def labs_every_ms() -> Iterator[None]:
    """labs() called about once a millisecond from another thread, inside the block."""
    stop = threading.Event()

    def call_labs() -> None:
        while not stop.is_set():
            LIBC.labs(ctypes.c_long(-1))
            time.sleep(0.001)

    caller = threading.Thread(target=call_labs)
    caller.start()
    try:
        yield
    finally:
        stop.set()
        caller.join()


def test_duty_cycle_reports_a_window_and_restores_state(probe: BpfProgram) -> None:
    stats = BpfRunStats(probe.program_fds(), on_s=0.3, period_s=0.4)
    with labs_every_ms():
        assert stats.last_window() == {}
        stats.start()
        try:
            deadline = time.monotonic() + 5
            while not stats.last_window() and time.monotonic() < deadline:
                time.sleep(0.05)
            window = stats.last_window()["bpfdyno_t_labs"]
            assert _stats_fds() != [] or window  # on or between windows
        finally:
            stats.stop()
    assert _stats_fds() == []
    assert window.window_s == pytest.approx(0.3, abs=0.1)
    # One call per ~1 ms (plus scheduling delays): a few dozen to ~1000 per second.
    assert 20 < window.runs_per_second < 1100
    assert window.ns_per_event > 0
    names = [(s.spec.name, dict(s.labels)["program"]) for s in run_stats_samples({"p": window})]
    assert names == [
        ("bpf_program_run_ns_per_event", "p"),
        ("bpf_program_runs_per_second", "p"),
    ]


def test_run_stats_without_runs_are_nan_not_zero() -> None:
    (ns, rate) = run_stats_samples({"p": runstats.ProgramRunStats("p", 0, 0, 1.0)})
    assert ns.value != ns.value  # NaN: no event, no cost to report
    assert rate.value == 0.0


def test_refused_stats_degrade_with_a_reason(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        from bpfdyno.ebpf.runstats import BpfRunStats
        stats = BpfRunStats({})
        stats.start()
        stats.stop()
        print(stats.unavailable_reason)
        """
    )
    out = subprocess.run(
        ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert out.strip() == (
        "BPF run statistics refused (Operation not permitted); they need Linux >= 5.8 and "
        "CAP_SYS_ADMIN"
    )


@pytest.mark.parametrize("chunk", [7, 1024])
def test_map_items_reads_every_entry(probe: BpfProgram, chunk: int) -> None:
    table = probe.table("bpfdyno_ttable")
    for i in range(2500):
        table[table.Key(i)] = table.Leaf(i * 3)
    items = dict(map_items(table, chunk=chunk))
    assert items == {i: i * 3 for i in range(2500)}


_NO_COMPILER_IN_PROCESS = r"""
import sys, time
from pathlib import Path
from bpfdyno.ebpf.compiler import COMPILER_LIBRARIES
from bpfdyno.sources.irq.collector import IrqCollector
from bpfdyno.sources.sched.collector import SchedCollector

collectors = [SchedCollector(), IrqCollector()]
for c in collectors:
    c.start()
time.sleep(0.05)
names = {s.spec.name.split("_")[0] for c in collectors for s in c.collect()}
names = sorted(names & {"sched", "softirq"})  # what the two BPF programs count
mapped = sorted({
    line.split()[5] for line in Path("/proc/self/maps").read_text().splitlines()
    if len(line.split()) >= 6 and COMPILER_LIBRARIES.search(line.split()[5])
})
print(names, mapped, "bcc" in sys.modules)
for c in collectors:
    c.close()
"""


def test_programs_load_and_run_without_the_compiler_in_the_process(tmp_path: Path) -> None:
    """bcc, clang and LLVM stay in the compile helper: a process running the scheduler and
    interrupt programs maps none of them (a fresh process: this one may have imported bcc)."""
    out = subprocess.run(
        [sys.executable, "-c", _NO_COMPILER_IN_PROCESS],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        timeout=300,
    ).stdout
    assert out.strip().splitlines()[-1] == "['sched', 'softirq'] [] False"


def test_the_process_meter_counts_every_program_loaded(probe: BpfProgram) -> None:
    # The probe program belongs to no collector: loading it is enough for the budget's meter
    # to count its runs, exactly, between two readings with statistics on.
    meter = runstats.METER
    fd = runstats.enable_bpf_stats()
    try:
        before = meter._counters()
        for _ in range(321):
            LIBC.labs(ctypes.c_long(-1))
        after = meter._counters()
    finally:
        os.close(fd)
    prog_id = probe.program_ids()["bpfdyno_t_labs"]
    name, cnt0, _, attached0 = before[prog_id]
    _, cnt1, _, attached1 = after[prog_id]
    assert name == "bpfdyno_t_labs"
    assert cnt1 - cnt0 == 321
    assert attached0 is attached1 is None  # a uprobe: attached whenever loaded


def test_the_process_meter_publishes_windows_of_every_function(probe: BpfProgram) -> None:
    owner = object()
    with labs_every_ms():
        seq = runstats.METER.last_window().seq if runstats.METER.last_window() else 0
        runstats.METER.request(owner, 0.2, 0.25)
        try:
            window = runstats.METER.wait_window(seq, timeout=10)
            window = runstats.METER.wait_window(window.seq, timeout=10) if window else None
        finally:
            runstats.METER.release(owner)
    assert window is not None
    (labs,) = [f for f in window.functions if f.name == "bpfdyno_t_labs"]
    assert labs.window_s == pytest.approx(0.2, abs=0.1)
    assert labs.attached_s == pytest.approx(labs.window_s, abs=0.01)
    assert 0 < labs.runs_per_s < 1100
    assert set(runstats.METER.functions_of(probe)) == {"bpfdyno_t_labs"}
    assert runstats.METER.overhead_ns is not None and 0 < runstats.METER.overhead_ns < 5000


def test_the_meters_windows_hold_the_on_phase_of_functions_sampled_in_time(
    probe: BpfProgram,
) -> None:
    """A function sampled in time (on 1/8 of each 1 s period, detached the rest) is measured
    attached in every window: each starts just before an on phase. Started just after one
    ended, windows of 0.3 s every 2 s would otherwise never see it attached again."""
    probe.attach_raw_tracepoint("sys_enter", "bpfdyno_t_sysenter")
    cycler = duty.DutyCycler(period_s=1.0)
    target = duty.AttachedFunctions(probe, ["bpfdyno_t_sysenter"])
    meter = runstats.ProcessRunStats(cycler.next_period_at)  # its own, not the process's
    meter.register(probe)
    owner = object()
    cycler.sample(target, 1 / 8)
    try:
        start = cycler.next_period_at()
        assert start is not None
        time.sleep(max(0.0, start + 0.2 - time.monotonic()))  # its next on phase is over
        meter.request(owner, 0.3, 2.0)
        windows: list[runstats.FunctionCost] = []
        seq = 0
        while len(windows) < 3:
            window = meter.wait_window(seq, timeout=10)
            assert window is not None
            seq = window.seq
            (f,) = [f for f in window.functions if f.name == "bpfdyno_t_sysenter"]
            windows.append(f)
    finally:
        meter.release(owner)
        cycler.sample(target, 1.0)
    # Attached for its whole on phase (0.125 s, less the switching) in each window, and run
    # then: this process alone makes system calls all the time.
    assert [w.attached_s == pytest.approx(0.125, abs=0.06) for w in windows] == [True] * 3, windows
    assert all(w.runs > 0 for w in windows), windows
    # Its event rate is per second attached, not per second of the window.
    rate = windows[-1].as_run_stats().runs_per_second
    assert rate == pytest.approx(windows[-1].runs / windows[-1].attached_s)


def test_the_duty_cycle_runs_on_a_fixed_grid_and_says_when_the_next_period_begins() -> None:
    """Periods follow one another exactly `period_s` apart (switching does not push them
    later), so a window placed before one is placed before every later one."""

    class Target:
        closed = False

        def __init__(self) -> None:
            self.on_at: list[float] = []

        def set_off(self, off: bool) -> None:
            if not off:
                self.on_at.append(time.monotonic())
            time.sleep(0.01)  # switching takes time (attaching: a system call or two)

    cycler = duty.DutyCycler(period_s=0.2)
    assert cycler.next_period_at() is None  # nothing sampled
    target = Target()
    cycler.sample(target, 0.25)
    try:
        time.sleep(0.05)
        first = cycler.next_period_at()
        assert first is not None
        time.sleep(1.5)
        later = cycler.next_period_at()
    finally:
        cycler.sample(target, 1.0)
    assert later is not None
    periods = (later - first) / 0.2
    assert periods == pytest.approx(round(periods), abs=1e-6)  # the same grid, exactly
    starts = target.on_at[1:]
    assert all(t - (first + 0.2 * round((t - first) / 0.2)) < 0.05 for t in starts), starts


def test_stats_overhead_calibration_is_an_empty_programs_run_time() -> None:
    # What the statistics add to each run: an empty program's whole run time. Tens of ns on
    # any machine (two clock reads and a call); never nothing, never microseconds.
    assert 1 < runstats.calibrate_stats_overhead(2000) < 5000
    assert _stats_fds() == []
