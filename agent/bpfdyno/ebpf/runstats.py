"""What BPF programs cost: kernel run-time statistics in short windows.

The kernel counts runs and run time per program only while BPF stats are enabled, which
costs ~20 ns per run, so they are enabled through a ``BPF_ENABLE_STATS`` fd (never the
global sysctl) for ``on_s`` seconds every ``period_s`` seconds.

`ProcessRunStats` (the process-wide `METER`) does that once for every BPF program this
process loaded through `bpfdyno.ebpf.program.BpfProgram` — whatever program file, whoever
loaded it — on one thread: the collectors report their functions' ns per event from its
windows, and the overhead budget counts every function's run time from them. `BpfRunStats`
measures a fixed set of program fds on its own (tests, benchmarks).

The statistics' own cost is inside each run's measured time (the kernel reads its clock
around the call). The meter measures it once (`calibrate_stats_overhead`: an empty program's
run time) so the budget can count what the functions themselves cost, not what measuring
them adds ~20 ns to while the windows are on. What the statistics never see — the kernel's
entry into a program at its tracepoint, paid by whoever hits it (~50-120 ns a run on a
2-CPU VM, several times a small body's run time) — is measured once too
(`calibrate_entry_cost`) and handed to each window's readers, so the budget can count it.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import statistics
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.ebpf.btfprog import bpf
from bpfdyno.ebpf.duty import DUTY
from bpfdyno.ebpf.fdops import load_program, open_raw_tracepoint
from bpfdyno.ebpf.introspect import fdinfo
from bpfdyno.ebpf.metrics import BPF_RUN_NS_PER_EVENT, BPF_RUNS_PER_SECOND

log = logging.getLogger(__name__)

#: A window starts this long before the next on phase of functions sampled in time, so that
#: it holds all of it (`ProcessRunStats`; the meter's thread may wake a little late).
ON_PHASE_LEAD_S = 0.05

#: While something happens (a requester's calm check says not calm), the kernel's entry into a
#: program is measured again at most this often; the entry used is the median of the last
#: `ENTRY_KEPT` measurements. One measurement swings 2x with what else runs on the CPU (94-251
#: ns here under background work): taken once at start it could stay low, and a storm of
#: cheap runs be undercounted for good.
ENTRY_REMEASURE_S = 60.0
ENTRY_KEPT = 5
#: A measurement again is shorter than the first (3 rounds of 1,000 calls, ~10 ms of CPU
#: against ~80 ms): the median of the kept ones smooths its swing, and while something
#: happens every minute's measurement counts against the agent's budget.
ENTRY_REMEASURE_PAIRS, ENTRY_REMEASURE_CALLS = 3, 1000

#: Default duty cycle: measure for this long...
DEFAULT_ON_S = 1.0
#: ...once per this period (so stats cost ~20 ns per run 10 % of the time). The overhead
#: budget asks for shorter, more frequent windows (``[budget] stats_window_s``).
DEFAULT_PERIOD_S = 10.0

_BPF_ENABLE_STATS = 32  # enum bpf_cmd
_BPF_STATS_RUN_TIME = 0  # enum bpf_stats_type
_BPF_OBJ_GET_INFO_BY_FD = 15
_BPF_PROG_TYPE_RAW_TRACEPOINT = 17


def enable_bpf_stats() -> int:
    """Turn on kernel BPF run-time stats; they stay on until the returned fd is closed.

    Raises:
        OSError: the kernel refused (EINVAL before 5.8, EPERM without CAP_SYS_ADMIN).
    """
    attr = (ctypes.c_uint8 * 128)()  # union bpf_attr, zeroed; enable_stats.type is at 0
    ctypes.c_uint32.from_buffer(attr, 0).value = _BPF_STATS_RUN_TIME
    return bpf(_BPF_ENABLE_STATS, attr)


#: struct bpf_prog_info up to run_cnt: id at 4, run_time_ns at 192, run_cnt at 200.
_PROG_INFO_LEN = 208


def prog_counters(fd: int) -> tuple[int, int, int] | None:
    """(program id, run_cnt, run_time_ns) of the program behind ``fd``; None if it is gone.

    One ``BPF_OBJ_GET_INFO_BY_FD`` call: what ``/proc/self/fdinfo`` says, without opening
    and parsing a file per program in every window.
    """
    info = (ctypes.c_uint8 * _PROG_INFO_LEN)()
    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = fd
    ctypes.c_uint32.from_buffer(attr, 4).value = _PROG_INFO_LEN
    ctypes.c_uint64.from_buffer(attr, 8).value = ctypes.addressof(info)
    try:
        bpf(_BPF_OBJ_GET_INFO_BY_FD, attr)
    except OSError:
        return None
    words = ctypes.c_uint64 * 1
    return (
        ctypes.c_uint32.from_buffer(info, 4).value,
        words.from_buffer(info, 200)[0],
        words.from_buffer(info, 192)[0],
    )


def refused(e: OSError) -> str:
    """Why there are no run statistics, and what they need."""
    return f"BPF run statistics refused ({e.strerror}); they need Linux >= 5.8 and CAP_SYS_ADMIN"


_PR_SET_NAME, _PR_GET_NAME = 15, 16


#: ``r0 = 0; exit``: a program that does nothing (its run time: the statistics' own; its
#: runs: the kernel's entry into a program).
EMPTY_PROGRAM = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])


def _empty_raw_tracepoint_program() -> int:
    """Load `EMPTY_PROGRAM` as a raw tracepoint program; returns its fd.

    Raises:
        OSError: the kernel refused it.
    """
    prog, error = load_program(
        EMPTY_PROGRAM, _BPF_PROG_TYPE_RAW_TRACEPOINT, "bpfdyno_calib", b"GPL"
    )
    if prog < 0:
        raise OSError(errno.EPERM, f"an empty BPF program was refused: {error}")
    return prog


def calibrate_stats_overhead(syscalls: int = 20_000) -> float:
    """What the run statistics add to each run's measured time, in ns (an empty program's).

    Loads a two-instruction raw tracepoint program (``r0 = 0; exit``) on ``sys_enter``,
    makes ``syscalls`` system calls with statistics on, and divides its run time by its runs
    (other processes' system calls count too). Everything is closed before returning.

    Raises:
        OSError: the kernel refused the program, the attach or the statistics.
    """
    prog = _empty_raw_tracepoint_program()
    link = stats = -1
    try:
        link = open_raw_tracepoint("sys_enter", prog)
        stats = enable_bpf_stats()
        before = fdinfo(prog)
        for _ in range(syscalls):
            os.getppid()
        after = fdinfo(prog)
    finally:
        for fd in (stats, link, prog):
            if fd >= 0:
                os.close(fd)
    runs = int(after.get("run_cnt", 0)) - int(before.get("run_cnt", 0))
    ns = int(after.get("run_time_ns", 0)) - int(before.get("run_time_ns", 0))
    return ns / runs if runs > 0 else 0.0


def calibrate_entry_cost(pairs: int = 7, calls: int = 3000) -> float:
    """What the kernel spends entering a BPF program at a tracepoint, in ns a run.

    The run statistics time only a program's body; every run also costs its caller the
    tracepoint's call into BPF (the run wrapper, an indirect call). That cost is paid by
    whoever hits the tracepoint — inside a workload's context switches and system calls —
    and counts against the agent's budget like the body does. Measured by timing
    ``prctl(PR_SET_NAME)`` (which fires ``task_rename``, a tracepoint hardly anything else
    hits) on this thread's CPU clock, in ``pairs`` rounds of ``calls`` calls without and
    with an empty program attached there; the median of the rounds' differences. The body
    of the empty program is included (a few ns). About 0.05-0.1 s of CPU, at start and at most
    once a minute while something happens (`ProcessRunStats`).

    Raises:
        OSError: the kernel refused the program or the attach.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    name = ctypes.create_string_buffer(16)
    libc.prctl(_PR_GET_NAME, name, 0, 0, 0)  # set to what it is: the thread keeps its name

    def per_call() -> float:
        t0 = time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID)
        for _ in range(calls):
            libc.prctl(_PR_SET_NAME, name, 0, 0, 0)
        return (time.clock_gettime_ns(time.CLOCK_THREAD_CPUTIME_ID) - t0) / calls

    prog = _empty_raw_tracepoint_program()
    try:
        differences = []
        for _ in range(pairs):
            without = per_call()
            link = open_raw_tracepoint("task_rename", prog)
            try:
                with_program = per_call()
            finally:
                os.close(link)
            differences.append(with_program - without)
    finally:
        os.close(prog)
    return max(statistics.median(differences), 0.0)


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
    """Duty-cycled BPF run-time statistics for a set of loaded programs.

    Stats are switched on for ``on_s`` seconds every ``period_s`` seconds by a small thread;
    `last_window` returns the per-program cost measured in the latest completed window.
    `stop` closes the stats fd, which restores the kernel's previous state.

    Args:
        program_fds: program name -> fd of each program to measure
            (``BpfProgram.program_fds()``).
        on_s: length of a measuring window.
        period_s: one window starts every this many seconds.

    Raises:
        ValueError: not 0 < on_s <= period_s.
    """

    def __init__(
        self,
        program_fds: Mapping[str, int],
        on_s: float = DEFAULT_ON_S,
        period_s: float = DEFAULT_PERIOD_S,
    ) -> None:
        if not 0 < on_s <= period_s:
            raise ValueError(f"need 0 < on_s <= period_s, got on_s={on_s} period_s={period_s}")
        self._fds = dict(program_fds)
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
            self.unavailable_reason = refused(e)
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
            info = fdinfo(fd)
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


# --- the process-wide meter ------------------------------------------------------------------


class MeasuredProgram(Protocol):
    """What the meter reads of a loaded program (`bpfdyno.ebpf.program.BpfProgram`)."""

    @property
    def closed(self) -> bool: ...

    def program_fds(self) -> dict[str, int]: ...

    def program_ids(self) -> dict[str, int]: ...

    def attached_ns(self, fn: str) -> int | None: ...


@dataclass(frozen=True, slots=True)
class FunctionCost:
    """One loaded BPF function over one window of the process-wide meter.

    Attributes:
        name: the function (and kernel program) name.
        prog_id: the kernel's id of the program.
        runs: invocations in the window.
        run_time_ns: their total run time (the statistics' own ~20 ns per run included).
        window_s: the window's length.
        attached_s: how long in the window it was attached (less than the window while the
            budget samples it in time or keeps it detached).
        overhead_ns: what the statistics add to each run (`calibrate_stats_overhead`).
    """

    name: str
    prog_id: int
    runs: int
    run_time_ns: int
    window_s: float
    attached_s: float
    overhead_ns: float = 0.0

    @property
    def own_time_ns(self) -> float:
        """The run time without what the statistics added to it."""
        return max(self.run_time_ns - self.runs * self.overhead_ns, 0.0)

    @property
    def ns_per_s(self) -> float:
        """Its own run time per second of the window: what it cost, as it was attached."""
        return self.own_time_ns / self.window_s if self.window_s > 0 else 0.0

    @property
    def runs_per_s(self) -> float:
        """Invocations per second of the window."""
        return self.runs / self.window_s if self.window_s > 0 else 0.0

    @property
    def full_ns_per_s(self) -> float | None:
        """What it would cost attached all the time; None when it was never attached."""
        if self.attached_s <= 0:
            return None
        return self.own_time_ns / self.attached_s

    def as_run_stats(self) -> ProgramRunStats:
        """The same window as a `ProgramRunStats` (runs per second of the attached time:
        the event rate, also for a function sampled in time)."""
        return ProgramRunStats(self.name, self.runs, self.run_time_ns, self.attached_s)


@dataclass(frozen=True, slots=True)
class MeterWindow:
    """One completed window of `ProcessRunStats`: every loaded function's cost."""

    seq: int
    end_monotonic: float
    window_s: float
    functions: tuple[FunctionCost, ...]
    #: What entering a function costs its caller per run (`calibrate_entry_cost`), in ns.
    entry_ns: float = 0.0


@dataclass(frozen=True, slots=True)
class Rest:
    """A requester's slower cadence while nothing happens: its windows come every
    ``period_s`` instead of its own period for as long as ``calm()`` says so.

    ``calm`` is asked on the meter's thread at each tick of the shortest requested period
    that would otherwise bring a window (it must be cheap and must not block); False brings
    a window at once.
    """

    period_s: float
    calm: Callable[[], bool]


@dataclass(frozen=True, slots=True)
class _Request:
    on_s: float
    period_s: float
    rest: Rest | None


class ProcessRunStats:
    """One duty cycle of BPF run statistics for every program of this process.

    Programs register when they are loaded and unregister when closed (a weak reference is
    kept, so a program dropped without `close` goes too). The thread runs while someone
    asked for windows (`request`): a collector reporting its functions' cost, or the
    overhead budget. With several requests the shortest period and window win; a requester
    that offers a `Rest` lets windows come at its rest period while it says all is calm
    (turning the statistics on and off and reading every function is most of the meter's
    cost at rest), its check being all that runs at the shorter period.

    Args:
        next_on_phase: when functions sampled in time next go on (`time.monotonic`; None
            while none is): each window then starts just before that, so it measures them
            attached (the process's meter follows `bpfdyno.ebpf.duty.DUTY`).
    """

    def __init__(self, next_on_phase: Callable[[], float | None] | None = None) -> None:
        self._programs: weakref.WeakSet[MeasuredProgram] = weakref.WeakSet()
        # When the functions sampled in time next go on (None: none is); see `_run`.
        self._next_on_phase = next_on_phase
        self._requests: dict[int, _Request] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: MeterWindow | None = None
        self._seq = 0
        self._listeners: list[Callable[[], None]] = []
        self._check_failed = False  # a requester's calm check raised (logged once)
        #: Why there are no windows ("" while they work).
        self.unavailable_reason = ""
        #: What the statistics add to each run, in ns (measured when the thread starts;
        #: None until then, 0 when it could not be measured).
        self.overhead_ns: float | None = None
        #: What the kernel spends entering a program per run, in ns (measured when the
        #: thread starts and again while something happens, `ENTRY_REMEASURE_S`: the median
        #: of the latest; None until the first, 0 when it could not be measured).
        self.entry_ns: float | None = None
        self._entry_measured: deque[float] = deque(maxlen=ENTRY_KEPT)
        self._entry_at = 0.0  # when it was last measured (monotonic)
        self._busy = False  # the last window came because a requester was not calm

    # -- who is measured, and who asks ----------------------------------------------------

    def register(self, program: MeasuredProgram) -> None:
        """Measure ``program``'s functions from the next window on."""
        with self._lock:
            self._programs.add(program)

    def unregister(self, program: MeasuredProgram) -> None:
        """Stop measuring ``program`` (it is being closed)."""
        with self._lock:
            self._programs.discard(program)

    def request(
        self, owner: object, on_s: float, period_s: float, rest: Rest | None = None
    ) -> None:
        """Ask for windows of ``on_s`` seconds every ``period_s`` (until `release`), or every
        ``rest.period_s`` while ``rest.calm()`` says nothing is happening.

        Raises:
            ValueError: not 0 < on_s <= period_s.
        """
        if not 0 < on_s <= period_s:
            raise ValueError(f"need 0 < on_s <= period_s, got on_s={on_s} period_s={period_s}")
        with self._lock:
            self._requests[id(owner)] = _Request(on_s, period_s, rest)
            start = self._thread is None
            if start:
                self._stop.clear()
                self._thread = threading.Thread(target=self._run, name="bpf-run-stats", daemon=True)
        if start:
            assert self._thread is not None
            self._thread.start()

    def release(self, owner: object) -> None:
        """Withdraw ``owner``'s request; the thread stops (and stats go off) after the last."""
        with self._lock:
            self._requests.pop(id(owner), None)
            if self._requests or self._thread is None:
                return
            thread, self._thread = self._thread, None
            self._stop.set()
        if thread is not threading.current_thread():
            thread.join()

    # -- results --------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn`` (on the meter's thread; it must not block) as each window completes."""
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[], None]) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def last_window(self) -> MeterWindow | None:
        """The latest completed window (None before the first)."""
        with self._lock:
            return self._last

    def wait_window(self, after_seq: int, timeout: float) -> MeterWindow | None:
        """Wait until a window newer than ``after_seq`` completed; None on timeout."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._last is None or self._last.seq <= after_seq:
                left = deadline - time.monotonic()
                if left <= 0 or not self._changed.wait(left):
                    return None
            return self._last

    def functions_of(self, program: MeasuredProgram) -> dict[str, ProgramRunStats]:
        """``program``'s functions in the latest window, by name ({} before the first)."""
        window = self.last_window()
        if window is None or program.closed:
            return {}
        try:
            ids = set(program.program_ids().values())
        except RuntimeError:  # closed meanwhile
            return {}
        return {f.name: f.as_run_stats() for f in window.functions if f.prog_id in ids}

    # -- the thread -----------------------------------------------------------------------

    def _schedule(self) -> tuple[float, float, list[_Request]] | None:
        """(window, tick: the shortest period, every request) now; None: nobody asks."""
        with self._lock:
            if not self._requests:
                return None
            requests = list(self._requests.values())
        on = min(r.on_s for r in requests)
        period = min(r.period_s for r in requests)
        return min(on, period), period, requests

    def _due(self, requests: list[_Request], since_s: float, tick_s: float) -> bool:
        """Whether a window is due ``since_s`` after the last one started: some request's
        period has passed (half a tick early counts: ticks are not exact), its rest period
        for one resting and calm."""
        for r in sorted(requests, key=lambda r: r.rest is not None):  # the cheap ones first
            if since_s + tick_s / 2 < r.period_s:
                continue
            if r.rest is None or since_s + tick_s / 2 >= r.rest.period_s:
                return True
            try:
                calm = r.rest.calm()
            except Exception:  # a check that fails says nothing: measure
                if not self._check_failed:  # once: it would fail at every tick
                    log.exception("BPF run statistics: a calm check failed; measuring")
                self._check_failed = True
                calm = False
            if not calm:
                self._busy = True
                return True
        return False

    def _calibrate(self) -> None:
        if self.overhead_ns is not None:
            return
        try:
            self.overhead_ns = calibrate_stats_overhead()
        except OSError as e:
            self.overhead_ns = 0.0
            log.warning(
                "BPF run statistics: their own cost could not be measured (%s); costs include it",
                e.strerror,
            )
        if self._measure_entry():
            log.info(
                "BPF run statistics: %.0f ns a run of their own; the kernel's entry into a "
                "program %.0f ns a run",
                self.overhead_ns,
                self.entry_ns,
            )

    def _measure_entry(self) -> bool:
        """Measure the kernel's entry into a program (again); False: it cannot be."""
        again = bool(self._entry_measured)
        self._entry_at = time.monotonic()
        try:
            measured = (
                calibrate_entry_cost(ENTRY_REMEASURE_PAIRS, ENTRY_REMEASURE_CALLS)
                if again
                else calibrate_entry_cost()
            )
        except OSError as e:
            if self.entry_ns is None:  # the first time only: the kernel will not change
                self.entry_ns = 0.0
                log.warning(
                    "BPF run statistics: the kernel's entry into a program could not be "
                    "measured (%s); costs leave it out",
                    e.strerror,
                )
            return False
        self._entry_measured.append(measured)
        self.entry_ns = statistics.median(self._entry_measured)
        return True

    @property
    def entry_measured(self) -> tuple[float, ...]:
        """The latest measurements of the kernel's entry (ns a run), oldest first."""
        return tuple(self._entry_measured)

    def _run(self) -> None:
        self._calibrate()
        last: float | None = None  # when the latest window started
        while not self._stop.is_set():
            schedule = self._schedule()
            if schedule is None:
                return
            on_s, period_s, requests = schedule
            if last is not None:
                since = time.monotonic() - last
                if not self._due(requests, since, period_s):
                    # Resting: the next tick, a whole number of periods after the last
                    # window started (this tick may have come a little early or late).
                    ticks = round(since / period_s) + 1
                    self._stop.wait(max(0.0, last + ticks * period_s - time.monotonic()))
                    continue
            if self._busy and time.monotonic() - self._entry_at >= ENTRY_REMEASURE_S:
                self._measure_entry()  # something happens: the entry as it is now
            self._busy = False
            if self._wait_for_on_phase():
                return
            t0 = last = time.monotonic()
            try:
                fd = enable_bpf_stats()
            except OSError as e:
                self.unavailable_reason = refused(e)
                log.warning("%s", self.unavailable_reason)
                return
            try:
                before, b0 = self._counters(), time.monotonic()
                self._stop.wait(on_s)
                after, b1 = self._counters(), time.monotonic()
            finally:
                os.close(fd)
            if self._stop.is_set():
                return
            window_s = b1 - b0
            functions = tuple(
                FunctionCost(
                    name,
                    prog_id,
                    max(cnt1 - cnt0, 0),
                    max(ns1 - ns0, 0),
                    window_s,
                    window_s
                    if att0 is None or att1 is None
                    else min(max(att1 - att0, 0) / 1e9, window_s),
                    self.overhead_ns or 0.0,
                )
                for prog_id, (name, cnt1, ns1, att1) in after.items()
                if prog_id in before
                for _, cnt0, ns0, att0 in (before[prog_id],)
            )
            with self._changed:
                self._seq += 1
                self._last = MeterWindow(self._seq, b1, window_s, functions, self.entry_ns or 0.0)
                self._changed.notify_all()
                listeners = list(self._listeners)
            for fn in listeners:
                try:
                    fn()
                except Exception:  # a listener's failure is its own; the windows go on
                    log.exception("BPF run statistics: a window listener failed")
            self._stop.wait(max(0.0, period_s - (time.monotonic() - t0)))

    def _wait_for_on_phase(self) -> bool:
        """Wait until just before the next on phase of the functions sampled in time (at
        most one sampling period; no wait while none is sampled), so the window measures
        them attached. A window elsewhere in the sampling period would see them detached,
        and again at every period (this period is a whole number of those), so their cost
        as attached would never be measured again. Returns whether the meter is stopping."""
        if self._next_on_phase is None:
            return False
        at = self._next_on_phase()
        if at is None:
            return False
        return self._stop.wait(max(0.0, at - ON_PHASE_LEAD_S - time.monotonic()))

    def _counters(self) -> dict[int, tuple[str, int, int, int | None]]:
        """prog id -> (name, run_cnt, run_time_ns, attached ns or None: attached whenever
        loaded) of every registered function."""
        with self._lock:
            programs = list(self._programs)
        out: dict[int, tuple[str, int, int, int | None]] = {}
        for program in programs:
            try:
                fds = program.program_fds()
                for name, fd in fds.items():
                    counters = prog_counters(fd)
                    if counters is None:
                        continue  # closed meanwhile
                    prog_id, runs, run_ns = counters
                    out[prog_id] = (name, runs, run_ns, program.attached_ns(name))
            except RuntimeError:  # the program was closed meanwhile
                continue
        return out


#: The meter of this process: every `BpfProgram` registers with it.
METER = ProcessRunStats(DUTY.next_period_at)
