"""The NCCL calls of traced processes: ``bpf/nccl.bpf.c`` on the libnccl they map.

Nothing is recompiled or preloaded into the job: the library a traced process uses is found
in ``/proc/PID/maps`` (any mapped file named ``libnccl*.so*``, e.g. the ``nvidia-nccl-cu12``
wheel's ``libnccl.so.2``), opened through ``/proc/PID/root`` so a process in a container is
found too, and the API functions of `NCCL_FUNCTIONS` get a uprobe and a uretprobe each. The
probes sit on the library *file*: every process mapping that file traps into them while they
are attached (a few microseconds per call, see docs/performance.md), and only the traced ones
are recorded (``bpfdyno_nctgids``). They are attached when the first traced process using
that file is added and removed with the last one.

Removing them is slow: the kernel unregisters each uprobe under a lock with an RCU grace
period in it, about 110 ms each — 2.9 s for the 26 probes on one library (measured, and no
faster closed in parallel). That happens on a thread of its own ("nccl-detach"), so the
capture thread keeps draining the other traces' ring buffers and hands this trace's records
over at once. The tgid is out of the map before, so nothing more is recorded for it; a
library whose probes are still being removed is re-probed only once they are gone (two sets
at once would record every call twice).

A process that loads NCCL only after its trace started is looked for again by `rescan`.

Not thread-safe: one thread (the capture manager's) makes every call.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from bpfdyno.core.config import CaptureSection
from bpfdyno.core.workers import DaemonExecutor
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.ebpf.headers import header_enum, header_text
from bpfdyno.ebpf.maps import percpu_sums
from bpfdyno.ebpf.program import BpfProgram, RingBuffer, loaded_program_ids
from bpfdyno.ebpf.uprobe import mapped_library
from bpfdyno.tracing.capture.records import NcclCall, TrackStats

log = logging.getLogger(__name__)

SOURCE = "nccl.bpf.c"
_TGIDS = "bpfdyno_nctgids"
_RING = "bpfdyno_ncevent"
_TOTALS = "bpfdyno_nctotal"

#: (NCCL function, ``enum nccl_fn`` member, BPF entry function; the return one adds "_r").
NCCL_FUNCTIONS = (
    ("ncclAllReduce", "NCCL_FN_ALL_REDUCE", "bpfdyno_nc_ar"),
    ("ncclBroadcast", "NCCL_FN_BROADCAST", "bpfdyno_nc_bc"),
    ("ncclBcast", "NCCL_FN_BCAST", "bpfdyno_nc_bx"),
    ("ncclReduce", "NCCL_FN_REDUCE", "bpfdyno_nc_rd"),
    ("ncclAllGather", "NCCL_FN_ALL_GATHER", "bpfdyno_nc_ag"),
    ("ncclReduceScatter", "NCCL_FN_REDUCE_SCATTER", "bpfdyno_nc_rs"),
    ("ncclSend", "NCCL_FN_SEND", "bpfdyno_nc_sd"),
    ("ncclRecv", "NCCL_FN_RECV", "bpfdyno_nc_rv"),
    ("ncclAlltoAll", "NCCL_FN_ALL_TO_ALL", "bpfdyno_nc_aa"),
    ("ncclGather", "NCCL_FN_GATHER", "bpfdyno_nc_ga"),
    ("ncclScatter", "NCCL_FN_SCATTER", "bpfdyno_nc_sc"),
    ("ncclGroupStart", "NCCL_FN_GROUP_START", "bpfdyno_nc_gs"),
    ("ncclGroupEnd", "NCCL_FN_GROUP_END", "bpfdyno_nc_ge"),
)

#: ncclDataType_t (nccl.h).
DATATYPES = {
    0: "int8",
    1: "uint8",
    2: "int32",
    3: "uint32",
    4: "int64",
    5: "uint64",
    6: "float16",
    7: "float32",
    8: "float64",
    9: "bfloat16",
    10: "float8e4m3",
    11: "float8e5m2",
}
#: Bytes per element of each ncclDataType_t.
DATATYPE_BYTES = {0: 1, 1: 1, 2: 4, 3: 4, 4: 8, 5: 8, 6: 2, 7: 4, 8: 8, 9: 2, 10: 1, 11: 1}
#: ncclRedOp_t (nccl.h); larger values are user-defined ops.
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
#: ncclResult_t (nccl.h).
RESULTS = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
}


@cache
def function_names() -> dict[int, str]:
    """``enum nccl_fn`` number -> NCCL function name, from ``nccl.h``."""
    numbers = header_enum(header_text("nccl.h"), "nccl_fn")
    return {numbers[member]: name for name, member, _ in NCCL_FUNCTIONS}


@cache
def counter_slots() -> dict[str, int]:
    """``enum nccl_counter`` name -> its slot in ``bpfdyno_nctotal``, from ``nccl.h``."""
    return {
        k: v
        for k, v in header_enum(header_text("nccl.h"), "nccl_counter").items()
        if k != "NCCL_C_MAX"
    }


def find_libnccl(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The path of the libnccl file process ``pid`` maps (in its mount namespace), or None.

    Raises:
        OSError: the process is gone or its maps cannot be read.
    """
    return mapped_library(pid, ("libnccl",), proc_root)


@dataclass(slots=True)
class _Library:
    """One libnccl file with our probes on it.

    The file is held open and named to bcc as ``/proc/self/fd/N``: bcc looks the symbols up
    again to detach, and the process that led to the file (through ``/proc/PID/root``) is
    often gone by then — with its path, detaching would fail and the probes stay forever.
    """

    name: str  # the path as the process that mapped it sees it
    fd: int

    attached: list[str] = field(default_factory=list)
    tgids: set[int] = field(default_factory=set)

    @property
    def path(self) -> str:
        """The file for bcc, valid while we hold it open."""
        return f"/proc/self/fd/{self.fd}"


class NcclCapture:
    """nccl.bpf.c: loaded once, its probes attached to the libnccl files of traced processes.

    Args:
        settings: the ``[capture]`` section (map and ring buffer sizes).
        header_cache: where generated kernel headers are cached.
        proc_root: where /proc is.
    """

    def __init__(
        self,
        settings: CaptureSection,
        header_cache: Path | None = None,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self._settings = settings
        self._header_cache = header_cache
        self._proc_root = proc_root
        self._program: BpfProgram | None = None
        self._ring: RingBuffer[tuple[int, NcclCall]] | None = None
        self._names = function_names()
        self._libs: dict[tuple[int, int], _Library] = {}
        self._lib_of: dict[int, tuple[int, int]] = {}  # tgid -> its library
        self._pending: dict[int, str] = {}  # traced, no library yet: tgid -> why
        self._detacher: DaemonExecutor | None = None
        self._detaching: dict[tuple[int, int], Future[None]] = {}  # library -> its removal
        #: Functions missing from a library: path -> names.
        self.missing: dict[str, list[str]] = {}

    def load(self) -> None:
        """Compile and load the program (nothing is attached).

        Raises:
            BpfLoadError: compiling or loading failed; the message says what to do.
        """
        s = self._settings
        program = BpfProgram.load(
            SOURCE,
            defines={
                "NCCL_MAX_PROCS": s.max_processes,
                "NCCL_MAX_INFLIGHT": s.max_threads,
                "NCCL_RINGBUF_PAGES": s.ringbuf_pages,
            },
            header_cache=self._header_cache,
        )
        try:
            self._ring = program.open_ring_buffer(_RING, self._decode)
        except BaseException:
            program.close()
            raise
        self._program = program
        self._detacher = DaemonExecutor("nccl-detach")

    @property
    def loaded(self) -> bool:
        return self._program is not None

    def loaded_ids(self) -> frozenset[int]:
        """The kernel's ids of its functions loaded now (any thread; none once closed)."""
        return loaded_program_ids(self._program)

    def close(self) -> None:
        """Detach and unload (idempotent)."""
        self.wait_detached()
        if self._detacher is not None:
            self._detacher.shutdown(wait=True)
            self._detacher = None
        if self._program is not None:
            self._program.close()  # detaches what is still attached
            self._program = None
        self._ring = None
        for lib in self._libs.values():
            os.close(lib.fd)
        self._libs.clear()
        self._lib_of.clear()
        self._pending.clear()

    def add(self, tgid: int) -> str:
        """Start recording the NCCL calls of process ``tgid``.

        Returns:
            "" when its libnccl is probed; otherwise why not yet (it is looked for again by
            `rescan` while it stays traced).
        """
        program = self._require()
        table = program.table(_TGIDS)
        try:
            table[table.Key(tgid)] = table.Leaf()
        except Exception as e:
            return (
                f"more than {self._settings.max_processes} processes are traced at once ({e}); "
                "raise [capture] max_processes"
            )
        reason = self._probe_library(tgid)
        if reason:
            self._pending[tgid] = reason
        return reason

    def rescan(self) -> None:
        """Look again for libnccl in traced processes that had none mapped."""
        for tgid in list(self._pending):
            reason = self._probe_library(tgid)
            if reason:
                self._pending[tgid] = reason
            else:
                del self._pending[tgid]

    def remove(self, tgid: int) -> TrackStats:
        """Stop recording process ``tgid``; its counters (call `drain` first)."""
        program = self._require()
        stats = TrackStats()
        table = program.table(_TGIDS)
        key = table.Key(tgid)
        try:
            leaf = table[key]
            stats = TrackStats(events=int(leaf.calls), lost_kernel=int(leaf.lost))
            del table[key]
        except KeyError:
            pass
        note = self._pending.pop(tgid, "")
        if note:
            stats.note = note
        lib_key = self._lib_of.pop(tgid, None)
        if lib_key is not None:
            lib = self._libs[lib_key]
            lib.tgids.discard(tgid)
            if not lib.tgids:
                del self._libs[lib_key]
                assert self._detacher is not None  # loaded
                self._detaching[lib_key] = self._detacher.submit(self._detach, lib)
        return stats

    def wait_detached(self) -> None:
        """Wait until every library's probes being removed are gone."""
        for key in list(self._detaching):
            self._detaching.pop(key).result()

    def drain(self) -> dict[int, list[NcclCall]]:
        """Consume the ring buffer now; calls by tgid."""
        out: dict[int, list[NcclCall]] = defaultdict(list)
        if self._ring is None:
            return out
        for tgid, call in self._ring.drain():
            out[tgid].append(call)
        return out

    def fill(self) -> float:
        """The share of the ring buffer filled at the last `drain` (0-1)."""
        return self._ring.fill if self._ring is not None else 0.0

    def counters(self) -> dict[str, int]:
        """The host-wide ``enum nccl_counter`` values by name (e.g. ``NCCL_C_INFLIGHT_FULL``)."""
        sums = percpu_sums(self._require().table(_TOTALS))
        return {name: sums[slot] for name, slot in counter_slots().items()}

    def probed_libraries(self) -> dict[str, int]:
        """Probed library (its path in the first process that mapped it) -> traced processes
        using it."""
        return {lib.name: len(lib.tgids) for lib in self._libs.values()}

    def program_fds(self) -> dict[str, int]:
        """Loaded function -> fd (for BPF run statistics)."""
        return self._require().program_fds()

    # -- internals --------------------------------------------------------------------------

    def _require(self) -> BpfProgram:
        if self._program is None:
            raise RuntimeError("the NCCL capture program is not loaded")
        return self._program

    def _probe_library(self, tgid: int) -> str:
        try:
            mapped = find_libnccl(tgid, self._proc_root)
        except OSError as e:
            return f"cannot read /proc/{tgid}/maps ({e.strerror}); the process may have exited"
        if mapped is None:
            return (
                f"process {tgid} maps no libnccl (it uses no NCCL, or loads it later, or links "
                "it statically)"
            )
        try:
            fd = os.open(str(self._proc_root / str(tgid) / "root") + mapped, os.O_RDONLY)
        except OSError as e:
            return f"cannot open {mapped} of process {tgid} ({e.strerror})"
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        lib = self._libs.get(key)
        if lib is not None:
            os.close(fd)  # probed already
        else:
            removal = self._detaching.pop(key, None)
            if removal is not None:
                removal.result()
            lib = _Library(mapped, fd)
            reason = self._attach(lib)
            if reason:
                os.close(fd)
                return reason
            self._libs[key] = lib
        lib.tgids.add(tgid)
        self._lib_of[tgid] = key
        return ""

    def _attach(self, lib: _Library) -> str:
        program = self._require()
        missing = []
        for name, _, fn in NCCL_FUNCTIONS:
            try:
                program.attach_uprobe(lib.path, name, fn)
            except BpfLoadError:
                missing.append(name)  # an older NCCL without this function
                continue
            try:
                program.attach_uprobe(lib.path, name, fn + "_r", retprobe=True)
            except BpfLoadError as e:
                program.detach_uprobe(lib.path, name)
                log.warning("capture: no return probe on %s:%s: %s", lib.name, name, e)
                missing.append(name)
                continue
            lib.attached.append(name)
        if missing:
            self.missing[lib.name] = missing
        if not lib.attached:
            return f"{lib.name} exports none of the NCCL functions probed (is it libnccl?)"
        return ""

    def _detach(self, lib: _Library) -> None:
        """Remove ``lib``'s probes (on the detach thread; bcc's books are plain dicts)."""
        program = self._require()
        for name in lib.attached:
            for retprobe in (False, True):
                try:
                    program.detach_uprobe(lib.path, name, retprobe=retprobe)
                except Exception as e:  # the others still go
                    log.warning("capture: %s", e)
        lib.attached.clear()
        os.close(lib.fd)

    def _decode(self, e: Any) -> tuple[int, NcclCall]:
        fn = int(e.fn)
        return int(e.tgid), NcclCall(
            tid=int(e.tid),
            function=self._names.get(fn, f"nccl_fn_{fn}"),
            start_ns=int(e.start_ns),
            end_ns=int(e.end_ns),
            count=int(e.count),
            datatype=int(e.datatype),
            op=int(e.op),
            peer=int(e.peer),
            comm=int(e.comm),
            stream=int(e.stream),
            sendbuff=int(e.sendbuff),
            recvbuff=int(e.recvbuff),
            ret=int(e.ret),
        )
