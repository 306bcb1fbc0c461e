"""One BPF program file of bpfdyno, from compile to unload: `BpfProgram`.

Programs are files in the ``bpfdyno.bpf`` package. `BpfProgram.load` reads one and has the
compile helper (`bpfdyno.ebpf.compiled`) compile it with bcc against a header tree for the
running kernel (`bpfdyno.ebpf.kheaders`), taking over its maps' fds and its functions'
instructions: bcc, clang and LLVM never enter this process. Settings
reach the C code only as ``-D`` defines, and the C side refuses to compile without the ones
it needs, so every default lives in Python (the config sections). The object then attaches
functions to raw tracepoints, tracepoints and uprobes, opens ring buffers with a decode
callback, loading each function as the program type its attachment needs (`bpfdyno.ebpf.fdops`),
reports its functions' cost from the process-wide run statistics
(`bpfdyno.ebpf.runstats`), and `close` undoes all of it.

Each attachment remembers how it was made, so it can be taken off and put back without a
compile or a verification: the owner attaches and detaches (`attach_*`, `detach_*`), and
the overhead budget may hold a function off (`suspend`) or let it run only part of the time
(`set_off_phase`, driven by `bpfdyno.ebpf.duty`) while the owner still wants it. How long
each function was attached (`attached_ns`) lets its reader scale what it counted.

Functions written as BTF-typed programs (``tp_btf`` tracepoints, task iterators) are loaded
by `bpfdyno.ebpf.btfprog` under their own names.

Every function and map in the C programs is named ``bpfdyno_...`` (see
`bpfdyno.ebpf.introspect`), so ``bpftool`` shows whose they are.
"""

from __future__ import annotations

import importlib.resources
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

from bpfdyno.core.budget import excluded_work
from bpfdyno.core.gcbatch import batch_allocations
from bpfdyno.core.metrics import Sample
from bpfdyno.ebpf import btfprog, fdops, uprobe
from bpfdyno.ebpf.compiled import Compiled, compile_in_helper
from bpfdyno.ebpf.compiler import trim_heap
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.fdmap import MapTable, RecordLayout, RingReader
from bpfdyno.ebpf.introspect import fdinfo
from bpfdyno.ebpf.kheaders import HeaderFlavour, KernelHeadersError, ensure_headers
from bpfdyno.ebpf.runstats import DEFAULT_ON_S, DEFAULT_PERIOD_S, METER, run_stats_samples
from bpfdyno.ebpf.tracefs import MOUNT_COMMAND, TracefsError, ensure_tracefs

#: perf_event_attr.type of a tracepoint.
PERF_TYPE_TRACEPOINT = 2

__all__ = ["BpfLoadError", "BpfProgram", "RingBuffer", "TaskIterator", "bpf_source_dir"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def bpf_source_dir() -> Path:
    """The directory holding the ``bpfdyno.bpf`` C sources."""
    return Path(str(importlib.resources.files("bpfdyno.bpf")))


class RingBuffer(Generic[T]):
    """One BPF ring buffer of a `BpfProgram`, its records decoded as they are consumed.

    Made by `BpfProgram.open_ring_buffer`; ``decode`` receives each record as a named tuple
    of the C type's fields (`bpfdyno.ebpf.fdmap.RecordLayout`: a ``char`` array is its raw
    bytes, NUL padding included), or as the ctypes struct bcc derives from the C type where
    a struct format cannot read it.
    """

    def __init__(self, table: MapTable, decode: Callable[[Any], T]) -> None:
        record_type = table.record_type
        if record_type is None:
            raise OSError(f"map {table.name} has no record type (not a ring buffer)")
        self._decode = decode
        self._pending: list[T] = []
        self._reader = RingReader(table.map_fd, table.max_entries, RecordLayout(record_type))

    def drain(self) -> list[T]:
        """Consume every record waiting now (without blocking) and return them decoded."""
        self.consume()
        out, self._pending = self._pending, []
        return out

    def consume(self) -> None:
        """Decode every record waiting now, keeping them for `drain`."""
        with batch_allocations():
            self._pending.extend(map(self._decode, self._reader.consume()))

    @property
    def fill(self) -> float:
        """The share of the ring the records waiting at the last drain filled (0-1)."""
        return self._reader.fill

    def close(self) -> None:
        self._reader.close()


class TaskIterator:
    """A task iterator of a `BpfProgram` (``open_task_iterator``): `read` runs it once."""

    def __init__(self, program: BpfProgram, link_fd: int) -> None:
        self._program = program
        self._link_fd = link_fd

    def read(self) -> bytes:
        """Everything the iterator's function wrote for every task, in one run.

        Raises:
            RuntimeError: the program was closed.
            OSError: the kernel failed to run it.
        """
        self._program._require()
        return btfprog.read_iterator(self._link_fd)


@dataclass(slots=True)
class _Hook:
    """One function on one attach point, and who wants it attached.

    It is attached while its owner wants it, the budget does not hold it off, and (when it
    is sampled in time) it is in its on phase. ``on`` attaches it (returning a link fd to
    close for BTF-typed programs, else None), ``off`` takes it off.
    """

    fn: str
    target: str
    on: Callable[[], int | None]
    off: Callable[[int | None], None]
    wanted: bool = True
    suspended: bool = False
    off_phase: bool = False
    link: int | None = None
    live: bool = False
    since_ns: int = 0
    total_ns: int = 0

    @property
    def should_run(self) -> bool:
        return self.wanted and not self.suspended and not self.off_phase

    def attached_ns(self, now_ns: int) -> int:
        return self.total_ns + (now_ns - self.since_ns if self.live else 0)


class BpfProgram:
    """A compiled program file loaded into the kernel, and everything hung off it.

    Use `load` to make one, and `close` (or a ``with`` block) to detach and unload it.
    """

    def __init__(self, compiled: Compiled, source: str) -> None:
        """Take over what the compile helper made; `load` is the usual way in."""
        self._compiled: Compiled | None = compiled
        self._stats_requested = False
        #: Loaded functions: name -> program fd (each function is loaded once, as the
        #: program type of its first attachment).
        self._fds: dict[str, int] = {}
        #: Links that are not attachments (task iterators), uprobes by how they were made,
        #: and open ring buffers.
        self._links: list[int] = []
        self._uprobes: dict[tuple[str, str, int, bool], int] = {}
        self._rings: list[RingBuffer[Any]] = []
        #: Every attachment, by (function, attach point); see `_Hook`.
        self._hooks: dict[tuple[str, str], _Hook] = {}
        self._ids: dict[int, int] = {}  # program fd -> kernel program id
        self._tracefs: Path | None = None
        # Attaching and detaching happen on the owner's thread, the budget's and the duty
        # cycler's: one at a time.
        self._lock = threading.RLock()
        #: The program file, e.g. ``"sched.bpf.c"``.
        self.source = source
        METER.register(self)

    @classmethod
    def load(
        cls,
        source: str,
        *,
        defines: Mapping[str, int] | None = None,
        cflags: Sequence[str] = (),
        flavour: HeaderFlavour = "minimal",
        header_cache: Path | None = None,
    ) -> BpfProgram:
        """Compile and load one program file of the ``bpfdyno.bpf`` package.

        Args:
            source: file name inside the package, e.g. ``"sched.bpf.c"``; ``#include "x.h"``
                finds the package's headers.
            defines: settings, passed as ``-DNAME=value``.
            cflags: further compiler flags (e.g. ``-DNET_NO_DROPS`` to leave out a part).
            flavour: ``minimal`` for tracepoint/uprobe programs, ``btf`` for programs that
                read kernel structs (see `bpfdyno.ebpf.kheaders`).
            header_cache: where generated kernel headers are cached (default in /var/cache).

        Returns:
            The loaded program; nothing is attached yet.

        Raises:
            BpfLoadError: bcc missing, no headers, compile or load failure; the message says
                what to do.
        """
        with excluded_work():  # starting work, not the agent's running cost
            return cls._load(source, defines, cflags, flavour, header_cache)

    @classmethod
    def _load(
        cls,
        source: str,
        defines: Mapping[str, int] | None,
        cflags: Sequence[str],
        flavour: HeaderFlavour,
        header_cache: Path | None,
    ) -> BpfProgram:
        src_dir = bpf_source_dir()
        src_path = src_dir / source
        if not src_path.is_file():
            raise BpfLoadError(f"no BPF program {source!r} in {src_dir}; reinstall bpfdyno")
        text = src_path.read_text(encoding="utf-8")
        try:
            tree = ensure_headers(flavour, header_cache)
        except KernelHeadersError as e:
            raise BpfLoadError(str(e)) from e
        tracefs: Path | None = None
        try:
            tracefs = ensure_tracefs()
        except TracefsError as e:
            # Raw tracepoints and uprobes work without tracefs; tracepoints fail to attach.
            log.warning("%s", e)
        settings = [f"-D{name}={value}" for name, value in (defines or {}).items()]
        flags = [f"-I{src_dir}", *settings, *cflags]
        program = cls(compile_in_helper(source, text, flags, tree), source)
        program._tracefs = tracefs
        return program

    # --- attaching -----------------------------------------------------------------------

    def attach_raw_tracepoint(
        self, tracepoint: str, fn: str, before_attach: Callable[[], None] | None = None
    ) -> None:
        """Load function ``fn`` and attach it to raw tracepoint ``tracepoint``.

        ``before_attach``: as for `attach_btf_tracepoint`.

        Raises:
            BpfLoadError: the verifier refused ``fn``, or the tracepoint does not exist.
        """

        def on() -> int:
            if before_attach is not None:
                before_attach()
            fd = self._function_fd(fn, fdops.PROG_RAW_TRACEPOINT)
            return self._attach_call(
                f"raw tracepoint {tracepoint}",
                fn,
                lambda: fdops.open_raw_tracepoint(tracepoint, fd),
            )

        self._attach(fn, f"raw:{tracepoint}", on, _close_link)

    def attach_tracepoint(self, tracepoint: str, fn: str) -> None:
        """Load function ``fn`` and attach it to tracepoint ``category:event``.

        Raises:
            BpfLoadError: the verifier refused ``fn``, the tracepoint does not exist, or
                tracefs is not mounted.
        """

        def on() -> int:
            fd = self._function_fd(fn, fdops.PROG_TRACEPOINT)

            def open_() -> int:
                if self._tracefs is None:
                    raise OSError(f"tracefs is not mounted ({MOUNT_COMMAND})")
                perf = fdops.perf_event_open(
                    PERF_TYPE_TRACEPOINT, fdops.tracepoint_id(self._tracefs, tracepoint)
                )
                return fdops.set_bpf(perf, fd)

            return self._attach_call(f"tracepoint {tracepoint}", fn, open_)

        self._attach(fn, f"tp:{tracepoint}", on, _close_link)

    def attach_btf_tracepoint(
        self, tracepoint: str, fn: str, before_attach: Callable[[], None] | None = None
    ) -> None:
        """Load function ``fn`` as a BTF-typed (tp_btf) program and attach it to ``tracepoint``.

        ``fn`` takes ``u64 *ctx``: the tracepoint's arguments, pointers among them typed by
        the kernel's BTF (read their fields with ``BPFDYNO_LOAD``). ``before_attach`` runs
        before every attach (the first and each one after a gap), for a function that must
        know it was off meanwhile.

        Raises:
            BpfLoadError: no BTF, no such tracepoint, or the verifier refused ``fn``.
        """
        with self._lock:
            fd = self._fds.get(fn)
            if fd is None:
                fd = self._load_btf(fn, btfprog.BPF_TRACE_RAW_TP, tracepoint)

        def on() -> int:
            if before_attach is not None:
                before_attach()
            try:
                return btfprog.attach_tracepoint(fd)
            except OSError as e:
                raise BpfLoadError(
                    f"attaching {fn} of {self.source} to tracepoint {tracepoint} failed "
                    f"({e.strerror}); see `bpfdyno doctor` for what this kernel lacks"
                ) from e

        def off(link: int | None) -> None:
            if link is not None:
                os.close(link)

        self._attach(fn, f"btf:{tracepoint}", on, off)

    def open_task_iterator(self, fn: str) -> TaskIterator:
        """Load function ``fn`` as a task iterator (``struct bpf_iter__task *ctx``).

        Raises:
            BpfLoadError: the kernel has no task iterators (Linux < 5.8) or refused ``fn``.
        """
        fd = self._load_btf(fn, btfprog.BPF_TRACE_ITER, "task")
        try:
            link = btfprog.link_iterator(fd)
        except OSError as e:
            raise BpfLoadError(
                f"linking the task iterator {fn} of {self.source} failed ({e.strerror}); "
                "task iterators need Linux >= 5.8"
            ) from e
        self._links.append(link)
        return TaskIterator(self, link)

    def _load_btf(self, fn: str, attach_type: int, target: str) -> int:
        compiled = self._require()
        if fn in self._fds:
            raise BpfLoadError(f"{fn} of {self.source} is already loaded")
        insns = compiled.functions.get(fn)
        if insns is None:
            raise BpfLoadError(f"no function {fn} in {self.source}")
        with excluded_work():  # the verifier's work, once
            fd = btfprog.load_tracing(insns, compiled.license, fn, attach_type, target)
        self._fds[fn] = fd
        trim_heap()  # libbpf parsed the kernel's BTF for the target's id: ~14 MB, freed
        return fd

    def _function_fd(self, fn: str, prog_type: int) -> int:
        """The program fd of ``fn``, loading it as ``prog_type`` the first time.

        Raises:
            BpfLoadError: no such function, or the verifier refused it (with its log).
        """
        with self._lock:
            compiled = self._require()
            fd = self._fds.get(fn)
            if fd is not None:
                return fd
            insns = compiled.functions.get(fn)
            if insns is None:
                raise BpfLoadError(f"no function {fn} in {self.source}")
            with excluded_work():  # the verifier's work, once
                fd, why = fdops.load_program(
                    insns, prog_type, fn, compiled.license, kern_version=compiled.kern_version
                )
            if fd < 0:
                raise BpfLoadError(
                    f"the kernel refused {fn} of {self.source} ({why}); see `bpfdyno doctor` "
                    "for what this kernel lacks"
                )
            self._fds[fn] = fd
            return fd

    def load_function(self, fn: str, prog_type: int) -> int:
        """Load ``fn`` as ``prog_type`` (`bpfdyno.ebpf.fdops`) without attaching it.

        Returns:
            Its program fd (this object closes it).

        Raises:
            BpfLoadError: no such function, or the verifier refused it.
        """
        return self._function_fd(fn, prog_type)

    def attach_uprobe(
        self, binary: str, symbol: str, fn: str, *, pid: int = -1, retprobe: bool = False
    ) -> None:
        """Load function ``fn`` and attach it to the entry (or return) of a user function.

        Args:
            binary: path of the executable or library, or a library name such as ``"c"``.
            symbol: the function's symbol.
            fn: the BPF function.
            pid: only in this process (-1: every process that maps ``binary``).
            retprobe: on return instead of entry.

        Raises:
            BpfLoadError: the verifier refused ``fn``, or the binary or symbol is not found.
        """
        kind = "uretprobe" if retprobe else "uprobe"
        key = (binary, symbol, pid, retprobe)
        with self._lock:
            fd = self._function_fd(fn, fdops.PROG_KPROBE)

            def open_() -> int:
                path = uprobe.resolve_binary(binary, pid)
                offset = uprobe.symbol_offset(path, symbol)
                perf = uprobe.open_uprobe(path, offset, pid=pid, retprobe=retprobe)
                return fdops.set_bpf(perf, fd)

            perf = self._attach_call(f"{kind} {binary}:{symbol}", fn, open_)
            old = self._uprobes.pop(key, None)
            self._uprobes[key] = perf
        if old is not None:
            os.close(old)

    def detach_raw_tracepoint(self, tracepoint: str) -> None:
        """Detach whatever function is attached to raw tracepoint ``tracepoint``.

        The function stays loaded, so attaching it again costs no compile or verification.
        Nothing happens when nothing is attached there.
        """
        with self._lock:
            for hook in self._hooks.values():
                if hook.target == f"raw:{tracepoint}" and hook.wanted:
                    hook.wanted = False
                    self._sync(hook)

    def detach_uprobe(
        self, binary: str, symbol: str, *, pid: int = -1, retprobe: bool = False
    ) -> None:
        """Detach the uprobe (or uretprobe) `attach_uprobe` made with the same arguments.

        Raises:
            BpfLoadError: nothing of ours is attached there.
        """
        self._require()
        with self._lock:
            perf = self._uprobes.pop((binary, symbol, pid, retprobe), None)
        if perf is None:
            kind = "uretprobe" if retprobe else "uprobe"
            raise BpfLoadError(
                f"detaching the {kind} {binary}:{symbol} of {self.source} failed (it is not "
                "attached)"
            )
        os.close(perf)

    def _attach(
        self,
        fn: str,
        target: str,
        on: Callable[[], int | None],
        off: Callable[[int | None], None],
    ) -> None:
        """Attach ``fn`` at ``target`` for its owner (the budget may keep it off a while).

        Raises:
            BpfLoadError: attaching failed (the function is then not attached there).
        """
        with self._lock:
            self._require()
            hook = self._hooks.get((fn, target))
            if hook is None:
                hook = self._hooks[(fn, target)] = _Hook(fn, target, on, off, wanted=False)
            if hook.wanted:
                return
            hook.wanted = True
            try:
                self._sync(hook)
            except BaseException:
                hook.wanted = False
                raise

    def _sync(self, hook: _Hook) -> None:
        """Attach or detach ``hook`` to match what is wanted of it now.

        Raises:
            BpfLoadError: attaching failed.
        """
        if hook.should_run and not hook.live:
            hook.link = hook.on()
            hook.live, hook.since_ns = True, time.monotonic_ns()
        elif not hook.should_run and hook.live:
            hook.off(hook.link)
            hook.total_ns += time.monotonic_ns() - hook.since_ns
            hook.link, hook.live = None, False

    def _attach_call(self, target: str, fn: str, attach: Callable[[], int]) -> int:
        """Run ``attach`` (returns the fd that keeps the attachment), explaining failures."""
        self._require()
        try:
            return attach()
        except (OSError, uprobe.UprobeError) as e:
            raise BpfLoadError(
                f"attaching {fn} of {self.source} to {target} failed ({e}); run as root, and "
                "see `bpfdyno doctor` for what this kernel lacks"
            ) from e

    # --- what the overhead budget does -----------------------------------------------------

    def suspend(self, fns: Collection[str], suspended: bool) -> list[str]:
        """Hold functions ``fns`` off (``suspended``) or let them run again as their owner wants.

        Returns:
            Why some could not be attached again ([] when all were): the budget reports it.
        """
        return self._set(fns, "suspended", suspended)

    def set_off_phase(self, fns: Collection[str], off: bool) -> list[str]:
        """The off (True) or on phase of functions sampled in time (`bpfdyno.ebpf.duty`).

        Returns:
            Why some could not be attached again ([] when all were).
        """
        return self._set(fns, "off_phase", off)

    def _set(self, fns: Collection[str], flag: str, value: bool) -> list[str]:
        errors: list[str] = []
        with self._lock:
            if self._compiled is None:
                return errors
            for hook in self._hooks.values():
                if hook.fn not in fns or getattr(hook, flag) == value:
                    continue
                setattr(hook, flag, value)
                try:
                    self._sync(hook)
                except BpfLoadError as e:
                    errors.append(str(e))
        for why in errors:
            log.warning("%s", why)
        return errors

    def attached_ns(self, fn: str, now_ns: int | None = None) -> int | None:
        """How long function ``fn`` has been attached so far, summed over its attach points.

        None for a function attached some other way (uprobes): it is taken as attached
        whenever it is loaded. ``now_ns``: as of this `time.monotonic_ns` (default: now), so
        a caller can compare it with an interval of its own to the nanosecond.
        """
        now = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            hooks = [h for h in self._hooks.values() if h.fn == fn]
            return sum(h.attached_ns(now) for h in hooks) if hooks else None

    def attached(self, fn: str) -> bool:
        """Whether ``fn`` is attached right now (at any of its attach points)."""
        with self._lock:
            return any(h.live for h in self._hooks.values() if h.fn == fn)

    # --- maps and ring buffers -----------------------------------------------------------

    def table(self, name: str) -> MapTable:
        """Map ``name`` (read it with `bpfdyno.ebpf.maps`).

        Raises:
            KeyError: the program has no such map.
        """
        return self._require().maps[name]

    def open_ring_buffer(self, name: str, decode: Callable[[Any], T]) -> RingBuffer[T]:
        """Start consuming ring buffer map ``name``; ``decode`` turns each record into a T.

        Raises:
            BpfLoadError: ``name`` is not a ring buffer of this program.
        """
        table = self._require().maps.get(name)
        if table is None or table.map_type != fdops.MAP_TYPE_RINGBUF:
            raise BpfLoadError(
                f"opening ring buffer {name} of {self.source} failed (no such ring buffer); "
                "it must be a BPF_RINGBUF_OUTPUT map (Linux >= 5.8)"
            )
        try:
            ring = RingBuffer(table, decode)
        except OSError as e:
            raise BpfLoadError(
                f"opening ring buffer {name} of {self.source} failed ({e}); it must be a "
                "BPF_RINGBUF_OUTPUT map (Linux >= 5.8)"
            ) from e
        with self._lock:
            self._rings.append(ring)
        return ring

    def consume_ring_buffers(self) -> None:
        """Consume every open ring buffer now, without blocking (records wait in each)."""
        self._require()
        for ring in list(self._rings):
            ring.consume()

    # --- identity and cost ---------------------------------------------------------------

    def program_fds(self) -> dict[str, int]:
        """Loaded (attached) function name -> program fd."""
        with self._lock:
            self._require()
            return dict(self._fds)

    def program_ids(self) -> dict[str, int]:
        """Loaded function name -> kernel program id."""
        out: dict[str, int] = {}
        for name, fd in self.program_fds().items():
            found = self._ids.get(fd)
            if found is None:
                found = self._ids[fd] = int(fdinfo(fd).get("prog_id", -1))
            out[name] = found
        return out

    def map_ids(self) -> dict[str, int]:
        """Every map this program created (used from Python or not) -> kernel map id."""
        return {
            name: int(fdinfo(t.map_fd).get("map_id", -1))
            for name, t in self._require().maps.items()
        }

    def start_run_stats(
        self, on_s: float = DEFAULT_ON_S, period_s: float = DEFAULT_PERIOD_S
    ) -> None:
        """Ask the process-wide meter for windows of at least this frequency (see
        `bpfdyno.ebpf.runstats.ProcessRunStats`); every function of this program is in them,
        including those attached later."""
        METER.request(self, on_s, period_s)
        self._stats_requested = True

    def run_stats_samples(self) -> list[Sample]:
        """The ``bpf_program_*`` samples of this program's functions in the meter's latest
        window ([] before it)."""
        return run_stats_samples(METER.functions_of(self))

    # --- lifecycle -----------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once `close` ran."""
        return self._compiled is None

    def close(self) -> None:
        """Stop the run statistics, detach every function and unload the program (idempotent).

        The maps go with it: their values are lost.
        """
        METER.unregister(self)
        if self._stats_requested:
            METER.release(self)
            self._stats_requested = False
        with self._lock:
            for hook in self._hooks.values():
                if hook.live:
                    try:
                        hook.off(hook.link)
                    except Exception:  # closing the program's fds below detaches the rest
                        log.exception("detaching %s of %s failed", hook.fn, self.source)
                    hook.link, hook.live = None, False
            self._hooks = {}
            for ring in self._rings:
                ring.close()
            for fd in [*self._uprobes.values(), *self._links, *self._fds.values()]:
                os.close(fd)
            self._rings, self._uprobes, self._links, self._fds, self._ids = [], {}, [], {}, {}
            compiled, self._compiled = self._compiled, None
        if compiled is not None:
            compiled.close()

    def __enter__(self) -> BpfProgram:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _require(self) -> Compiled:
        if self._compiled is None:
            raise RuntimeError(f"the BPF program {self.source} is closed")
        return self._compiled


def loaded_program_ids(program: BpfProgram | None) -> frozenset[int]:
    """The kernel's ids of ``program``'s functions loaded now (none when it is None or was
    closed meanwhile: any thread may ask while another closes it)."""
    if program is None:
        return frozenset()
    try:
        return frozenset(program.program_ids().values())
    except RuntimeError:  # closed meanwhile
        return frozenset()


def _close_link(link: int | None) -> None:
    """Detach what an fd keeps attached (a raw tracepoint's or a perf event's)."""
    if link is not None:
        os.close(link)
