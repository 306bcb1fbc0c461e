"""`GlooWaits`: the cumulative time each watched process's threads waited for their gloo peers.

gloo reads and writes its peer connections on its own loop thread without blocking (after
epoll says a socket is ready); a thread running a collective waits in
``gloo::transport::tcp::UnboundBuffer::waitRecv`` until the peer's bytes have arrived on the
connection, and in ``waitSend`` until its own have gone, which gloo's TCP transport does only
once the peer has posted the matching receive. ``bpf/gloo.bpf.c`` times both functions with a
uprobe and a uretprobe each on the library that holds gloo (PyTorch's ``libtorch_cpu.so``),
summed per process: which of the two a rank waits in depends on its place in the
collective's algorithm (docs/detection.md). The program is compiled
and loaded on a thread of its own when the first process is asked about (a compile takes
seconds: the detection's round does not wait for it; a process has no value until then);
each library file is probed once, whichever process led to it.

A wait is counted while it lasts, not only when it ends: a process's total is its finished
waits plus, for each of its threads waiting now, the time since that wait began
(`wait_so_far`). So a rank whose peers are blocked for longer than the detection's interval
(a hung or long-held rank) shows them waiting in every interval, not in one lump when the
wait returns.

The file is held open and probed as ``/proc/self/fd/N``: the process that led to it (through
``/proc/PID/root``, its mount namespace) may be gone when the probes are detached.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from bpfdyno.core.budget import excluded_work
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.maps import map_items
from bpfdyno.ebpf.program import BpfProgram
from bpfdyno.ebpf.uprobe import UprobeError, mapped_library, symbol_offset

log = logging.getLogger(__name__)

SOURCE = "gloo.bpf.c"
#: gloo::transport::tcp::UnboundBuffer::waitRecv(int*, std::chrono::milliseconds).
WAIT_RECV = (
    "_ZN4gloo9transport3tcp13UnboundBuffer8waitRecvEPiNSt6chrono8durationIlSt5ratioILl1ELl1000EEEE"
)
#: gloo::transport::tcp::UnboundBuffer::waitSend(int*, std::chrono::milliseconds).
WAIT_SEND = (
    "_ZN4gloo9transport3tcp13UnboundBuffer8waitSendEPiNSt6chrono8durationIlSt5ratioILl1ELl1000EEEE"
)
#: The functions timed: a thread running a collective waits for its peers in one of them.
WAITS = (WAIT_RECV, WAIT_SEND)
#: Library file names that hold gloo in PyTorch's builds (checked for the symbol).
LIBRARIES = ("libtorch_cpu", "libgloo")


def gloo_library(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The path (in the process's mount namespace) of the library that may hold gloo.

    Raises:
        OSError: the process is gone or its maps cannot be read.
    """
    return mapped_library(pid, LIBRARIES, proc_root)


def wait_so_far(finished_ns: int, started_ns: Iterable[int], now_ns: int) -> int:
    """A process's time waiting for its peers so far: its finished waits' total, plus for
    each of its threads waiting now (``started_ns``: when each wait began, on the
    ``CLOCK_MONOTONIC`` clock of ``now_ns``) the time since. A wait that began after ``now_ns``
    was read counts nothing yet."""
    return finished_ns + sum(max(0, now_ns - start) for start in started_ns)


@dataclass(frozen=True, slots=True)
class GlooSettings:
    """Map sizes (``[detection] gloo_max_ranks``, ``gloo_max_threads``)."""

    max_ranks: int = 256
    max_threads: int = 4096


@dataclass(slots=True)
class _Library:
    fd: int
    pids: set[int] = field(default_factory=set)

    @property
    def path(self) -> str:
        return f"/proc/self/fd/{self.fd}"


class GlooWaits:
    """gloo.bpf.c, loaded on first use; ``wait_ns(pid)`` is a process's total so far.

    Args:
        settings: the map sizes.
        proc_root: ``/proc``.
        header_cache: where generated kernel headers are cached (default in /var/cache).
    """

    def __init__(
        self,
        settings: GlooSettings | None = None,
        proc_root: Path = Path("/proc"),
        header_cache: Path | None = None,
    ) -> None:
        self._settings = settings or GlooSettings()
        self._proc = proc_root
        self._header_cache = header_cache
        self._lock = threading.Lock()
        self._program: BpfProgram | None = None
        self._loader: threading.Thread | None = None
        self._closed = False
        #: Why the program could not be loaded ("" while it could, or was not tried).
        self.error = ""
        self._libraries: dict[tuple[int, int], _Library] = {}  # (st_dev, st_ino) -> probed file
        #: Watched pids -> the library they map; None: no gloo in it.
        self._watched: dict[int, tuple[int, int] | None] = {}

    def wait_ns(self, pid: int) -> int | None:
        """The time ``pid``'s threads have waited in gloo for their peers since it was first
        asked about with the program loaded (None: not loaded yet, no gloo in it, or the
        probes cannot be attached)."""
        with self._lock:
            if self._program is None:
                self._start_loading()
                return None
            if pid not in self._watched:
                self._watched[pid] = self._watch(pid)
            if self._watched[pid] is None:
                return None
            # The totals first, then the waits in progress: the program removes a wait from
            # those in progress before adding it to the total, so no wait is counted twice
            # (one that ends between the two reads is counted at the next reading).
            try:
                finished = int(self._program.table("bpfdyno_glpids")[pid].wait_ns)
            except KeyError:
                return None
            started = [
                int(w.start_ns)
                for _, w in map_items(self._program.table("bpfdyno_glstart"))
                if w.tgid == pid
            ]
            return wait_so_far(finished, started, time.monotonic_ns())

    def forget(self, live: set[int]) -> None:
        """Stop watching the pids not in ``live`` (exited ranks); a library no watched process
        maps any more loses its probes."""
        with self._lock:
            gone = [p for p in self._watched if p not in live]
            if gone and self._program is not None:
                # A process that died waiting leaves its threads' waits in progress behind.
                starts = self._program.table("bpfdyno_glstart")
                for tid, w in map_items(starts):
                    if w.tgid in gone:
                        with contextlib.suppress(KeyError):
                            del starts[tid]
            for pid in gone:
                lib_key = self._watched.pop(pid)
                if lib_key is None:
                    continue
                if self._program is not None:
                    with contextlib.suppress(KeyError):  # gone with its library's probes
                        del self._program.table("bpfdyno_glpids")[pid]
                lib = self._libraries.get(lib_key)
                if lib is not None:
                    lib.pids.discard(pid)
                    if not lib.pids:
                        self._drop(lib_key, lib)

    def close(self) -> None:
        """Detach everything and unload the program."""
        with self._lock:
            self._closed = True
            loader = self._loader
        if loader is not None:
            loader.join()  # a program loaded meanwhile is closed below
        with self._lock:
            for key, lib in list(self._libraries.items()):
                self._drop(key, lib)
            if self._program is not None:
                self._program.close()
                self._program = None
            self._watched.clear()

    def _watch(self, pid: int) -> tuple[int, int] | None:
        try:
            path = gloo_library(pid, self._proc)
        except OSError:
            return None
        if path is None:
            return None
        try:
            fd = os.open(f"{os.fspath(self._proc)}/{pid}/root{path}", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        lib = self._libraries.get(key)
        if lib is not None:
            os.close(fd)
        else:
            lib = _Library(fd)
            try:
                with excluded_work():  # once per library: its symbols read, its probes set
                    self._probe(lib)
            except (UprobeError, BpfLoadError) as e:
                os.close(fd)
                if not isinstance(e, UprobeError):  # the probes refused: said once per file
                    log.warning("gloo peer waits: %s not probed: %s", path, e)
                return None
            self._libraries[key] = lib
        assert self._program is not None
        table = self._program.table("bpfdyno_glpids")
        try:
            table[pid] = table.Leaf(0, 0)
        except OSError as e:  # the map is full
            log.warning("gloo peer waits: process %d not watched: %s", pid, e)
            return None
        lib.pids.add(pid)
        return key

    def _probe(self, lib: _Library) -> None:
        """Probe every wait of one gloo library, all or none.

        Raises:
            UprobeError: the library lacks a wait (no gloo in this build).
            BpfLoadError: the kernel refused a probe.
        """
        for symbol in WAITS:  # no gloo in this build: nothing to probe
            symbol_offset(lib.path, symbol)
        program = self._program
        assert program is not None
        attached: list[tuple[str, bool]] = []
        try:
            for symbol in WAITS:
                program.attach_uprobe(lib.path, symbol, "bpfdyno_gl_enter")
                attached.append((symbol, False))
                program.attach_uprobe(lib.path, symbol, "bpfdyno_gl_leave", retprobe=True)
                attached.append((symbol, True))
        except BpfLoadError:
            for symbol, retprobe in attached:  # all or none
                program.detach_uprobe(lib.path, symbol, retprobe=retprobe)
            raise

    def _start_loading(self) -> None:
        """Compile and load the program on a thread (once; not after a failure)."""
        if self._loader is None and not self.error and not self._closed:
            self._loader = threading.Thread(target=self._load, name="gloo-load", daemon=True)
            self._loader.start()

    def _load(self) -> None:
        s = self._settings
        try:
            program = BpfProgram.load(
                SOURCE,
                defines={"GLOO_MAX_PROCS": s.max_ranks, "GLOO_MAX_THREADS": s.max_threads},
                header_cache=self._header_cache,
            )
        except BpfLoadError as e:
            self.error = str(e)
            log.warning("gloo peer waits unavailable: %s", e)
            return
        with self._lock:
            if self._closed:
                program.close()
            else:
                self._program = program

    def _drop(self, key: tuple[int, int], lib: _Library) -> None:
        if self._program is not None:
            for symbol in WAITS:
                for retprobe in (False, True):
                    self._program.detach_uprobe(lib.path, symbol, retprobe=retprobe)
        os.close(lib.fd)
        self._libraries.pop(key, None)
