"""Sampling in time: BPF functions doing their full work only part of every period (`DUTY`).

A function that runs on every socket call or context switch costs in proportion to the
event rate. When the overhead budget must cut that cost but keep the data, it lets the
function do its work for a share ``f`` of every `PERIOD_S` only; its reader scales what it
counted by the share of its interval the function was on (`DutyCycler.held_off_ns`), an
estimate it labels as one. Two ways of being off (`Toggled`):

* detached (`AttachedFunctions`): the function costs nothing then, the kernel's dispatch to
  it included; attaching again costs a system call or two (a BTF-typed program: ~0.5 ms of
  CPU), so this suits programs that are cheap to attach;
* told by a flag in one of its maps (`FlagSwitch`): it still runs, keeps its exact host-wide
  totals and skips the rest (a few ns); flipping costs one map update, and the event rate
  stays known. For classic tracepoints, whose detach waits for the kernel (~70 ms here).

Every function sampled shares one thread and one phase: all go on at the start of each
period and each goes off after its share. The periods follow one another on a fixed grid
(`DutyCycler.next_period_at`), so the run-statistics meter can place its windows over an on
phase: a window elsewhere would see the functions detached, again at every period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: One on phase and one off phase per this many seconds.
PERIOD_S = 1.0
#: The smallest share a function may be on.
MIN_SHARE = 1 / 64


class Toggled(Protocol):
    """Something the cycler turns on and off."""

    @property
    def closed(self) -> bool: ...

    def set_off(self, off: bool) -> None: ...


class AttachedFunctions:
    """Functions of a program, off = detached (`BpfProgram.set_off_phase`)."""

    def __init__(self, program: Any, fns: Collection[str]) -> None:
        self._program = program
        self.fns = frozenset(fns)

    @property
    def closed(self) -> bool:
        return bool(self._program.closed)

    def set_off(self, off: bool) -> None:
        self._program.set_off_phase(self.fns, off)


class FlagSwitch:
    """Functions that read a flag from one slot of an array map: 1 = off, 0 = on.

    Args:
        program: the program (`BpfProgram`) owning the map.
        table: the map's name.
        index: the slot.
    """

    def __init__(self, program: Any, table: str, index: int = 0) -> None:
        self._program = program
        self._table = table
        self._index = index

    @property
    def closed(self) -> bool:
        return bool(self._program.closed)

    def set_off(self, off: bool) -> None:
        table = self._program.table(self._table)
        table[table.Key(self._index)] = table.Leaf(1 if off else 0)


@dataclass(slots=True)
class _Entry:
    target: Toggled
    share: float
    off: bool = False
    off_since_ns: int = 0
    off_total_ns: int = 0


class DutyCycler:
    """Turns registered targets on for a share of every period, on one thread.

    Args:
        period_s: the length of one on + off cycle.
    """

    def __init__(self, period_s: float = PERIOD_S) -> None:
        self.period_s = period_s
        self._entries: dict[int, _Entry] = {}
        #: Off time of targets no longer sampled (their reader may still ask).
        self._done_ns: dict[int, int] = {}
        # Held while phases change, so an entry withdrawn meanwhile is never turned off again.
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._period_at: float | None = None  # when the current period began (monotonic)

    def sample(self, target: Toggled, share: float) -> None:
        """Turn ``target`` on for ``share`` of every period (1: on all the time, as before).

        Raises:
            ValueError: share outside [MIN_SHARE, 1].
        """
        if not MIN_SHARE <= share <= 1:
            raise ValueError(f"share must be in [{MIN_SHARE}, 1], got {share}")
        key = id(target)
        with self._lock:
            if share >= 1:
                entry = self._entries.pop(key, None)
                if entry is not None:
                    self._switch(entry, off=False)
                    self._done_ns[key] = entry.off_total_ns
                return
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(target, share, off_total_ns=self._done_ns.pop(key, 0))
                self._entries[key] = entry
            entry.share = share
            if self._thread is None:
                self._period_at = time.monotonic()  # the first period begins now
                self._thread = threading.Thread(target=self._run, name="bpf-duty", daemon=True)
                self._thread.start()

    def held_off_ns(self, target: Toggled) -> int:
        """How long ``target`` has been off so far (0 when it never was)."""
        now = time.monotonic_ns()
        with self._lock:
            entry = self._entries.get(id(target))
            if entry is None:
                return self._done_ns.get(id(target), 0)
            return entry.off_total_ns + (now - entry.off_since_ns if entry.off else 0)

    def share(self, target: Toggled) -> float:
        """The share of the time ``target`` is on (1: not sampled)."""
        with self._lock:
            entry = self._entries.get(id(target))
            return entry.share if entry is not None else 1.0

    def next_period_at(self) -> float | None:
        """When (`time.monotonic`) the next period begins, every sampled function going on
        then; None while nothing is sampled. In the past when the thread is late."""
        with self._lock:
            if self._thread is None or self._period_at is None:
                return None
            return self._period_at + self.period_s

    def _run(self) -> None:
        with self._lock:
            t0 = self._period_at or time.monotonic()
        while True:
            with self._lock:
                entries = [e for e in self._entries.values() if not e.target.closed]
                if not entries:
                    self._thread = None
                    self._period_at = None
                    return
                self._period_at = t0
            self._phase(entries, off=False)
            for e in sorted(entries, key=lambda e: e.share):
                self._sleep_until(t0 + e.share * self.period_s)
                self._phase([e], off=True)
            # On a fixed grid (a period's start does not wait for the last one's switching),
            # unless a whole period was missed: then afresh from now.
            t0 += self.period_s
            now = time.monotonic()
            if now > t0 + self.period_s:
                t0 = now
            self._sleep_until(t0)

    def _phase(self, entries: list[_Entry], off: bool) -> None:
        with self._lock:
            for e in entries:
                if self._entries.get(id(e.target)) is e:  # still sampled
                    self._switch(e, off)

    @staticmethod
    def _switch(e: _Entry, off: bool) -> None:
        if e.off == off:
            return
        try:
            e.target.set_off(off)
        except Exception:  # closed meanwhile, or the kernel refused: stays as it is
            log.exception("sampling: switching %r failed", e.target)
            return
        now = time.monotonic_ns()
        if off:
            e.off_since_ns = now
        else:
            e.off_total_ns += now - e.off_since_ns
        e.off = off

    @staticmethod
    def _sleep_until(t: float) -> None:
        left = t - time.monotonic()
        if left > 0:
            time.sleep(left)


#: The cycler of this process.
DUTY = DutyCycler()
