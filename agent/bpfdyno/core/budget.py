"""What the overhead budget and the parts it governs share: costs, reductions, excluded work.

The agent keeps its own cost (its BPF programs' run time plus its threads' CPU time) under a
share of one CPU (``[budget]``). The parts that cost something offer `Reduction`s: steps
that make them cheaper while keeping their answers true (sampling in time with estimates
said so, detaching a program whose events are then missing, longer intervals), each of
which can be undone. The budget (``bpfdyno.sources.budget``) measures, decides and applies;
the parts only say what they can do, what it saves and what it costs their data.

`Costs` is one measurement: what each BPF program and each collector cost per second of
wall time, as the reductions need it to predict what they save. `excluded_work` marks
one-off work done at someone's request (compiling BPF programs, merging a trace), which is
accounted apart and never makes telemetry degrade.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from bpfdyno.core.errors import Unavailable
from bpfdyno.core.status import PartState

#: The label a series carries while its value is an estimate (what the budget changed).
ESTIMATE_LABEL = "estimate"
#: That label's value on what is scaled up from a program's sampled time (`bpfdyno.ebpf.duty`).
SAMPLED = "sampled"


@dataclass(frozen=True, slots=True)
class Costs:
    """One measurement of what the agent costs, in ns of CPU per second of wall time.

    Attributes:
        bpf_ns_s: BPF function name -> what it costs per second, as measured (a function
            attached only part of the time costs only that part): its run time plus the
            kernel's entry into it at every run (`bpf_entry_ns_s`).
        bpf_entry_ns_s: BPF function name -> the part of ``bpf_ns_s`` that is the kernel's
            entry into it (its runs times `bpfdyno.ebpf.runstats.calibrate_entry_cost`):
            paid at every run, whatever the function then does.
        bpf_full_ns_s: BPF function name -> what it would cost attached all the time (its
            measured cost divided by the share of the window it was attached); absent for
            functions that were not attached at all in the window.
        bpf_runs_s: BPF function name -> its runs per second in the window.
        collector_ns_s: collector name -> CPU time of its rounds per second.
        agent_ns_s: every thread of the agent, per second (excluded and requested work
            left out).
        window_s: the length of the BPF run-statistics window these come from.
        requested_ns_s: reader (``uid N``) -> CPU time per second the agent spent because
            they read (`RequestedWork`): theirs, never weighed against the budget.
    """

    bpf_ns_s: Mapping[str, float] = field(default_factory=dict)
    bpf_full_ns_s: Mapping[str, float] = field(default_factory=dict)
    bpf_runs_s: Mapping[str, float] = field(default_factory=dict)
    bpf_entry_ns_s: Mapping[str, float] = field(default_factory=dict)
    collector_ns_s: Mapping[str, float] = field(default_factory=dict)
    agent_ns_s: float = 0.0
    window_s: float = 0.0
    requested_ns_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def bpf_total_ns_s(self) -> float:
        """All BPF functions together."""
        return sum(self.bpf_ns_s.values())

    @property
    def total_ns_s(self) -> float:
        """What counts against the budget: the BPF programs and the agent's threads."""
        return self.bpf_total_ns_s + self.agent_ns_s


class Reduction(abc.ABC):
    """One step a part can take to cost less, and undo.

    Subclasses set the attributes and implement `apply`, `undo` and `saving_ns_s`. The
    budget calls `apply` and `undo` from one thread at a time, never concurrently.

    Attributes:
        name: stable identifier, ``<part>.<what>`` (``net.bytes_sampled``); a metric label.
        part: the part it belongs to (``net``, ``sched``, ``irq``, ``daemon``).
        what: what it does, for ``status`` ("socket byte accounting attached 1/8 of the
            time").
        lost: what the data loses while it is in force ("per-process and host-wide byte
            counts are estimates, labelled estimate=sampled").
    """

    name: str = ""
    part: str = ""
    what: str = ""
    lost: str = ""

    @abc.abstractmethod
    def apply(self) -> None:
        """Take the step (idempotent)."""

    @abc.abstractmethod
    def undo(self) -> None:
        """Undo the step (idempotent)."""

    @abc.abstractmethod
    def saving_ns_s(self, costs: Costs) -> float:
        """What taking the step would save per second now (0 when nothing)."""

    def restore_ns_s(self, costs: Costs) -> float | None:
        """What undoing the step would add back per second now; None when unknown.

        A step whose part still sees the events (a program sampled in time) knows it; one
        that stopped seeing them (a detached program) does not, and the budget then tries
        the undo and watches (with a longer wait each time it has to take the step again).
        """
        return None

    def cost_ns_s(self, costs: Costs) -> float:
        """What the part this step acts on costs now (for reasons in ``status``)."""
        return self.saving_ns_s(costs)

    @property
    def active(self) -> bool:
        """Whether the step is in force."""
        return bool(getattr(self, "_active", False))

    @active.setter
    def active(self, value: bool) -> None:
        self._active = value


@dataclass(frozen=True, slots=True)
class RequestedPrograms:
    """BPF programs that run only because someone asked (a trace's kernel tracks), and who.

    What they cost is the requesters' work (`RequestedWork.charge`), never the agent's: the
    budget leaves it out of what it weighs and takes no step on them.

    Attributes:
        prog_ids: the kernel's ids of the programs' functions.
        readers: who asked for what they record now (``uid N``), the cost shared equally.
    """

    prog_ids: frozenset[int] = frozenset()
    readers: tuple[str, ...] = ()


def degraded_by(reductions: Iterable[Reduction]) -> tuple[PartState, str] | None:
    """A part's health while the budget holds some of its steps (None: none in force)."""
    held = [r for r in reductions if r.active]
    if not held:
        return None
    what = "; ".join(f"{r.what} ({r.lost})" for r in held)
    return PartState.DEGRADED, f"reduced by the overhead budget: {what}"


def sampled_share(held_off_ns: int, interval_s: float) -> float:
    """The share of an interval a function was attached, from how long it was held off.

    Exactly 1.0 when it was never held off (its counts are exact); else 1 - off / interval.

    Args:
        held_off_ns: how long the budget held it off in the interval
            (`bpfdyno.ebpf.program.BpfProgram.held_off_ns` difference).
        interval_s: the interval.
    """
    if held_off_ns <= 0 or interval_s <= 0:
        return 1.0
    return min(max(1.0 - held_off_ns / 1e9 / interval_s, 0.0), 1.0)


# --- work done at someone's request, not counted against the budget ---------------------------

_excluded_lock = threading.Lock()
_excluded_ns = 0  # finished blocks
_excluded_running: dict[int, tuple[int, int]] = {}  # block id -> (thread CPU clock, start ns)
_block_ids = itertools.count()


@contextlib.contextmanager
def excluded_work() -> Iterator[None]:
    """Count the calling thread's CPU time inside the block as excluded from the budget.

    For one-off work somebody asked for or that starting needs (compiling a BPF program,
    merging a trace's kernel tracks): it costs CPU, but degrading telemetry for it would
    help nobody. The total, blocks still running included, is `excluded_cpu_ns`.
    """
    global _excluded_ns
    clock = time.pthread_getcpuclockid(threading.get_ident())
    start = time.clock_gettime_ns(clock)
    key = next(_block_ids)
    with _excluded_lock:
        _excluded_running[key] = (clock, start)
    try:
        yield
    finally:
        spent = time.clock_gettime_ns(clock) - start
        with _excluded_lock:
            del _excluded_running[key]
            _excluded_ns += spent


def excluded_cpu_ns() -> int:
    """CPU time of every `excluded_work` block of this process so far, in ns (a compile
    still running counts up to now, so a measurement window never sees it as the agent's)."""
    with _excluded_lock:
        running = sum(time.clock_gettime_ns(c) - t0 for c, t0 in _excluded_running.values())
        return _excluded_ns + running


def ratio_text(ns_s: float) -> str:
    """A cost per second as a share of one CPU for messages ("0.42 %")."""
    return f"{ns_s / 1e7:.2f} %"


# --- work done because someone reads: the reader's, not the agent's -------------------------

#: The rule a reader over their share of requested work is refused by.
REQUESTED_RULE = "requested_work_limit"
#: Users whose requested work is kept apart (past it, the longest-idle is forgotten).
_MAX_READERS = 1024


@dataclass(slots=True)
class _Bucket:
    """One reader's allowance of requested CPU time: refilled at the per-user rate, up to
    `RequestedWork.BURST_S` seconds' worth."""

    tokens_ns: float
    at: float
    spent_ns: int = 0


class RequestedWork:
    """CPU time of work done because someone reads, per reader, and each reader's bound.

    A read that refreshes a part (the process table, the threads' walk), keeps it fresh
    every round while someone watches, or answers a query costs CPU because that reader
    asked: it is theirs. It is counted apart per reader (``uid N``), left out of what the
    overhead budget weighs for its collection decisions (ordinary reading must never make
    the agent degrade itself for everyone), and bounded per reader: a reader who spent more
    than ``ratio`` of a core over the last `BURST_S` seconds is refused until their
    allowance refills.

    Args:
        ratio: each reader's share of one CPU (``[budget] requested_per_user_ratio``).
        clock: monotonic seconds.
    """

    BURST_S = 10.0

    def __init__(self, ratio: float = 0.05, clock: Callable[[], float] = time.monotonic) -> None:
        self.ratio = ratio
        self._clock = clock
        self._lock = threading.Lock()
        self._readers: dict[str, _Bucket] = {}
        self._total_ns = 0
        self._local = threading.local()

    @contextlib.contextmanager
    def work(self, readers: Collection[str], bounded: bool = True) -> Iterator[None]:
        """Count the calling thread's CPU time in the block as ``readers``' (shared equally);
        a block inside another counts once, in the outer one; no readers: not requested.

        ``bounded=False``: work that is bounded already, whoever reads (keeping a part fresh
        every round while someone watches: once a round, shared by every reader). It is
        theirs and named as theirs, but it does not spend their allowance: on a big node
        one `top` would otherwise be refused for the node's size."""
        depth = getattr(self._local, "depth", 0)
        if not readers or depth:
            yield
            return
        self._local.depth = 1
        start = time.thread_time_ns()
        try:
            yield
        finally:
            self._local.depth = 0
            spent = time.thread_time_ns() - start
            self._local.ns = getattr(self._local, "ns", 0) + spent
            self._charge(readers, spent, bounded)

    def charge(self, readers: Collection[str], spent_ns: int) -> None:
        """Count ``spent_ns`` of CPU time spent outside the agent's threads as ``readers``'
        (shared equally), bounded like any of their requests: the run time of BPF programs
        attached because they asked (a trace's kernel tracks), which the kernel charges to
        whichever task ran them. Not part of `total_ns` (the agent's threads never spent
        it); no readers: nobody is charged."""
        if readers and spent_ns > 0:
            self._charge(readers, spent_ns, True, threads=False)

    def _charge(
        self, readers: Collection[str], spent: int, bounded: bool, threads: bool = True
    ) -> None:
        share = spent / len(readers)
        now = self._clock()
        with self._lock:
            if threads:
                self._total_ns += spent
            for who in readers:
                b = self._refilled(who, now)
                if bounded:
                    b.tokens_ns -= share
                b.spent_ns += int(share)

    def _refilled(self, who: str, now: float) -> _Bucket:
        full = self.ratio * 1e9 * self.BURST_S
        b = self._readers.get(who)
        if b is None:
            if len(self._readers) >= _MAX_READERS:
                oldest = min(self._readers, key=lambda k: self._readers[k].at)
                del self._readers[oldest]
            b = self._readers[who] = _Bucket(full, now)
        else:
            b.tokens_ns = min(full, b.tokens_ns + (now - b.at) * self.ratio * 1e9)
            b.at = now
        return b

    def check(self, who: str) -> None:
        """Refuse ``who`` while their allowance is spent.

        Raises:
            Unavailable: rule `REQUESTED_RULE`, with when to retry.
        """
        now = self._clock()
        with self._lock:
            b = self._refilled(who, now) if who in self._readers else None
            short = -b.tokens_ns if b is not None and b.tokens_ns < 0 else 0.0
        if short > 0:
            wait = short / (self.ratio * 1e9)
            raise Unavailable(
                f"{who} has had the agent spend more than {self.ratio * 100:g} % of a core on "
                f"their requests over the last {self.BURST_S:g} s (the most one user may, "
                f"[budget] requested_per_user_ratio); retry in {wait:.1f} s, or read less often",
                REQUESTED_RULE,
            )

    def total_ns(self) -> int:
        """Every reader's requested CPU time on the agent's threads so far (ns): what the
        agent's own CPU time holds of it (`charge`d kernel time is not in it)."""
        with self._lock:
            return self._total_ns

    def by_reader(self) -> dict[str, int]:
        """Each reader's requested CPU time so far (ns)."""
        with self._lock:
            return {who: b.spent_ns for who, b in self._readers.items()}

    def on_this_thread(self) -> int:
        """Requested CPU time of the calling thread so far (ns): a part that measures its
        own thread's time takes it out."""
        return int(getattr(self._local, "ns", 0))


#: The agent's one account of requested work.
REQUESTED = RequestedWork()


def reader(uid: int | None, peer: str = "") -> str:
    """How a reader is named in the requested-work account and in ``status``."""
    return f"uid {uid}" if uid is not None else (peer.rsplit(":", 1)[0] or "unknown")
