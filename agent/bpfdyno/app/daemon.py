"""The daemon: one asyncio loop that owns all state, collectors on their own threads.

Data flows one way: each collector's worker thread returns samples to the loop, which appends
them to the store, hands them to the exporters and publishes the round to stream subscribers.
Collectors run on monotonic deadlines, each on a dedicated single-thread executor so a slow or
hung source (NVML, a BPF map walk) cannot delay another. Errors are isolated per collector:
counted, logged once per distinct error, and followed by an exponential back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from bpfdyno.core.config import Config
from bpfdyno.core.metrics import HistogramSample, Round, Sample
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.core.store import MetricStore, RoundPublisher
from bpfdyno.sources.base import Collector, CollectorUnavailable

log = logging.getLogger(__name__)

#: Longest back-off after repeated failures of one collector.
MAX_BACKOFF_S = 60.0


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


class CollectorRunner:
    """Drives one collector: start, collect on deadlines with back-off, close."""

    def __init__(self, collector: Collector, interval_s: float) -> None:
        self.collector = collector
        self.name = collector.name
        self.interval_s = interval_s
        self.state = PartState.STARTING
        self.reason = ""
        self.collections = 0
        self.errors = 0
        self.consecutive_errors = 0
        self.last_duration_s = 0.0
        self.last_success_ts = 0.0
        self._errors = _ErrorLog()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"collector-{self.name}")
        self._started = False

    def status(self) -> PartStatus:
        return PartStatus(
            name=self.name,
            state=self.state,
            reason=self.reason,
            interval_s=self.interval_s,
            collections=self.collections,
            errors=self.errors,
            last_duration_s=self.last_duration_s,
            last_success_ts=self.last_success_ts,
        )

    async def start(self) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self.collector.start)
        except CollectorUnavailable as e:
            self.state, self.reason = PartState.UNAVAILABLE, str(e)
            log.warning("collector %s unavailable: %s", self.name, e)
            return False
        except Exception as e:  # a bug or an unexpected environment: isolate it
            self.state = PartState.UNAVAILABLE
            self.reason = f"failed to start: {type(e).__name__}: {e}"
            log.exception("collector %s failed to start", self.name)
            return False
        self._started = True
        self.state = PartState.OK
        return True

    async def run(self, on_round: Callable[[Round], None]) -> None:
        """Collect forever on monotonic deadlines; returns only when cancelled."""
        loop = asyncio.get_running_loop()
        deadline = time.monotonic()
        while True:
            delay = deadline - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            t0 = time.monotonic()
            try:
                samples, histograms, health = await loop.run_in_executor(
                    self._executor, self._collect_once
                )
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._failed(e)
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
            self.last_duration_s = time.monotonic() - t0
            step = self.interval_s
            if self.consecutive_errors:
                step = min(MAX_BACKOFF_S, self.interval_s * 2 ** min(self.consecutive_errors, 16))
            deadline += step
            now = time.monotonic()
            if deadline <= now:
                # Missed deadlines (a slow collect, a suspended VM): skip them rather than
                # firing a burst of back-to-back rounds.
                deadline = now + step - math.fmod(now - deadline, step)

    def _collect_once(
        self,
    ) -> tuple[Sequence[Sample], Sequence[HistogramSample], tuple[PartState, str] | None]:
        samples = self.collector.collect()
        return samples, self.collector.histograms(), self.collector.health()

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
            try:
                await loop.run_in_executor(self._executor, self.collector.close)
            except Exception:
                log.exception("collector %s failed to close", self.name)
        if self.state is not PartState.UNAVAILABLE:
            self.state = PartState.STOPPED
        self._executor.shutdown(wait=False, cancel_futures=True)


class Daemon:
    """Owns the store, the collector runners, the components and the sinks."""

    def __init__(
        self,
        cfg: Config,
        collectors: Sequence[Collector],
        components: Sequence[Component] = (),
        sinks: Sequence[RoundSink] = (),
        disabled: Sequence[str] = (),
    ) -> None:
        """Args:
        cfg: the configuration.
        collectors: the enabled collectors.
        components: the other long-running parts (tracing, legacy RPC, ...).
        sinks: the exporters.
        disabled: collectors turned off in the configuration, reported as such by status.
        """
        self.cfg = cfg
        self.store = MetricStore(cfg.daemon.history_s, cfg.daemon.interval_s, cfg.daemon.max_series)
        self.runners = [CollectorRunner(c, cfg.collector_interval(c.name)) for c in collectors]
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

    async def start(self) -> None:
        """Start components, then every collector concurrently; schedule the started ones."""
        for comp in self.components:
            await comp.start()
        results = await asyncio.gather(*(r.start() for r in self.runners))
        for runner, ok in zip(self.runners, results, strict=True):
            if ok:
                self._tasks.append(asyncio.create_task(runner.run(self._on_round)))

    def request_stop(self) -> None:
        self._stop.set()

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


def install_signal_handlers(daemon: Daemon) -> None:
    """SIGTERM and SIGINT request a graceful stop."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)


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
