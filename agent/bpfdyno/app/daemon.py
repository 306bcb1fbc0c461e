"""The daemon: one asyncio loop that owns all state, collectors on worker threads.

Data flows one way: each collector's worker thread returns samples to the loop, which appends
them to the store, hands them to the exporters and publishes the round to stream subscribers.
Collectors run on monotonic deadlines. One that may block (`Collector.may_block`: NVML, a
walk of other processes' /proc files) has a dedicated single-thread executor, so a slow or
hung source cannot delay another; the others (procfs counters, BPF maps, perf counters) share
one thread per interval and their rounds, falling due together, run as one batch
(`SharedWorker`). Errors are isolated per collector: counted, logged once per distinct error,
and followed by an exponential back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from bpfdyno.app.catalog import CATALOG
from bpfdyno.core.budget import REQUESTED, Costs, Reduction, excluded_work
from bpfdyno.core.catalog import Catalog
from bpfdyno.core.config import Config
from bpfdyno.core.demand import ReadDemand
from bpfdyno.core.metrics import HistogramSample, Round, Sample
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.core.store import MetricStore, RoundPublisher
from bpfdyno.core.workers import DaemonExecutor
from bpfdyno.sources.base import Collector, CollectorUnavailable

log = logging.getLogger(__name__)

#: Longest back-off after repeated failures of one collector.
MAX_BACKOFF_S = 60.0
#: Longest wait for one collector's close() at shutdown (detaching BPF takes milliseconds).
CLOSE_TIMEOUT_S = 2.0
#: Exit status when the graceful stop did not finish in time (`exit_deadline`).
EXIT_STOP_TIMEOUT = 1


class Component(Protocol):
    """A long-running part of the daemon that is not a polled collector (IPC endpoints...)."""

    name: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def statuses(self) -> list[PartStatus]:
        """The state of each part this component runs (one or more)."""


class RoundSink(Protocol):
    """Something that consumes every collection round (exporters)."""

    def submit(self, rnd: Round) -> None:
        """Take the round without blocking the event loop."""

    def status(self) -> PartStatus:
        """Its state, for `status` (an exporter failing to write is degraded)."""

    def close(self) -> None:
        """Flush and release; called once at shutdown."""


@dataclass
class _ErrorLog:
    """Logs each distinct error once, counts all of them."""

    seen: set[str] = field(default_factory=set)

    def first_time(self, key: str) -> bool:
        if key in self.seen:
            return False
        if len(self.seen) < 1000:
            self.seen.add(key)
        return True


_R = TypeVar("_R")


class SharedWorker:
    """One thread for the rounds of the collectors that never block, run in batches.

    Every call of `run` made in the same turn of the event loop joins one batch, which the
    thread runs in order; each caller gets its own result or exception. Rounds that fall due
    together (same interval, same deadlines) so cost one hand-off to the thread and one back,
    instead of one each: on an idle host that hand-off, not the reading, was most of a
    round's cost (measured: the whole agent 0.67 % of a core with a thread per collector,
    0.45 % without the hand-offs; see docs/performance.md).
    """

    def __init__(self, name: str) -> None:
        self._executor = DaemonExecutor(name)
        self._batch: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []

    async def run(self, fn: Callable[[], _R]) -> _R:
        """Run ``fn`` on the shared thread with the other calls of this loop turn."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_R] = loop.create_future()
        if not self._batch:
            loop.call_soon(self._flush)  # after the other rounds due in this turn
        self._batch.append((fn, fut))
        return await fut

    def _flush(self) -> None:
        batch, self._batch = self._batch, []
        done = asyncio.get_running_loop().run_in_executor(
            self._executor, _run_each, [fn for fn, _ in batch]
        )
        done.add_done_callback(lambda f: _deliver(batch, f))

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _run_each(fns: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    """Call each function; (True, result) or (False, exception) for each, in order."""
    out: list[tuple[bool, Any]] = []
    for fn in fns:
        try:
            out.append((True, fn()))
        except Exception as e:  # one collector's failure is its own
            out.append((False, e))
    return out


def _deliver(
    batch: list[tuple[Callable[[], Any], asyncio.Future[Any]]],
    done: asyncio.Future[list[tuple[bool, Any]]] | Future[list[tuple[bool, Any]]],
) -> None:
    if done.cancelled() or done.exception() is not None:
        for _, fut in batch:
            if not fut.done():
                fut.cancel()
        return
    for (_, fut), (ok, value) in zip(batch, done.result(), strict=True):
        if fut.done():
            continue  # its runner was cancelled meanwhile
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)


class CollectorRunner:
    """Drives one collector: start, collect on deadlines with back-off, close.

    While nobody reads (``demand``), its rounds come every ``idle_interval_s`` instead, or as
    far apart as the collector keeps up at when that is shorter
    (`Collector.longest_interval_s`), whenever that is longer than the normal step
    (`idle_step_s`); a read wakes it at once when its last round is older than one normal
    round (`wake`).

    Args:
        collector: the collector.
        interval_s: seconds between rounds.
        worker: the shared thread its rounds run on; None: its own thread.
        idle_interval_s: seconds between rounds while nobody reads; 0: always ``interval_s``.
        demand: who reads; None: nobody is ever asked (always ``interval_s``).
    """

    def __init__(
        self,
        collector: Collector,
        interval_s: float,
        worker: SharedWorker | None = None,
        idle_interval_s: float = 0.0,
        demand: ReadDemand | None = None,
    ) -> None:
        self.collector = collector
        self.name = collector.name
        self.interval_s = interval_s
        self.idle_interval_s = idle_interval_s if demand is not None else 0.0
        self._demand = demand
        #: Whether its next round comes at the slow cadence (nobody reads).
        self.idling = False
        #: When its last round (success or failure) ended (``time.monotonic()``); None: none yet.
        self.last_round_at: float | None = None
        # Futures of reads waiting for its next round (resolved whatever the round's outcome).
        self._waiters: list[asyncio.Future[None]] = []
        # Set while it sleeps: resolved by `wake`.
        self._wake: asyncio.Future[None] | None = None
        self._woken = False  # the sleep ended by `wake`, not at its deadline
        self._due = False  # the collector asked for a round now (`Collector.set_due`)
        # Who this round runs for (set before each round; rounds of one runner never overlap).
        self._round_readers: list[str] = []
        self._running = False
        self.state = PartState.STARTING
        self.reason = ""
        #: Unavailable because what it needs is not part of this host (`CollectorUnavailable`).
        self.absent = False
        self.collections = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_duration_s = 0.0
        self.last_success_ts = 0.0
        #: CPU time of its rounds so far (ns, on the thread that ran them).
        self.cpu_ns = 0
        #: The overhead budget multiplies the interval by this while it slows collection.
        self.interval_factor = 1
        self._errors = _ErrorLog()
        # start() and close() always run here (a BPF compile must not hold up others' rounds).
        # A daemon thread: a collect() stuck in NVML or on a locked /proc file must not keep
        # the agent from exiting.
        self._executor = DaemonExecutor(f"collector-{self.name}")
        self._worker = worker
        self._started = False

    def status(self) -> PartStatus:
        return PartStatus(
            name=self.name,
            state=self.state,
            reason=self.reason,
            interval_s=self.interval_s * self.interval_factor,
            collections=self.collections,
            errors=self.errors,
            last_duration_s=self.last_duration_s,
            last_success_ts=self.last_success_ts,
        )

    async def start(self) -> bool:
        loop = asyncio.get_running_loop()
        try:
            # Starting (compiling BPF, initialising NVML) is not the running cost the
            # overhead budget limits.
            await loop.run_in_executor(self._executor, _excluded(self.collector.start))
        except CollectorUnavailable as e:
            self.state, self.reason = PartState.UNAVAILABLE, str(e)
            self.absent = e.absent
            if not e.absent:  # absent ones are named together by the daemon, at INFO
                log.warning("collector %s unavailable: %s", self.name, e)
            return False
        except Exception as e:  # a bug or an unexpected environment: isolate it
            self.state = PartState.UNAVAILABLE
            self.reason = f"failed to start: {type(e).__name__}: {e}"
            log.exception("collector %s failed to start", self.name)
            return False
        finally:
            if self._worker is not None:
                # Its rounds run on the shared thread: no idle thread (with its stack and
                # malloc arena) kept for a close that comes once; `close` makes one.
                self._executor.shutdown(wait=False)
        self._started = True
        self.state = PartState.OK

        def due() -> None:
            with contextlib.suppress(RuntimeError):  # asked after the loop closed
                loop.call_soon_threadsafe(self._due_now)

        self.collector.set_due(due)
        return True

    async def run(self, on_round: Callable[[Round], None], start_t: float | None = None) -> None:
        """Collect forever on monotonic deadlines; returns only when cancelled.

        Args:
            on_round: receives each successful round, on the event loop.
            start_t: the first deadline (``time.monotonic()``; default now). Runners given the
                same start and interval fall due in the same turn of the loop.
        """
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() if start_t is None else start_t
        self._running = True
        try:
            await self._run(loop, on_round, deadline)
        finally:
            self._running = False
            for fut in self._waiters:
                if not fut.done():
                    fut.cancel()
            self._waiters.clear()

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        on_round: Callable[[Round], None],
        deadline: float,
    ) -> None:
        while True:
            deadline = await self._sleep(loop, deadline)
            t0 = time.monotonic()
            # A round run at the normal cadence only because someone reads (it would idle
            # otherwise) is the readers' work.
            self._round_readers = (
                self._demand.readers()
                if self._demand is not None and self._idles_without_readers()
                else []
            )
            try:
                if self._worker is not None:
                    samples, histograms, health = await self._worker.run(self._collect_once)
                else:
                    samples, histograms, health = await loop.run_in_executor(
                        self._executor, self._collect_once
                    )
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed(e)
                self._round_done()
            else:
                ts = time.time()
                self.collections += 1
                self.consecutive_errors = 0
                self.last_success_ts = ts
                state, reason = health if health is not None else (PartState.OK, "")
                if self.state is PartState.DEGRADED and state is PartState.OK:
                    log.info("collector %s recovered", self.name)
                self.state, self.reason = state, reason
                on_round(Round(self.name, ts, samples, histograms))
                self._round_done()
            self.last_duration_s = time.monotonic() - t0
            step = self.normal_step_s()
            # Backing off after errors is not idling: a read does not cut a back-off short.
            self.idling = (
                not self.consecutive_errors
                and self._idles_without_readers()
                and not self._demand_active()
            )
            if self.idling:
                step = self.idle_step_s()
            if self.consecutive_errors:
                step = min(MAX_BACKOFF_S, self.interval_s * 2 ** min(self.consecutive_errors, 16))
            deadline += step
            now = time.monotonic()
            if deadline <= now:
                # Missed deadlines (a slow collect, a suspended VM): skip them rather than
                # firing a burst of back-to-back rounds.
                deadline = now + step - math.fmod(now - deadline, step)

    def normal_step_s(self) -> float:
        """Seconds between rounds while someone reads (the budget may lengthen it)."""
        return self.interval_s * self.interval_factor

    def idle_step_s(self) -> float:
        """Seconds between rounds while nobody reads: the slow interval, or the longest the
        collector keeps up at if shorter (a machine's process churn fills the exited threads'
        map and the event ring buffer between two rounds); 0 when that is no longer than the
        normal step (it runs at the normal cadence)."""
        step = min(self.idle_interval_s, self.collector.longest_interval_s())
        return step if step > self.normal_step_s() else 0.0

    def _idles_without_readers(self) -> bool:
        """Whether its rounds would come at a slower cadence if nobody read."""
        return self.idle_step_s() > 0.0

    def _demand_active(self) -> bool:
        return self._demand is not None and self._demand.active()

    async def _sleep(self, loop: asyncio.AbstractEventLoop, deadline: float) -> float:
        """Sleep until ``deadline``, or until a read wants a round sooner (`wake`): then
        until one normal round after the last. Returns the deadline it woke at."""
        while deadline > time.monotonic():
            self._wake = loop.create_future()
            self._woken = False
            try:
                await _sleep_until(loop, deadline, self._wake)
            finally:
                self._wake = None
            if self._due:
                self._due = False
                return time.monotonic()
            if self._woken and self.last_round_at is not None:
                deadline = min(deadline, self.last_round_at + self.normal_step_s())
        return deadline

    def stale(self, now: float) -> bool:
        """Whether it idles (nobody read) and its last round is older than one normal round
        (a little late allowed). A round late at the normal cadence (a loaded machine) is
        not waited for: it comes as soon as it can anyway."""
        if not self._running or not self.idling or self.last_round_at is None:
            return False
        return now - self.last_round_at > 1.5 * self.normal_step_s()

    def wake(self) -> None:
        """A read came: a round now if the last is older than one normal round, else at one
        normal round after it (never more than one a round, however many read). On the loop."""
        if self.idling and self._wake is not None and not self._wake.done():
            self._woken = True
            self._wake.set_result(None)

    def _due_now(self) -> None:
        """The collector asked for a round now (on the loop): while it sleeps, its round
        comes at once and the next one an interval later; asked during a round, nothing."""
        if self._wake is not None and not self._wake.done():
            self._due = True
            self._wake.set_result(None)

    def next_round(self) -> asyncio.Future[None]:
        """Resolved when its next round ends, whatever its outcome (on the loop)."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        return fut

    def _round_done(self) -> None:
        self.last_round_at = time.monotonic()
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _collect_once(
        self,
    ) -> tuple[Sequence[Sample], Sequence[HistogramSample], tuple[PartState, str] | None]:
        t0 = time.thread_time_ns()
        r0 = REQUESTED.on_this_thread()
        try:
            with REQUESTED.work(self._round_readers, bounded=False):
                samples = self.collector.collect()
                return samples, self.collector.histograms(), self.collector.health()
        finally:
            # What it did for readers is theirs (`bpfdyno.core.budget.RequestedWork`).
            requested = REQUESTED.on_this_thread() - r0
            self.cpu_ns += time.thread_time_ns() - t0 - requested

    def _failed(self, e: Exception) -> None:
        self.errors += 1
        self.consecutive_errors += 1
        msg = f"{type(e).__name__}: {e}"
        self.state, self.reason = PartState.DEGRADED, msg
        if self._errors.first_time(msg):
            log.error("collector %s failed: %s (logged once; will back off)", self.name, msg)

    async def close(self) -> None:
        if self._started:
            loop = asyncio.get_running_loop()
            if self._worker is not None:
                self._executor = DaemonExecutor(f"close-{self.name}")
            try:
                # Behind a collect() that may be stuck: the agent stops without it then.
                await asyncio.wait_for(
                    loop.run_in_executor(self._executor, self.collector.close), CLOSE_TIMEOUT_S
                )
            except TimeoutError:
                log.error(
                    "collector %s did not close within %g s (a collection still blocked?); "
                    "stopping without it",
                    self.name,
                    CLOSE_TIMEOUT_S,
                )
            except Exception:
                log.exception("collector %s failed to close", self.name)
        if self.state is not PartState.UNAVAILABLE:
            self.state = PartState.STOPPED
        self._executor.shutdown(wait=False, cancel_futures=True)


class SlowerCollection(Reduction):
    """The budget's last resort for the agent's own threads: every collector's interval
    times `FACTOR` (the budget's own excepted). The data stays exact, only coarser.

    Args:
        runners: the daemon's collector runners.
        keep: collectors whose interval never changes (the budget itself).
    """

    FACTOR = 4
    name = "daemon.slower_collection"
    part = "daemon"

    def __init__(self, runners: Sequence[CollectorRunner], keep: frozenset[str]) -> None:
        self._runners = [r for r in runners if r.name not in keep]
        self.what = f"every collector's interval {self.FACTOR}x longer"
        self.lost = "every metric is still exact, at a coarser time resolution"
        self.active = False

    def apply(self) -> None:
        for r in self._runners:
            r.interval_factor = self.FACTOR
        self.active = True

    def undo(self) -> None:
        for r in self._runners:
            r.interval_factor = 1
        self.active = False

    def saving_ns_s(self, costs: Costs) -> float:
        return 0.0 if self.active else self.cost_ns_s(costs) * (1 - 1 / self.FACTOR)

    def cost_ns_s(self, costs: Costs) -> float:
        names = {r.name for r in self._runners}
        return sum(v for k, v in costs.collector_ns_s.items() if k in names)

    def restore_ns_s(self, costs: Costs) -> float | None:
        return self.cost_ns_s(costs) * (self.FACTOR - 1) if self.active else 0.0


class LessHistory(Reduction):
    """The overhead budget's memory step: the store keeps a quarter of its history.

    The store belongs to the event loop: the change is made there.

    Args:
        store: the daemon's store.
        loop: the daemon's event loop.
    """

    name = "memory.less_history"
    part = "daemon"

    def __init__(self, store: MetricStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        self._configured = store.history_s
        self.what = f"metric history kept for {self._configured / 4:.0f} s"
        self.lost = "window queries reach back less far; older points are gone"
        self.active = False

    def apply(self) -> None:
        self._loop.call_soon_threadsafe(self._store.set_history, self._configured / 4)
        self.active = True

    def undo(self) -> None:
        self._loop.call_soon_threadsafe(self._store.set_history, self._configured)
        self.active = False

    def saving_ns_s(self, costs: Costs) -> float:
        return 0.0  # a memory step: it saves bytes, not CPU


def _excluded(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` with its CPU time counted as excluded work (`bpfdyno.core.budget`)."""

    def run() -> None:
        with excluded_work():
            fn()

    return run


async def _sleep_until(
    loop: asyncio.AbstractEventLoop, deadline: float, fut: asyncio.Future[None] | None = None
) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline`` (the loop's clock), or until
    ``fut`` is resolved by someone else."""
    if fut is None:
        fut = loop.create_future()

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    handle = loop.call_at(deadline, wake)
    try:
        await fut
    finally:
        handle.cancel()


class Daemon:
    """Owns the store, the collector runners, the components and the sinks."""

    def __init__(
        self,
        cfg: Config,
        collectors: Sequence[Collector],
        components: Sequence[Component] = (),
        sinks: Sequence[RoundSink] = (),
        disabled: Sequence[str] = (),
        catalog: Catalog = CATALOG,
        demand: ReadDemand | None = None,
        steady: Collection[str] = (),
    ) -> None:
        """Args:
        cfg: the configuration.
        collectors: the enabled collectors.
        components: the other long-running parts (tracing, legacy RPC, ...).
        sinks: the exporters.
        disabled: collectors turned off in the configuration, reported as such by status.
        catalog: every metric the collectors can emit.
        demand: who reads (the services and exporters note each read): while nobody does,
            rounds come every ``[daemon] idle_interval_s``; None: reads are not followed
            (a record of the daemon's own), every round at its interval.
        steady: collectors that keep their cadence while nobody reads (the budget measuring
            the agent, detection watching ranks).
        """
        self.cfg = cfg
        self.catalog = catalog
        self.store = MetricStore(cfg.daemon.history_s, cfg.daemon.interval_s, cfg.daemon.max_series)
        self.demand = demand if demand is not None else ReadDemand()
        self._workers: dict[float, SharedWorker] = {}
        idle_s = idle_interval(cfg)
        self.runners = [
            CollectorRunner(
                c,
                cfg.collector_interval(c.name),
                self._worker_for(c, cfg),
                idle_interval_s=0.0 if c.name in steady else idle_s,
                demand=demand,
            )
            for c in collectors
        ]
        self.components = list(components)
        self.sinks = list(sinks)
        self.disabled = list(disabled)
        self.publisher = RoundPublisher()
        self.started_ts = time.time()
        self.started_monotonic = time.monotonic()
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    @property
    def config_source(self) -> str:
        """Where the configuration came from (a file, the command line, the defaults)."""
        return self.cfg.source

    def collector_intervals(self) -> dict[str, float]:
        """Each running collector's interval in seconds."""
        return {r.name: r.interval_s for r in self.runners}

    def collector_cpu_ns(self) -> dict[str, int]:
        """Each collector's CPU time in its rounds so far, in ns (any thread may ask)."""
        return {r.name: r.cpu_ns for r in self.runners}

    def slower_collection(self, keep: frozenset[str]) -> SlowerCollection:
        """The budget's step that lengthens every interval but those of ``keep``."""
        return SlowerCollection(self.runners, keep)

    def less_history(self) -> LessHistory:
        """The budget's memory step on the store (call on the event loop)."""
        return LessHistory(self.store, asyncio.get_running_loop())

    def _worker_for(self, c: Collector, cfg: Config) -> SharedWorker | None:
        """The shared thread of the collectors that never block and have ``c``'s interval."""
        if c.may_block:
            return None
        interval = cfg.collector_interval(c.name)
        worker = self._workers.get(interval)
        if worker is None:
            worker = self._workers[interval] = SharedWorker(f"collectors-{interval:g}s")
        return worker

    def statuses(self) -> list[PartStatus]:
        """Every part's state: collectors (enabled, then disabled), components, exporters."""
        out = [r.status() for r in self.runners]
        out += [
            PartStatus(
                name,
                PartState.DISABLED,
                f"disabled in the configuration (collectors.{name}.enabled = false)",
                interval_s=self.cfg.collector_interval(name),
            )
            for name in self.disabled
        ]
        for comp in self.components:
            out.extend(comp.statuses())
        out += [sink.status() for sink in self.sinks]
        out.append(self.publisher.status())
        return out

    def _on_round(self, rnd: Round) -> None:
        self.store.append(rnd.ts, rnd.samples)
        for sink in self.sinks:
            try:
                sink.submit(rnd)
            except Exception:
                log.exception("exporter %s failed", type(sink).__name__)
        self.publisher.publish(rnd)

    def _wake_stale(self) -> None:
        """A read came: wake the collectors that idle (on the loop)."""
        for r in self.runners:
            r.wake()

    async def fresh(self, within_s: float) -> None:
        """Return once every running collector's latest round is no older than one normal
        round: those older (idle while nobody read) are woken and waited for, at most
        ``within_s`` (a collector stuck in a driver call does not hold the read longer)."""
        now = time.monotonic()
        stale = [r for r in self.runners if r.stale(now)]
        if not stale:
            return
        waits = [r.next_round() for r in stale]
        for r in stale:
            r.wake()
        _done, pending = await asyncio.wait(waits, timeout=within_s)
        for fut in pending:
            fut.cancel()

    async def start(self) -> None:
        """Start components, then every collector concurrently; schedule the started ones."""
        loop = asyncio.get_running_loop()

        # Reads come on the loop (gRPC) and on exporters' threads (a Prometheus scrape).
        def wake_stale() -> None:
            with contextlib.suppress(RuntimeError):  # a read after the loop closed
                loop.call_soon_threadsafe(self._wake_stale)

        self.demand.listeners.append(wake_stale)
        self.demand.bind(loop, self.fresh, idle_interval(self.cfg))
        for comp in self.components:
            await comp.start()
        results = await asyncio.gather(*(r.start() for r in self.runners))
        absent = [r.name for r in self.runners if r.absent]
        if absent:
            log.info(
                "not on this host, which is normal: %s (bpfdyno status says what each needs)",
                ", ".join(absent),
            )
        start_t = time.monotonic()  # one start: rounds with the same interval fall due together
        for runner, ok in zip(self.runners, results, strict=True):
            if ok:
                self._tasks.append(asyncio.create_task(runner.run(self._on_round, start_t)))

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        """Cancel the schedules, close collectors (detaching BPF), stop components, flush."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        await asyncio.gather(*(r.close() for r in self.runners))
        for worker in self._workers.values():
            worker.shutdown()
        for comp in reversed(self.components):
            try:
                await comp.stop()
            except Exception:
                log.exception("component %s failed to stop", comp.name)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:
                log.exception("exporter %s failed to close", type(sink).__name__)


def idle_interval(cfg: Config) -> float:
    """Seconds between rounds while nobody reads (``[daemon] idle_interval_s``); 0 (the
    normal cadence always) while an exporter writes every round (JSON lines, OTLP): it reads
    all the time."""
    if cfg.export.jsonl.enabled or cfg.export.otlp.enabled:
        return 0.0
    return cfg.daemon.idle_interval_s


def install_signal_handlers(daemon: Daemon, exit_within_s: float | None = None) -> None:
    """SIGTERM and SIGINT request a graceful stop.

    Args:
        exit_within_s: the process exits this long after the first signal even if the
            graceful stop has not finished (see `exit_deadline`); None: no deadline.
    """
    loop = asyncio.get_running_loop()

    def stop() -> None:
        if exit_within_s is not None and not daemon.stop_requested:
            exit_deadline(exit_within_s)
        daemon.request_stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)


def exit_deadline(seconds: float, status: int = EXIT_STOP_TIMEOUT) -> threading.Thread:
    """End the process ``seconds`` from now unless it has ended by then.

    The graceful stop bounds each of its waits, but a thread can sit in a system call that
    nothing interrupts (``open()`` of a FIFO, a read on a hung NFS or FUSE mount, NVML on a
    lost GPU) and the interpreter's own exit may wait for one; whatever a worker is doing,
    the agent is gone on time. A daemon thread: when the process ends first, so does it.
    """

    def expire() -> None:
        time.sleep(seconds)
        stuck = sorted(t.name for t in threading.enumerate() if t is not threading.main_thread())
        log.error(
            "still stopping %g s after the signal; exiting now (threads: %s)",
            seconds,
            ", ".join(stuck) or "none",
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(status)

    t = threading.Thread(target=expire, name="exit-deadline", daemon=True)
    t.start()
    return t


def notify_systemd(state: str) -> bool:
    """Send an sd_notify message (e.g. "READY=1") if started by systemd with Type=notify.

    Returns whether a message was sent. Implemented directly (a datagram to $NOTIFY_SOCKET)
    so there is no dependency on libsystemd.
    """
    addr = os.environ.get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        try:
            s.sendto(state.encode(), addr)
        except OSError as e:
            log.warning("could not notify systemd at %s: %s", addr, e)
            return False
    return True
