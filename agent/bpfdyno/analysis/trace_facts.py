"""One pass over a trace file: the facts the summary and the diagnosis are computed from.

`read_facts` streams a (merged) Kineto trace with `bpfdyno.analysis.tracefile.scan_trace`,
parsing only the events either needs, and keeps each as a compact interval:

* from Kineto: the profiler's span (the window); the CPU ops of every thread (only their
  times, in arrays); steps (``ProfilerStep#N``, else the ends of ``Optimizer.step``); the
  collectives — NCCL kernels on the GPU (``ncclDevKernel_*``, older ``ncclKernel_*``), gloo's
  and NCCL's execution annotations (``gloo:all_reduce``...), the calls that enqueue them
  (``c10d::allreduce_``); the DataLoader's
  ``enumerate(DataLoader)`` spans; the GPU's other kernels (its busy time);
* from bpfdyno's kernel tracks (categories ``bpfdyno.*``, see
  `bpfdyno.tracing.capture.tracks`): off-CPU slices with their cause and who held the CPU,
  network bursts and rare events with their endpoints, NCCL calls, GPU counter samples, and
  the fabric track's counters (what each group advanced per interval), and the tracks' info
  slice.

Times are kept in microseconds on the file's own time base (``ts``, relative to
``baseTimeNanoseconds``), as floats, exactly as in the file.

Memory is bounded: every list is capped (`MAX_INTERVALS` per kind, counted when it is
reached), CPU ops are kept as pairs of doubles per thread.
"""

from __future__ import annotations

import operator
import re
from array import array
from collections import defaultdict
from dataclasses import dataclass, field
from itertools import repeat
from typing import IO, Any

from bpfdyno.analysis.tracefile import (
    DEFAULT_LIMITS,
    Categories,
    ReadLimits,
    json_stream,
    scan_trace,
)
from bpfdyno.rpc.kernel_tracks import (
    CAT_FABRIC,
    CAT_GPU,
    CAT_INFO,
    CAT_NCCL,
    CAT_NCCL_PROFILER,
    CAT_NET,
    CAT_SCHED,
    SCHED_RECLAIM,
)

#: Most intervals of one kind kept from one file (a 500 MB trace has ~2 M events).
MAX_INTERVALS = 2_000_000

#: Between a CPU op's pid and its tid, as Kineto writes them.
_TID = b', "tid": '
#: A JSON number, exactly as the grammar has it (so that ``float`` reads every match).
_NUMBER = rb"(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
#: A CPU op as Kineto writes it, from its category to its times: name (without escapes),
#: thread (``652, "tid": 698``: pid and tid in one group, as a chunk's ops are mostly one
#: thread's and each bytes object per op costs), ts, dur. It matches at every ``"cpu_op"`` of
#: the file, its groups empty where that is not such an op (see `Categories`). Kineto's exact
#: spacing: the literal start is what makes the search fast (another writer's layout reads
#: the ops one by one).
KINETO_CPU_OP = re.compile(
    b"".join(
        (
            rb'"cpu_op"(?:(?<="ph": "X", "cat": "cpu_op"), "name": "([^"\\]*)", ',
            rb'"pid": (-?[0-9]+' + _TID + rb'-?[0-9]+),\s*"ts": ' + _NUMBER,
            rb', "dur": ' + _NUMBER + rb"(?=[,}\s]))?",
        )
    )
)

#: A GPU kernel as Kineto writes it, like `KINETO_CPU_OP`: name, ts, dur and the device in
#: its args (flat up to it, and no other ``device`` after it).
KINETO_KERNEL = re.compile(
    b"".join(
        (
            rb'"kernel"(?:(?<="ph": "X", "cat": "kernel"), "name": "([^"\\]*)", ',
            rb'"pid": -?[0-9]+, "tid": -?[0-9]+,\s*"ts": ' + _NUMBER + rb', "dur": ' + _NUMBER,
            rb',\s*"args": \{[^{}]*?"device": (-?[0-9]+)(?=[,}\s])(?![^{}]*"device": ))?',
        )
    )
)
#: NCCL's kernels among them: parsed whole too (their sizes and group are in their args).
_NCCL_NAMES = (b"nccl", b"void nccl")
KINETO_NCCL_KERNEL = re.compile(rb'"cat": "kernel", "name": "(?:void )?nccl')

#: The event categories read: Kineto's CPU ops (their times only, see `KINETO_CPU_OP`) and
#: annotations, GPU kernels (times and device, NCCL's whole), the profiler's span, and every
#: bpfdyno track.
CATEGORIES = Categories(
    {"cpu_op", "user_annotation", "gpu_user_annotation", "kernel", "Trace"},
    ("bpfdyno.",),
    light={"cpu_op": KINETO_CPU_OP, "kernel": KINETO_KERNEL},
    whole={"kernel": (KINETO_NCCL_KERNEL, b"nccl")},
)

_NCCL_KERNEL = re.compile(r"^(?:void )?nccl(?:Dev)?Kernel_([A-Za-z]+)")
_EXEC = re.compile(r"^(gloo|nccl|mpi|ucc):([a-z_]+)$")
_ENQUEUE = re.compile(r"^c10d::([a-z_]+?)_?$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_NUM = (int, float)
#: The prefix of a TCP connection's counter on the net track.
TCP_COUNTER = "kernel net tcp: "
#: CPU ops that are more than their time: collectives' enqueues, steps.
_NAMED_OPS = ("c10d::", "ProfilerStep#")
_NAMED_OPS_B = tuple(n.encode() for n in _NAMED_OPS)
_FIRST, _SECOND, _THIRD, _FOURTH = (operator.itemgetter(i) for i in range(4))


#: Bytes per element of the dtypes PyTorch names on NCCL kernels (c10's scalar types).
DTYPE_BYTES = {
    "Double": 8, "Long": 8, "ComplexFloat": 8, "Float": 4, "Int": 4, "ComplexHalf": 4,
    "Half": 2, "BFloat16": 2, "Short": 2, "Byte": 1, "Char": 1, "Bool": 1,
    "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Float8_e4m3fnuz": 1, "Float8_e5m2fnuz": 1,
}  # fmt: skip


def _payload_bytes(args: dict[str, Any]) -> int:
    """A collective kernel's payload from the sizes PyTorch puts in its args (the larger of
    its input and output), 0 when they are not there."""
    nelems = [args.get("In msg nelems"), args.get("Out msg nelems")]
    counts = [n for n in nelems if isinstance(n, int) and n > 0]
    size = DTYPE_BYTES.get(str(args.get("dtype", "")), 0)
    return max(counts) * size if counts and size else 0


@dataclass(slots=True)
class Collective:
    """One collective of the process as the file shows it.

    Attributes:
        op: what it does, in c10d's words (``allreduce``, ``broadcast``, ``send``...).
        source: where it was seen: ``gpu`` (an NCCL kernel), ``gloo``/``nccl`` (the backend's
            execution span on the CPU), ``enqueue`` (the c10d call only), ``nccl_call``
            (bpfdyno's NCCL probe).
        group: which ordered stream of collectives it belongs to (a process group's name, a
            CUDA stream, an NCCL communicator).
        start_us, end_us: when this process joined it and when it completed here.
        tid: the thread that ran it (0: the GPU).
        size_bytes: payload, when known (0 otherwise).
    """

    op: str
    source: str
    group: str
    start_us: float
    end_us: float
    tid: int = 0
    size_bytes: int = 0


@dataclass(slots=True)
class OffCpuSlice:
    """An off-CPU slice of a traced thread (bpfdyno's sched track)."""

    tid: int
    start_us: float
    end_us: float
    cause: str  # "runnable" or a blocked cause (`bpfdyno.tracing.capture.causes`)
    syscall: str
    held_by: str  # runnable slices: "comm (pid N)" of the task that held the CPU, else ""
    child_pid: int = 0  # a thread of a child process of the traced one (a DataLoader worker)
    woken_by_pid: int = 0  # blocked slices: the process that woke it (0: not seen)
    #: A ``runnable: woken`` slice: the blocked cause it followed (its wait for a CPU after
    #: that wakeup); "" for a preempted thread or a file without it.
    after: str = ""
    #: The thread's system (kernel) CPU time since its previous slice (its time on a CPU
    #: just before this one, tick-sampled where the kernel accounts by the tick); -1 when
    #: the file does not say.
    system_before_us: int = -1
    #: ... and its user CPU time; -1 when the file does not say.
    user_before_us: int = -1


@dataclass(slots=True)
class NetInstant:
    """A rare network event of the process: retransmit, reset, drop, state change."""

    ts_us: float
    kind: str
    local: str
    peer: str
    reason: str = ""  # a drop's reason (the kernel's SKB_DROP_REASON_*, without the prefix)


@dataclass(slots=True)
class TraceFacts:
    """What `read_facts` keeps of one file. Times in µs on the file's base (see module)."""

    path: str
    base_ns: int = 0
    rank: int = -1
    world_size: int = 0
    trace_id: str = ""
    host: str = ""
    window: tuple[float, float] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    info_pid: int = 0
    #: Per (pid, tid): CPU ops as start, end, start, end...
    ops: dict[tuple[Any, Any], array[float]] = field(default_factory=dict)
    op_count_by_pid: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    profiler_steps: list[tuple[int, float, float]] = field(default_factory=list)
    optimizer_steps: list[tuple[float, float]] = field(default_factory=list)
    dataloader: list[tuple[int, float, float]] = field(default_factory=list)
    collectives: list[Collective] = field(default_factory=list)
    enqueues: list[Collective] = field(default_factory=list)
    #: Per GPU device: non-NCCL kernels as start, end, start, end...
    gpu_busy: dict[int, array[float]] = field(default_factory=dict)
    offcpu: list[OffCpuSlice] = field(default_factory=list)
    #: The sched track's memory reclaims: (tid, start_us, end_us), on a CPU but for the
    #: off-CPU slices inside them.
    reclaims: list[tuple[int, float, float]] = field(default_factory=list)
    #: bpfdyno net bursts: (start_us, end_us, "send"/"recv", bytes, calls, local, peer).
    net_bursts: list[tuple[float, float, str, int, int, str, str]] = field(default_factory=list)
    net_events: list[NetInstant] = field(default_factory=list)
    #: The TCP connections' samples (counters ``kernel net tcp: ...``): (ts_us, local, peer,
    #: smoothed round-trip time in ms).
    tcp_rtt: list[tuple[float, str, str, float]] = field(default_factory=list)
    nccl_calls: list[Collective] = field(default_factory=list)
    #: NCCL's profiler plugin's collectives (the nccl track's ``NCCL collectives`` row): (the
    #: operation in c10d's words, NCCL's seqNumber, CPU arrival, completion), in file order.
    nccl_profiled: list[tuple[str, int, float, float]] = field(default_factory=list)
    #: GPU counters: name -> [(ts_us, value)].
    gpu_counters: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    #: The fabric track's points: (ts_us, device, group, the sum of what its counters
    #: advanced over the interval that starts there); device ``cpu`` for interrupt time.
    fabric: list[tuple[float, str, str, int]] = field(default_factory=list)
    dropped: int = 0  # intervals beyond MAX_INTERVALS (not kept)

    @property
    def main_pid(self) -> int:
        """The traced process: the kernel tracks' pid, else the pid with the most CPU ops."""
        if self.info_pid:
            return self.info_pid
        return max(self.op_count_by_pid, key=self.op_count_by_pid.__getitem__, default=0)

    @property
    def main_tid(self) -> int:
        """The main thread's id as the sched track names it: the host's pid of the process
        when the file names it by its container's (the info slice's ``host_pid``)."""
        host = self.info.get("host_pid")
        return host if isinstance(host, int) and host > 0 else self.main_pid

    def abs_ns(self, ts_us: float) -> int:
        """A time of the file as wall-clock ns of the host that wrote it."""
        return self.base_ns + round(ts_us * 1000)


def read_facts(f: IO[bytes], path: str, limits: ReadLimits = DEFAULT_LIMITS) -> TraceFacts:
    """Read the facts of the opened trace file ``f`` (plain or gzip; see the module doc).

    Raises:
        TraceFileError: not a complete trace, malformed, or over a limit.
    """
    facts = TraceFacts(path)
    reader = _Reader(facts)
    for kind, item in scan_trace(json_stream(f), path, CATEGORIES, limits):
        if kind == "light":
            if item[0] == "cpu_op":
                reader.ops(item[1])
            else:
                reader.kernels(item[1])
        elif kind == "event":
            reader.event(item)
        else:
            reader.member(*item)
    return facts


class _Reader:
    """Sorts each event into its fact (one method per category)."""

    def __init__(self, facts: TraceFacts) -> None:
        self.f = facts
        self.by_cat = {
            "cpu_op": self.cpu_op,
            "user_annotation": self.annotation,
            "gpu_user_annotation": self.ignore,
            "kernel": self.kernel,
            "Trace": self.trace,
            CAT_SCHED: self.sched,
            CAT_NET: self.net,
            CAT_NCCL: self.nccl,
            CAT_NCCL_PROFILER: self.nccl_profiler,
            CAT_GPU: self.gpu,
            CAT_FABRIC: self.fabric,
            CAT_INFO: self.info,
        }

    def member(self, key: str, value: Any) -> None:
        f = self.f
        if key == "baseTimeNanoseconds" and isinstance(value, int):
            f.base_ns = value
        elif key == "trace_id":
            f.trace_id = str(value)
        elif key == "host_name" and isinstance(value, str):
            f.host = value
        elif key == "distributedInfo" and isinstance(value, dict):
            rank, size = value.get("rank"), value.get("world_size")
            f.rank = rank if isinstance(rank, int) else -1
            f.world_size = size if isinstance(size, int) else 0

    def event(self, e: dict[str, Any]) -> None:
        ts = e.get("ts")
        if ts.__class__ not in _NUM:
            return
        handler = self.by_cat.get(e["cat"])
        if handler is not None:
            handler(e, ts)

    def _room(self, items: list[Any]) -> bool:
        if len(items) < MAX_INTERVALS:
            return True
        self.f.dropped += 1
        return False

    def _pair(self, table: dict[Any, array[float]], key: Any, start: float, end: float) -> None:
        """Add (start, end) to ``table[key]``'s pairs of doubles, within `MAX_INTERVALS`."""
        times = table.get(key)
        if times is None:
            times = table[key] = array("d")
        if len(times) < 2 * MAX_INTERVALS:
            times.append(start)
            times.append(end)
        else:
            self.f.dropped += 1

    @staticmethod
    def _dur(e: dict[str, Any]) -> float:
        dur = e.get("dur", 0)
        return dur if dur.__class__ in _NUM and dur > 0 else 0.0

    def ignore(self, e: dict[str, Any], ts: float) -> None:
        pass

    def trace(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("PyTorch Profiler"):
            self.f.window = (ts, ts + self._dur(e))

    def cpu_op(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") == "X":
            self.op(str(e.get("name", "")), e.get("pid"), e.get("tid"), ts, self._dur(e))

    def ops(self, fields: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
        """CPU ops read lightly (`KINETO_CPU_OP`'s groups), a chunk's at a time: their times
        go into the threads' arrays without a Python step per op where the chunk holds one
        thread's ops (the common case)."""
        if not fields:
            return
        names = b"\0" + b"\0".join(map(_FIRST, fields))
        if any(b"\0" + prefix in names for prefix in _NAMED_OPS_B):
            for n, thread, ts, dur in fields:
                if n.startswith(_NAMED_OPS_B):
                    tid, length = int(thread.partition(_TID)[2]), float(dur)
                    length = length if length > 0 else 0.0  # as `_dur` reads it
                    self._named(n.decode("utf-8", "replace"), float(ts), length, tid)
        begin = array("d", map(float, map(_THIRD, fields)))
        durs = array("d", map(float, map(_FOURTH, fields)))
        if min(durs) < 0:
            durs = array("d", map(max, durs, repeat(0.0)))
        end = array("d", map(operator.add, begin, durs))
        threads = set(map(_SECOND, fields))
        for thread in threads:
            if len(threads) == 1:
                b, e2 = begin, end
            else:
                chosen = [i for i, f in enumerate(fields) if f[1] == thread]
                b, e2 = array("d", (begin[i] for i in chosen)), array("d", (end[i] for i in chosen))
            pid_text, _, tid_text = thread.partition(_TID)
            pid, tid = int(pid_text), int(tid_text)
            self.f.op_count_by_pid[pid] += self._pairs(self.f.ops, (pid, tid), b, e2)

    def _pairs(
        self, table: dict[Any, array[float]], key: Any, begin: array[float], end: array[float]
    ) -> int:
        """`_pair` for many: adds what `MAX_INTERVALS` leaves room for; how many it added."""
        times = table.get(key)
        if times is None:
            times = table[key] = array("d")
        room = max(0, MAX_INTERVALS - len(times) // 2)
        if len(begin) > room:
            self.f.dropped += len(begin) - room
            begin, end = begin[:room], end[:room]
        # Interleaved: start, end, start, end... written in place, two strided copies.
        at = len(times)
        times.extend(begin)
        times.extend(end)
        times[at::2] = begin
        times[at + 1 :: 2] = end
        return len(begin)

    def kernels(self, fields: list[tuple[bytes, bytes, bytes, bytes]]) -> None:
        """GPU kernels read lightly (`KINETO_KERNEL`'s groups), a chunk's at a time: what
        `kernel` does with those that are not NCCL's (they come parsed)."""
        names = b"\0" + b"\0".join(map(_FIRST, fields))
        if any(b"\0" + prefix in names for prefix in _NCCL_NAMES):
            fields = [f for f in fields if not f[0].startswith(_NCCL_NAMES)]
        if not fields:
            return
        devices = set(map(_FOURTH, fields))
        for device in devices:
            chosen = fields if len(devices) == 1 else [f for f in fields if f[3] == device]
            begin = array("d", map(float, map(_SECOND, chosen)))
            durs = array("d", map(float, map(_THIRD, chosen)))
            if min(durs) <= 0:
                durs = array("d", (d if d > 0 else 0.0 for d in durs))  # as `_dur` reads them
            end = array("d", map(operator.add, begin, durs))
            self._pairs(self.f.gpu_busy, int(device), begin, end)

    def op(self, name: str, pid: Any, tid: Any, ts: float, dur: float) -> None:
        """A CPU op."""
        f = self.f
        self._pair(f.ops, (pid, tid), ts, ts + max(dur, 0.0))
        if isinstance(pid, int):
            f.op_count_by_pid[pid] += 1
        if name.startswith(_NAMED_OPS):
            self._named(name, ts, dur, tid)

    def annotation(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") != "X":
            return
        name = str(e.get("name", ""))
        dur, tid = self._dur(e), e.get("tid")
        m = _EXEC.match(name)
        if m is not None:
            if self._room(self.f.collectives):
                self.f.collectives.append(
                    Collective(
                        m.group(2).replace("_", ""),
                        m.group(1),
                        "",
                        ts,
                        ts + dur,
                        tid if isinstance(tid, int) else 0,
                    )
                )
        elif name.startswith("Optimizer.step#"):
            if self._room(self.f.optimizer_steps):
                self.f.optimizer_steps.append((ts, ts + dur))
        elif name.startswith("enumerate(DataLoader)"):
            if self._room(self.f.dataloader):
                self.f.dataloader.append((tid if isinstance(tid, int) else 0, ts, ts + dur))
        else:
            self._named(name, ts, dur, tid)

    def _named(self, name: str, ts: float, dur: float, tid: Any) -> None:
        f = self.f
        tid = tid if isinstance(tid, int) else 0
        if (m := _STEP.match(name)) is not None:
            if self._room(f.profiler_steps):
                f.profiler_steps.append((int(m.group(1)), ts, ts + dur))
        elif (m := _ENQUEUE.match(name)) is not None and self._room(f.enqueues):
            op = m.group(1).replace("_", "")
            f.enqueues.append(Collective(op, "enqueue", "", ts, ts + dur, tid))

    def kernel(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") != "X":
            return
        f = self.f
        args = e.get("args") or {}
        device = args.get("device", e.get("pid", 0))
        device = device if isinstance(device, int) else 0
        dur = self._dur(e)
        m = _NCCL_KERNEL.match(str(e.get("name", "")))
        if m is not None:
            if self._room(f.collectives):
                # PyTorch names the collective's process group and its sizes on the kernel
                # (multi-rank traces): the group is what every rank calls it, its stream
                # is only this rank's.
                pg = args.get("Process Group Name")
                stream = args.get("stream", e.get("tid", 0))
                group = f"process group {pg}" if pg is not None else f"GPU {device} stream {stream}"
                f.collectives.append(
                    Collective(
                        m.group(1).lower(), "gpu", group, ts, ts + dur, 0, _payload_bytes(args)
                    )
                )
            return
        self._pair(f.gpu_busy, device, ts, ts + dur)

    def sched(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") != "X" or not self._room(self.f.offcpu):
            return
        args = e.get("args") or {}
        tid = args.get("tid")
        if not isinstance(tid, int):
            return
        held = ""
        if args.get("held_by_pid") is not None:
            held = f"{args.get('held_by_comm', '?')} (pid {args['held_by_pid']})"
        cause = args.get("cause")
        if cause == SCHED_RECLAIM:
            if self._room(self.f.reclaims):
                self.f.reclaims.append((tid, ts, ts + self._dur(e)))
            return
        if not isinstance(cause, str):  # from the slice's name: "blocked: lock (futex)"
            name = str(e.get("name", ""))
            cause = "runnable" if name.startswith("runnable") else name.split(": ")[-1]
            cause = cause.split(" (")[0] or "blocked"
        after = args.get("after")
        after = after if isinstance(after, str) else ""
        if args.get("state") == "D":
            # Uninterruptible sleep is a disk or a page whatever the system call (files
            # written before the capture decided by state first say "io wait" for a read).
            # A woken slice carries the state of the sleep it followed (a preempted one: R).
            if cause != "runnable":
                cause = "disk/uninterruptible"
            else:
                after = "disk/uninterruptible"
        child, waker = args.get("child_pid", 0), args.get("woken_by_pid", 0)
        system, user = args.get("system_us", -1), args.get("user_us", -1)
        self.f.offcpu.append(
            OffCpuSlice(
                tid,
                ts,
                ts + self._dur(e),
                cause,
                str(args.get("syscall") or ""),
                held,
                child if isinstance(child, int) else 0,
                waker if isinstance(waker, int) else 0,
                after,
                system if isinstance(system, int) and system >= 0 else -1,
                user if isinstance(user, int) and user >= 0 else -1,
            )
        )

    def net(self, e: dict[str, Any], ts: float) -> None:
        f = self.f
        ph, args = e.get("ph"), e.get("args") or {}
        name = str(e.get("name", ""))
        local, peer = str(args.get("local", "")), str(args.get("peer", ""))
        if ph == "X":
            if self._room(f.net_bursts):
                nbytes, calls = args.get("bytes", 0), args.get("calls", 0)
                f.net_bursts.append(
                    (
                        ts,
                        ts + self._dur(e),
                        name,
                        int(nbytes) if nbytes.__class__ in _NUM else 0,
                        int(calls) if calls.__class__ in _NUM else 0,
                        local,
                        peer,
                    )
                )
        elif ph == "i" and self._room(f.net_events):
            reason = args.get("reason")
            f.net_events.append(
                NetInstant(ts, name, local, peer, reason if isinstance(reason, str) else "")
            )
        elif ph == "C" and name.startswith(TCP_COUNTER) and self._room(f.tcp_rtt):
            # "kernel net tcp: TCP 10.0.0.1:43210 -> 10.0.0.2:29500"
            ends = name.removeprefix(TCP_COUNTER).split(" ", 1)[-1].split(" -> ")
            srtt = args.get("srtt_ms")
            if len(ends) == 2 and srtt.__class__ in _NUM:
                f.tcp_rtt.append((ts, ends[0], ends[1], float(srtt)))

    def nccl(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") != "X" or e.get("name") == "ncclGroup" or not self._room(self.f.nccl_calls):
            return
        args = e.get("args") or {}
        name = str(e.get("name", ""))
        nbytes = args.get("bytes", 0)
        tid = args.get("tid", 0)
        self.f.nccl_calls.append(
            Collective(
                name.removeprefix("nccl").lower(),
                "nccl_call",
                f"comm {args.get('comm', '?')}",
                ts,
                ts + self._dur(e),
                tid if isinstance(tid, int) else 0,
                int(nbytes) if nbytes.__class__ in _NUM else 0,
            )
        )

    def nccl_profiler(self, e: dict[str, Any], ts: float) -> None:
        """A collective of NCCL's profiler plugin (its kernel channels and proxy steps, on
        rows of their own, have no ``enqueue_ns``)."""
        args = e.get("args") or {}
        seq = args.get("seq")
        if e.get("ph") != "X" or "enqueue_ns" not in args or not isinstance(seq, int):
            return
        if self._room(self.f.nccl_profiled):
            op = str(e.get("name", "")).lower()  # AllReduce -> allreduce, as c10d says it
            self.f.nccl_profiled.append((op, seq, ts, ts + self._dur(e)))

    def gpu(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") != "C":
            return
        value = (e.get("args") or {}).get("value")
        if value.__class__ in _NUM:
            series = self.f.gpu_counters.setdefault(str(e.get("name", "")), [])
            if self._room(series):
                series.append((ts, float(value)))

    def fabric(self, e: dict[str, Any], ts: float) -> None:
        """``fabric rdma mlx5_0:1 congestion``, ``fabric cpu interrupt time (ns)``: what the
        group's counters advanced from this point to the next."""
        if e.get("ph") != "C" or not self._room(self.f.fabric):
            return
        name = str(e.get("name", "")).removeprefix("fabric ").removesuffix(" (ns)")
        if name == "cpu interrupt time":
            device, group = "cpu", "interrupt time"
        else:
            kind, _, rest = name.partition(" ")
            dev, _, group = rest.partition(" ")
            device = f"{kind} {dev}"
        values = (e.get("args") or {}).values()
        total = sum(int(v) for v in values if v.__class__ in _NUM)
        self.f.fabric.append((ts, device, group, total))

    def info(self, e: dict[str, Any], ts: float) -> None:
        if e.get("ph") == "X" and isinstance(e.get("args"), dict):
            self.f.info = e["args"]
            pid = e.get("pid")
            self.f.info_pid = pid if isinstance(pid, int) else 0
