"""Compile and load bpfdyno's BPF programs with bcc, and measure what they cost.

Every BPF program bpfdyno loads is a function whose name starts with ``bpfdyno_``
(`PROG_PREFIX`); the kernel keeps the first 15 characters, so ``bpftool prog show`` and
`loaded_programs` can tell ours apart from everyone else's.

Programs are files in the ``bpfdyno.bpf`` package; `load_bpf` reads one, points bcc at a
header tree for the running kernel (`bpfdyno.ebpf.kheaders`) and compiles it. Settings reach the C
code only as ``-D`` cflags. `BpfRunStats` turns on the kernel's per-program run-time
accounting for short windows (it costs ~20 ns per run while on) and reports ns per event.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import importlib.resources
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.ebpf.errors import BpfLoadError as BpfLoadError
from bpfdyno.ebpf.kheaders import HeaderFlavour, KernelHeadersError, ensure_headers
from bpfdyno.ebpf.metrics import (
    BPF_RUN_NS_PER_EVENT,
    BPF_RUNS_PER_SECOND,
)
from bpfdyno.ebpf.tracefs import TracefsError, ensure_tracefs

if TYPE_CHECKING:
    import bcc

log = logging.getLogger(__name__)

#: Name prefix of every bpfdyno BPF program (kernel names keep 15 characters).
PROG_PREFIX = "bpfdyno_"

_load_lock = threading.Lock()


def bpf_source_dir() -> Path:
    """The directory holding the ``bpfdyno.bpf`` C sources."""
    return Path(str(importlib.resources.files("bpfdyno.bpf")))


def load_bpf(
    source: str,
    cflags: Sequence[str] = (),
    flavour: HeaderFlavour = "minimal",
    *,
    header_cache: Path | None = None,
) -> bcc.BPF:
    """Compile and load one program file of the ``bpfdyno.bpf`` package.

    Args:
        source: file name inside the package, e.g. ``"sched.bpf.c"``; ``#include "x.h"``
            finds the package's headers.
        cflags: extra compiler flags; settings are passed as ``-DNAME=value``.
        flavour: ``minimal`` for tracepoint/uprobe programs, ``btf`` for programs that read
            kernel structs (see `bpfdyno.ebpf.kheaders`).
        header_cache: where generated kernel headers are cached (default in /var/cache).

    Returns:
        The loaded ``bcc.BPF`` object (programs named ``bpfdyno_*`` are not yet attached).

    Raises:
        BpfLoadError: bcc missing, no headers, compile or load failure; the message says
            what to do.
    """
    src_dir = bpf_source_dir()
    src_path = src_dir / source
    if not src_path.is_file():
        raise BpfLoadError(f"no BPF program {source!r} in {src_dir}; reinstall bpfdyno")
    text = src_path.read_text(encoding="utf-8")
    try:
        import bcc
    except ImportError as e:
        raise BpfLoadError(
            "bcc is not importable; install python3-bpfcc (Debian/Ubuntu) and make it visible "
            "to this Python (see vagrant/bootstrap.sh)"
        ) from e
    try:
        tree = ensure_headers(flavour, header_cache)
    except KernelHeadersError as e:
        raise BpfLoadError(str(e)) from e
    try:
        ensure_tracefs()
    except TracefsError as e:
        # Raw tracepoints and uprobes work without tracefs; tracepoint programs fail below.
        log.warning("%s", e)
    flags = [f"-I{src_dir}", *cflags]
    with _load_lock, _captured_stderr() as diag:
        # bcc reads BCC_KERNEL_SOURCE while compiling; the lock keeps concurrent loads from
        # seeing each other's tree.
        old = os.environ.get("BCC_KERNEL_SOURCE")
        os.environ["BCC_KERNEL_SOURCE"] = str(tree.path)
        try:
            bpf = _compile(bcc.BPF, text, flags)
        finally:
            if old is None:
                os.environ.pop("BCC_KERNEL_SOURCE", None)
            else:
                os.environ["BCC_KERNEL_SOURCE"] = old
    if isinstance(bpf, Exception):
        raise BpfLoadError(_explain_load_failure(source, bpf, diag.text, tree.kind)) from bpf
    _release_compiler_memory()
    return bpf


def _release_compiler_memory() -> None:
    """Hand the compiler's freed heap back to the OS.

    clang/LLVM free tens of MB after a compile, but glibc keeps freed memory in its arenas;
    ``malloc_trim`` returns it (measured: ~40 MB of RSS per compiled program).
    """
    # Not glibc (no malloc_trim): nothing to trim this way.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


#: madvise(2) advice: reclaim these pages now (Linux >= 5.4).
_MADV_PAGEOUT = 21
#: Shared libraries of the BPF compiler (bcc bundles clang and LLVM in libbcc).
_COMPILER_LIBS = re.compile(r"/lib(bcc|LLVM|clang)[^/]*\.so")


def unload(bpf: Any) -> None:
    """Detach and unload every program of a bcc ``BPF`` object and drop its maps.

    bcc also registers ``cleanup`` with atexit, which would keep the object (and its
    compiled module) alive until the process exits: unregister it.
    """
    bpf.cleanup()
    atexit.unregister(bpf.cleanup)


def release_compiler_pages(maps_path: str = "/proc/self/maps") -> int:
    """Tell the kernel the compiler's code pages are cold once every program is loaded.

    ``import bcc`` maps clang/LLVM (about 160 MB of code); compiling touches much of it and
    those pages stay resident, counted in the agent's RSS, though nothing runs them again
    until the next compile. They are clean, file-backed pages: MADV_PAGEOUT drops them, and
    the few that map reads need are faulted back in on use (measured: RSS 141 -> 68 MB with
    the sched and net programs loaded). Call it after the last compile.

    Returns:
        Bytes of mappings advised (0 where madvise or the advice is not supported).
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    advised = 0
    try:
        with open(maps_path, encoding="ascii", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return 0
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or not _COMPILER_LIBS.search(parts[5]):
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if madvise(start, end - start, _MADV_PAGEOUT) == 0:
            advised += end - start
    return advised


def _compile(factory: Any, text: str, flags: list[str]) -> Any:
    """Run bcc's compiler, returning the exception instead of raising (bcc raises bare ones)."""
    try:
        return factory(text=text.encode(), cflags=flags)
    except Exception as e:
        return e


def _explain_load_failure(source: str, err: Exception, diagnostics: str, kind: str) -> str:
    if os.geteuid() != 0 or "super-user" in str(err) or "not permitted" in str(err):
        return (
            f"loading {source} was refused ({err}); run the daemon as root "
            "(or with CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN)"
        )
    lines = [ln for ln in diagnostics.splitlines() if "error" in ln.lower()][:5]
    detail = "; ".join(lines) or str(err)
    return (
        f"compiling {source} against {kind} kernel headers failed: {detail}; "
        "check that bcc matches this kernel (see `bpfdyno doctor`)"
    )


class _Captured:
    text = ""


@contextlib.contextmanager
def _captured_stderr() -> Iterator[_Captured]:
    """Capture fd 2 (clang writes diagnostics there), then replay it to the real stderr."""
    out = _Captured()
    with tempfile.TemporaryFile() as tmp:
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            data = tmp.read()
            out.text = data.decode("utf-8", "replace")
            if data:
                os.write(2, data)


def program_fds(bpf: bcc.BPF) -> dict[str, int]:
    """Loaded program name -> fd for one BPF object (bcc keeps them in ``bpf.funcs``)."""
    return {
        (name.decode() if isinstance(name, bytes) else str(name)): int(fn.fd)
        for name, fn in bpf.funcs.items()
    }


def program_ids(bpf: bcc.BPF) -> dict[str, int]:
    """Loaded program name -> kernel program id (from ``/proc/self/fdinfo``)."""
    return {name: int(_fdinfo(fd).get("prog_id", -1)) for name, fd in program_fds(bpf).items()}


@dataclass(frozen=True, slots=True)
class LoadedProgram:
    """One BPF program loaded in the kernel, as ``bpftool prog show`` lists it."""

    id: int
    name: str
    pids: tuple[int, ...]


def loaded_programs(prefix: str = PROG_PREFIX) -> list[LoadedProgram]:
    """BPF programs in the kernel whose name starts with ``prefix`` (all processes).

    Raises:
        BpfLoadError: bpftool is missing or failed.
    """
    bpftool = shutil.which("bpftool") or shutil.which("bpftool", path="/usr/sbin:/sbin")
    if bpftool is None:
        raise BpfLoadError("bpftool is not installed; install it (apt-get install bpftool)")
    res = subprocess.run(
        [bpftool, "prog", "show", "--json"], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        raise BpfLoadError(f"bpftool prog show failed: {res.stderr.strip()}; run as root")
    progs: list[dict[str, Any]] = json.loads(res.stdout or "[]")
    return [
        LoadedProgram(
            int(p["id"]), str(p.get("name", "")), tuple(int(x["pid"]) for x in p.get("pids", ()))
        )
        for p in progs
        if str(p.get("name", "")).startswith(prefix[:15])
    ]


def map_items(table: Any, chunk: int = 1024) -> list[tuple[Any, Any]]:
    """All (key, leaf) pairs of a bcc hash table (not per-CPU), read in batches.

    One ``BPF_MAP_LOOKUP_BATCH`` syscall per ``chunk`` entries instead of two per entry.
    bcc's own ``items_lookup_batch`` allocates ``max_entries``-sized arrays on every call and
    shares one variable between the in and out cursors, hence this. Falls back to key-by-key
    iteration on kernels without batch operations (< 5.6).

    Keys and leaves of scalar types come back as Python ints, structs as bcc's ctypes
    structs.
    """
    from bcc.libbcc import lib

    out: list[tuple[Any, Any]] = []
    in_tok = ctypes.c_uint32(0)
    out_tok = ctypes.c_uint32(0)
    count = ctypes.c_uint32(0)
    first = True
    while True:
        # Fresh buffers per chunk: the returned leaves are views into them.
        keys = (table.Key * chunk)()
        vals = (table.Leaf * chunk)()
        count.value = chunk
        res = lib.bpf_lookup_batch(
            table.map_fd,
            None if first else ctypes.byref(in_tok),
            ctypes.byref(out_tok),
            ctypes.byref(keys),
            ctypes.byref(vals),
            ctypes.byref(count),
        )
        err = ctypes.get_errno()
        out.extend(zip(keys[: count.value], vals[: count.value], strict=True))
        if res == 0:
            in_tok.value = out_tok.value
            first = False
            continue
        if err == errno.ENOENT:  # the last batch
            return out
        if first and err in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
            return [(_plain(k), _plain(v)) for k, v in table.items()]
        raise OSError(err, f"BPF_MAP_LOOKUP_BATCH failed: {os.strerror(err)}")


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, ctypes._SimpleCData) else value


def programs_still_loaded(ids: Iterable[int], timeout_s: float = 3.0) -> set[int]:
    """Which of the program ``ids`` are still in the kernel after waiting up to ``timeout_s``.

    The kernel frees a program shortly (RCU-deferred) after its last fd closes, so a check
    right after ``close()`` needs a moment.
    """
    want = set(ids)
    deadline = time.monotonic() + timeout_s
    while True:
        left = want & {p.id for p in loaded_programs(prefix="")}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)


def _fdinfo(fd: int) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        text = Path(f"/proc/self/fdinfo/{fd}").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


# --- BPF run-time statistics -------------------------------------------------------------

_BPF_ENABLE_STATS = 32  # enum bpf_cmd
_BPF_STATS_RUN_TIME = 0  # enum bpf_stats_type
_NR_BPF = {"x86_64": 321, "aarch64": 280}


def enable_bpf_stats() -> int:
    """Turn on kernel BPF run-time stats; they stay on until the returned fd is closed.

    Raises:
        OSError: the kernel refused (EINVAL before 5.8, EPERM without CAP_SYS_ADMIN).
    """
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf syscall number unknown on {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    attr = (ctypes.c_uint8 * 128)()  # union bpf_attr, zeroed; enable_stats.type is at 0
    ctypes.c_uint32.from_buffer(attr, 0).value = _BPF_STATS_RUN_TIME
    fd = int(libc.syscall(nr, _BPF_ENABLE_STATS, ctypes.byref(attr), ctypes.sizeof(attr)))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


@dataclass(frozen=True, slots=True)
class ProgramRunStats:
    """Cost of one program over one stats window."""

    program: str
    runs: int
    run_time_ns: int
    window_s: float

    @property
    def ns_per_event(self) -> float:
        """Mean run time of one invocation (NaN when it never ran)."""
        return self.run_time_ns / self.runs if self.runs else float("nan")

    @property
    def runs_per_second(self) -> float:
        """Invocations per second of the window."""
        return self.runs / self.window_s if self.window_s > 0 else float("nan")


class BpfRunStats:
    """Duty-cycled BPF run-time statistics for the programs of one ``bcc.BPF`` object.

    Stats are switched on through the ``BPF_ENABLE_STATS`` fd (never the global sysctl) for
    ``on_s`` seconds every ``period_s`` seconds by a small thread; `last_window` returns the
    per-program cost measured in the latest completed window. `stop` closes the fd, which
    restores the kernel's previous state.
    """

    def __init__(self, bpf: bcc.BPF, on_s: float = 1.0, period_s: float = 10.0) -> None:
        if not 0 < on_s <= period_s:
            raise ValueError(f"need 0 < on_s <= period_s, got on_s={on_s} period_s={period_s}")
        self._fds = program_fds(bpf)
        self._on_s = on_s
        self._period_s = period_s
        self._lock = threading.Lock()
        self._last: dict[str, ProgramRunStats] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.unavailable_reason = ""

    def start(self) -> None:
        """Start the duty cycle; if the kernel refuses stats, record why and do nothing."""
        try:
            os.close(enable_bpf_stats())
        except OSError as e:
            self.unavailable_reason = (
                f"BPF run statistics refused ({e.strerror}); they need Linux >= 5.8 and "
                "CAP_SYS_ADMIN"
            )
            log.warning("%s", self.unavailable_reason)
            return
        self._thread = threading.Thread(target=self._run, name="bpf-run-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the duty cycle and close the stats fd (restoring the global state)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def measure(self, seconds: float) -> dict[str, ProgramRunStats]:
        """Measure one window of ``seconds`` now, on the calling thread (for benchmarks).

        Raises:
            OSError: the kernel refused BPF stats.
        """
        return self._measure(seconds, threading.Event())

    def _measure(self, seconds: float, interrupt: threading.Event) -> dict[str, ProgramRunStats]:
        fd = enable_bpf_stats()
        try:
            before, t0 = self.read_counters(), time.monotonic()
            interrupt.wait(seconds)
            after, t1 = self.read_counters(), time.monotonic()
        finally:
            os.close(fd)
        return _window(before, after, t1 - t0)

    def read_counters(self) -> dict[str, tuple[int, int]]:
        """Cumulative (run_cnt, run_time_ns) per program, from ``/proc/self/fdinfo``."""
        out: dict[str, tuple[int, int]] = {}
        for name, fd in self._fds.items():
            info = _fdinfo(fd)
            out[name] = (int(info.get("run_cnt", 0)), int(info.get("run_time_ns", 0)))
        return out

    def last_window(self) -> dict[str, ProgramRunStats]:
        """Per-program cost in the latest completed window ({} before the first one)."""
        with self._lock:
            return dict(self._last)

    def samples(self) -> list[Sample]:
        """The ``bpf_program_*`` samples of the latest window (nothing before it)."""
        return run_stats_samples(self.last_window())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                result = self._measure(self._on_s, self._stop)
            except OSError as e:
                log.warning("BPF run statistics stopped: %s", e)
                return
            if self._stop.is_set():
                return
            with self._lock:
                self._last = result
            self._stop.wait(self._period_s - self._on_s)


def _window(
    before: Mapping[str, tuple[int, int]], after: Mapping[str, tuple[int, int]], window_s: float
) -> dict[str, ProgramRunStats]:
    out: dict[str, ProgramRunStats] = {}
    for name, (cnt1, ns1) in after.items():
        cnt0, ns0 = before.get(name, (cnt1, ns1))
        out[name] = ProgramRunStats(name, max(cnt1 - cnt0, 0), max(ns1 - ns0, 0), window_s)
    return out


def run_stats_samples(stats: Mapping[str, ProgramRunStats]) -> list[Sample]:
    """Turn per-program window stats into ``bpf_program_*`` samples."""
    out: list[Sample] = []
    for name, st in sorted(stats.items()):
        labels = {"program": name}
        out.append(sample(BPF_RUN_NS_PER_EVENT, st.ns_per_event, labels))
        out.append(sample(BPF_RUNS_PER_SECOND, st.runs_per_second, labels))
    return out
