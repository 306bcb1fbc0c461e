"""Loading BPF programs with bcc, BPF run statistics and the leftover-program check.

Real bcc, real kernel: small programs written to a temporary source directory stand in for
the package's ``bpf/`` directory, attached to uprobes on libc's ``labs`` so the test decides
exactly how often they run.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bpfdyno.ebpf import program as bpfload
from bpfdyno.ebpf.program import (
    BpfLoadError,
    BpfRunStats,
    load_bpf,
    loaded_programs,
    map_items,
    program_ids,
    programs_still_loaded,
    run_stats_samples,
)

pytestmark = pytest.mark.root

LIBC = ctypes.CDLL("libc.so.6")

_PROGRAM = r"""
#include <uapi/linux/ptrace.h>
#include "probe.h"
BPF_ARRAY(seen, struct probe_value, 1);
BPF_HASH(table, u32, u64, 4096);
int bpfdyno_t_labs(struct pt_regs *ctx)
{
	int k = 0;
	struct probe_value v = { .arg = PT_REGS_PARM1(ctx), .setting = PROBE_SETTING };
	seen.update(&k, &v);
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
def probe(src_dir: Path, tmp_path: Path) -> Iterator[Any]:
    bpf = load_bpf("probe.bpf.c", ["-DPROBE_SETTING=77"], header_cache=tmp_path / "kh")
    bpf.attach_uprobe(name=b"c", sym=b"labs", fn_name=b"bpfdyno_t_labs", pid=os.getpid())
    yield bpf
    bpf.cleanup()


def _stats_fds() -> list[int]:
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:bpf-stats":
                out.append(int(name))
        except OSError:
            pass
    return out


def test_load_uses_package_headers_and_cflags(probe: Any) -> None:
    LIBC.labs(ctypes.c_long(-31337))
    value = probe[b"seen"][0]
    assert (value.arg, value.setting) == (2**64 - 31337, 77)


def test_load_leaves_the_environment_as_it_was(src_dir: Path, tmp_path: Path) -> None:
    before = os.environ.get("BCC_KERNEL_SOURCE")
    bpf = load_bpf("probe.bpf.c", ["-DPROBE_SETTING=1"], header_cache=tmp_path / "kh")
    bpf.cleanup()
    assert os.environ.get("BCC_KERNEL_SOURCE") == before


def test_compile_error_is_explained(src_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BpfLoadError) as err:
        load_bpf("broken.bpf.c", header_cache=tmp_path / "kh")
    msg = str(err.value)
    assert msg.startswith("compiling broken.bpf.c against generated-minimal kernel headers")
    assert "use of undeclared identifier 'undeclared_x'" in msg


def test_unknown_program_is_explained(src_dir: Path) -> None:
    with pytest.raises(BpfLoadError, match=r"no BPF program 'nope.bpf.c' in .*; reinstall"):
        load_bpf("nope.bpf.c")


def test_programs_are_listed_by_prefix_and_gone_after_cleanup(
    src_dir: Path, tmp_path: Path
) -> None:
    bpf = load_bpf("probe.bpf.c", ["-DPROBE_SETTING=1"], header_cache=tmp_path / "kh")
    bpf.attach_uprobe(name=b"c", sym=b"labs", fn_name=b"bpfdyno_t_labs", pid=os.getpid())
    ids = program_ids(bpf)
    assert list(ids) == ["bpfdyno_t_labs"]
    listed = {p.id: p.name for p in loaded_programs()}
    assert listed[ids["bpfdyno_t_labs"]] == "bpfdyno_t_labs"
    bpf.cleanup()
    assert programs_still_loaded(ids.values()) == set()


def test_run_stats_count_every_run(probe: Any) -> None:
    stats = BpfRunStats(probe)
    fd = bpfload.enable_bpf_stats()
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


def test_duty_cycle_reports_a_window_and_restores_state(probe: Any) -> None:
    stats = BpfRunStats(probe, on_s=0.3, period_s=0.4)
    stop = threading.Event()

    def call_labs() -> None:
        while not stop.is_set():
            LIBC.labs(ctypes.c_long(-1))
            time.sleep(0.001)

    caller = threading.Thread(target=call_labs)
    caller.start()
    try:
        assert stats.last_window() == {}
        stats.start()
        deadline = time.monotonic() + 5
        while not stats.last_window() and time.monotonic() < deadline:
            time.sleep(0.05)
        window = stats.last_window()["bpfdyno_t_labs"]
        assert _stats_fds() != [] or window  # on or between windows
    finally:
        stats.stop()
        stop.set()
        caller.join()
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
    (ns, rate) = run_stats_samples({"p": bpfload.ProgramRunStats("p", 0, 0, 1.0)})
    assert ns.value != ns.value  # NaN: no event, no cost to report
    assert rate.value == 0.0


def test_refused_stats_degrade_with_a_reason(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import types
        from bpfdyno.ebpf.program import BpfRunStats
        stats = BpfRunStats(types.SimpleNamespace(funcs={}))
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
def test_map_items_reads_every_entry(probe: Any, chunk: int) -> None:
    table = probe[b"table"]
    for i in range(2500):
        table[table.Key(i)] = table.Leaf(i * 3)
    items = dict(map_items(table, chunk=chunk))
    assert items == {i: i * 3 for i in range(2500)}


def test_release_compiler_pages_drops_rss_and_programs_keep_working() -> None:
    from bpfdyno.ebpf.program import release_compiler_pages
    from bpfdyno.sources.sched.collector import SchedCollector

    def rss_bytes() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    sched = SchedCollector()
    sched.start()
    try:
        before = rss_bytes()
        advised = release_compiler_pages()
        after = rss_bytes()
        assert advised > 50 << 20, "clang/LLVM mappings found and advised"
        assert before - after > 20 << 20, (before, after)
        time.sleep(0.05)
        samples = sched.collect()
        assert any(s.spec.name.startswith("sched_") for s in samples)
    finally:
        sched.close()


def test_release_compiler_pages_without_maps(tmp_path: Path) -> None:
    from bpfdyno.ebpf.program import release_compiler_pages

    assert release_compiler_pages(str(tmp_path / "missing")) == 0
