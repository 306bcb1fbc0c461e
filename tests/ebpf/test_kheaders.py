"""Kernel headers generated from the running kernel, used by real bcc compiles.

Runs as root on a kernel with BTF and /proc/config.gz (the CI machine kind); no installed
linux-headers exist there, so the generated trees are what bcc really uses.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from bpfdyno.ebpf.kheaders import (
    HeaderTree,
    KernelHeadersError,
    KernelSources,
    describe_header_source,
    ensure_headers,
    kernel_build_id,
)
from bpfdyno.ebpf.tracefs import ensure_tracefs

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("kheaders")


@pytest.fixture()
def bcc_env() -> Iterator[None]:
    """Restore BCC_KERNEL_SOURCE after a test that sets it."""
    ensure_tracefs()
    old = os.environ.get("BCC_KERNEL_SOURCE")
    yield
    if old is None:
        os.environ.pop("BCC_KERNEL_SOURCE", None)
    else:
        os.environ["BCC_KERNEL_SOURCE"] = old


_PARENT_PROG = r"""
#include <linux/sched.h>
BPF_HASH(parent_of, u32, u32, 1024);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	struct task_struct *parent = NULL;
	u32 ppid = 0;
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	bpf_probe_read_kernel(&parent, sizeof(parent), &task->real_parent);
	bpf_probe_read_kernel(&ppid, sizeof(ppid), &parent->tgid);
	parent_of.update(&tgid, &ppid);
	return 0;
}
"""

_CHILD = "import os, sys; sys.stdin.readline(); print(os.getppid(), flush=True)"


def test_btf_tree_reads_real_parent_tgid_exactly(cache: Path, bcc_env: None) -> None:
    from bcc import BPF

    tree = ensure_headers("btf", cache)
    assert tree.kind == "generated-btf"
    os.environ["BCC_KERNEL_SOURCE"] = str(tree.path)
    bpf = BPF(text=_PARENT_PROG.encode())
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        out, _ = child.communicate("go\n", timeout=30)
        table = bpf[b"parent_of"]
        seen = {int(k.value): int(v.value) for k, v in table.items()}
    finally:
        bpf.cleanup()
    assert int(out) == os.getpid()
    assert seen[child.pid] == os.getpid()


def test_minimal_tree_serves_uprobe_programs(cache: Path, bcc_env: None) -> None:
    import ctypes

    from bcc import BPF

    tree = ensure_headers("minimal", cache)
    assert tree.kind == "generated-minimal"
    assert not (tree.path / "include" / "bpfdyno" / "vmlinux.h").exists()
    os.environ["BCC_KERNEL_SOURCE"] = str(tree.path)
    bpf = BPF(
        text=rb"""
        #include <uapi/linux/ptrace.h>
        BPF_ARRAY(arg, u64, 1);
        int on_labs(struct pt_regs *ctx) {
            int k = 0; u64 v = PT_REGS_PARM1(ctx); arg.update(&k, &v); return 0;
        }
        """
    )
    try:
        bpf.attach_uprobe(name=b"c", sym=b"labs", fn_name=b"on_labs")
        ctypes.CDLL("libc.so.6").labs(ctypes.c_long(-4242))
        assert bpf[b"arg"][0].value == 2**64 - 4242
    finally:
        bpf.cleanup()


def test_cache_is_reused(cache: Path) -> None:
    first = ensure_headers("btf", cache)
    vmlinux = first.path / "include" / "bpfdyno" / "vmlinux.h"
    before = vmlinux.stat().st_mtime_ns
    second = ensure_headers("btf", cache)
    assert second == first
    assert vmlinux.stat().st_mtime_ns == before
    assert [p.name for p in first.path.parent.iterdir() if p.name.startswith(".tmp")] == []


def test_other_build_gets_its_own_directory(cache: Path) -> None:
    running = KernelSources()
    other = replace(running, version=running.version + " (rebuilt)")
    assert kernel_build_id(other) != kernel_build_id(running)
    a = ensure_headers("minimal", cache, kernel=running)
    b = ensure_headers("minimal", cache, kernel=other)
    assert a.path != b.path
    assert a.build_id == kernel_build_id(running)
    assert b.path == cache / f"{running.release}-{kernel_build_id(other)}" / "minimal"
    assert (b.path / "include" / "linux" / "kconfig.h").is_file()


def test_generated_version_and_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("CONFIG_BPF_SYSCALL=y\nCONFIG_FOO=m\n# CONFIG_BAR is not set\nCONFIG_HZ=250\n")
    kernel = replace(KernelSources(), release="6.18.44-custom", config=cfg)
    tree = ensure_headers("minimal", tmp_path / "cache", kernel=kernel)
    inc = tree.path / "include" / "linux"
    version = (inc / "version.h").read_text()
    assert f"#define LINUX_VERSION_CODE {(6 << 16) + (18 << 8) + 44}\n" in version
    kconfig = (inc / "kconfig.h").read_text()
    assert "#define CONFIG_BPF_SYSCALL 1\n" in kconfig
    assert "#define CONFIG_FOO_MODULE 1\n" in kconfig
    assert "#define CONFIG_HZ 250\n" in kconfig
    assert "CONFIG_BAR" not in kconfig


def test_concurrent_generation_is_atomic(tmp_path: Path) -> None:
    results: list[HeaderTree] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def worker() -> None:
        try:
            barrier.wait()
            results.append(ensure_headers("btf", tmp_path))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len({r.path for r in results}) == 1
    (build_dir,) = list(tmp_path.iterdir())
    assert sorted(p.name for p in build_dir.iterdir()) == ["btf"]
    assert (results[0].path / "include" / "bpfdyno" / "vmlinux.h").stat().st_size > 1_000_000


def test_installed_headers_of_this_release_are_preferred(tmp_path: Path) -> None:
    running = KernelSources()
    build = tmp_path / "modules" / running.release / "build"
    (build / "include" / "linux").mkdir(parents=True)
    (build / "include" / "linux" / "kconfig.h").write_text("")
    kernel = replace(running, modules=tmp_path / "modules")
    tree = ensure_headers("btf", tmp_path / "cache", kernel=kernel)
    assert tree == HeaderTree(build.resolve(), "installed", running.release, "")
    assert describe_header_source(kernel=kernel).startswith("kernel headers: installed at ")


def test_headers_of_another_release_are_never_used(tmp_path: Path) -> None:
    running = KernelSources()
    other = tmp_path / "modules" / "6.1.0-other" / "build" / "include" / "linux"
    other.mkdir(parents=True)
    (other / "kconfig.h").write_text("")
    kernel = replace(running, modules=tmp_path / "modules")
    tree = ensure_headers("btf", tmp_path / "cache", kernel=kernel)
    assert tree.kind == "generated-btf"
    assert tree.path.is_relative_to(tmp_path / "cache")


def test_missing_config_names_the_fix(tmp_path: Path) -> None:
    kernel = replace(KernelSources(), config=tmp_path / "no-config.gz", modules=tmp_path)
    with pytest.raises(KernelHeadersError, match=r"modprobe configs"):
        ensure_headers("minimal", tmp_path / "cache", kernel=kernel)
    line = describe_header_source(kernel=kernel)
    assert line.startswith("kernel headers: none for ")
    assert "install linux-headers-" in line


def test_btf_flavour_without_btf_names_the_fix(tmp_path: Path) -> None:
    kernel = replace(KernelSources(), btf=tmp_path / "no-btf", modules=tmp_path)
    with pytest.raises(KernelHeadersError, match=r"CONFIG_DEBUG_INFO_BTF=y"):
        ensure_headers("btf", tmp_path / "cache", kernel=kernel)
    # The minimal flavour needs no BTF.
    assert ensure_headers("minimal", tmp_path / "cache", kernel=kernel).kind == (
        "generated-minimal"
    )
    assert ".tmp" not in "".join(p.name for p in (tmp_path / "cache").rglob("*"))


def test_unknown_flavour_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KernelHeadersError, match=r"use 'minimal' or 'btf'"):
        ensure_headers("full", tmp_path)  # type: ignore[arg-type]


def test_describe_names_the_generated_source(cache: Path) -> None:
    line = describe_header_source(cache)
    assert line.startswith("kernel headers: generated from /proc/config.gz and BTF into ")
    assert str(cache / f"{KernelSources().release}-{kernel_build_id()}") in line
