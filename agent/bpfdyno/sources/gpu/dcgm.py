"""DCGM as an alternative source of the GPU profiling fields: the ``dcgm`` collector.

dynolog reads its GPU profiling fields (SM active, SM occupancy, tensor active, DRAM active,
FP64/32/16 active, PCIe/NVLink bytes, SM clock, power) from DCGM. bpfdyno reads the same
fields from NVML GPM in the ``gpu`` collector on Hopper-class GPUs; this collector offers
DCGM's values where libdcgm is installed (any DCGM-supported datacenter GPU):

* no libdcgm -> unavailable, with the package to install;
* libdcgm -> a host engine watches dynolog's field set on every supported GPU; each round
  forces an update and reads the latest values per GPU. The engine is a running
  ``nv-hostengine`` (standalone mode: DCGM's own service, shared with dcgm-exporter and
  ``dcgmi``) when ``[gpu] dcgm_host_engine`` names one or, at ``auto``, when one answers on
  its default address; otherwise an engine embedded in the daemon (dcgmStartEmbedded, auto
  mode). Two engines on one GPU would fight over its profiling counters, so a node that runs
  nv-hostengine must be read through it. The series are ``gpu_dcgm_*`` (labels ``gpu``:
  the DCGM GPU id, which is the NVML index), separate from the ``gpu`` collector's names so
  both sources can run side by side without colliding;
* GPUs without DCGM's profiling module: only SM clock and power, the reason in the status;
* a lost host engine -> degraded, re-started (embedded) or re-connected (standalone, never
  replaced by an embedded one) with exponential back-off;
* ``dcgm-pause`` / ``dcgm-resume`` -> dcgmProfPause / dcgmProfResume, with an expiry.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from bpfdyno.core.identity import ROOT_UID, user_name
from bpfdyno.core.metrics import Sample, sample
from bpfdyno.core.pidfs import listening_socket_owners
from bpfdyno.core.status import PartState
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.gpu.dcgm_api import (
    FIRST_PROF_FIELD,
    ST_MODULE_NOT_LOADED,
    ST_NOT_SUPPORTED,
    ST_PROFILING_NOT_SUPPORTED,
    DcgmError,
    DcgmLib,
    DcgmLibraryError,
    Watch,
)
from bpfdyno.sources.gpu.dcgm_metrics import (
    DCGM_FIELDS,
    PROFILING_PAUSED,
)
from bpfdyno.sources.gpu.gpm import ProfilingPause

log = logging.getLogger("bpfdyno.sources.gpu.dcgm")

#: Sonames tried in order (DCGM 4, DCGM 3), then the linker's search.
DCGM_SONAMES = ("libdcgm.so.4", "libdcgm.so.3")

#: How long dcgm-pause / dcgm-resume wait for a round in progress before deferring to the next.
_RPC_LOCK_WAIT_S = 0.05

NOT_FOUND = "libdcgm not found — install datacenter-gpu-manager to use DCGM fields"

#: Where nv-hostengine listens unless told otherwise (its --port 5555, on loopback).
DEFAULT_HOST_ENGINE = "127.0.0.1:5555"
#: How long dcgmConnect_v2 may wait for an nv-hostengine to answer.
CONNECT_TIMEOUT_MS = 2000


@dataclass(frozen=True, slots=True)
class HostEngine:
    """A DCGM host engine: a running nv-hostengine at ``address``, or ("") one embedded here.

    ``found`` marks the address ``auto`` looks at: whatever listens there was not named by
    the operator, so it is used only when root owns the listener (see `untrusted_listener`).
    """

    address: str = ""
    unix_socket: bool = False
    found: bool = False

    @property
    def embedded(self) -> bool:
        return not self.address

    def __str__(self) -> str:
        if self.embedded:
            return "embedded host engine"
        return f"nv-hostengine at {'unix:' if self.unix_socket else ''}{self.address}"


def host_engines(setting: str, auto_address: str = DEFAULT_HOST_ENGINE) -> tuple[HostEngine, ...]:
    """The engines to try, in order, for a ``[gpu] dcgm_host_engine`` setting.

    ``auto``: nv-hostengine at ``auto_address``, else an embedded one; ``embedded``: only an
    embedded one; ``unix:PATH``: only nv-hostengine on that domain socket; anything else
    (``host`` or ``host:port``): only nv-hostengine there.
    """
    if setting == "auto":
        return (HostEngine(auto_address, found=True), HostEngine())
    if setting == "embedded":
        return (HostEngine(),)
    if setting.startswith("unix:"):
        return (HostEngine(setting.removeprefix("unix:"), unix_socket=True),)
    return (HostEngine(setting),)


#: Field ids in a fixed order: the profiling set, then the device fields.
ALL_FIELDS: tuple[int, ...] = tuple(sorted(DCGM_FIELDS, key=lambda f: (f < FIRST_PROF_FIELD, f)))
BASE_FIELDS: tuple[int, ...] = tuple(f for f in ALL_FIELDS if f < FIRST_PROF_FIELD)

#: Watch statuses meaning "no profiling on these GPUs": fall back to the device fields.
_NO_PROFILING = (ST_PROFILING_NOT_SUPPORTED, ST_MODULE_NOT_LOADED, ST_NOT_SUPPORTED)


def untrusted_listener(engine: HostEngine, proc_root: Path = Path("/proc")) -> str:
    """Why the engine ``auto`` found must not be used ("" when it may).

    Anyone may listen on 127.0.0.1:5555 when nv-hostengine does not: a local user's program
    there would be sent every dcgm-pause and resume and could answer with made-up GPU
    metrics. nv-hostengine runs as root (the DCGM service), so ``auto`` uses a listener
    only when root created it; a site running it otherwise names it in ``[gpu]
    dcgm_host_engine`` (then it is the operator's choice).
    """
    if not engine.found or engine.unix_socket:
        return ""
    host, _, port = engine.address.rpartition(":")
    if not host or not port.isdigit():
        return ""
    owners = listening_socket_owners(proc_root, host.strip("[]"), int(port))
    strangers = sorted(u for u in owners if u != ROOT_UID)
    if not strangers:
        return ""
    who = ", ".join(f"uid {u}" + (f" ({user_name(u)})" if user_name(u) else "") for u in strangers)
    return (
        f"not connecting to {engine.address}: it is listened on by {who}, not root (the DCGM "
        "service runs as root; a user's program there would get the dcgm-pause calls and "
        "could report made-up GPU metrics); name the host engine in [gpu] "
        "dcgm_host_engine if this is the site's own"
    )


def find_libdcgm(
    find_library: Callable[[str], str | None] = ctypes.util.find_library,
    sonames: Sequence[str] = DCGM_SONAMES,
) -> str | None:
    """The soname or path of a libdcgm that loads, or None."""
    candidates = [*sonames, find_library("dcgm")]
    for name in candidates:
        if name is None:
            continue
        try:
            ctypes.CDLL(name)
        except OSError:
            continue
        return name
    return None


class DcgmCollector(Collector):
    """dynolog's DCGM field set from a DCGM host engine (nv-hostengine or embedded).

    Args:
        library_path: libdcgm to use; None finds it with ``find``.
        host_engine: the ``[gpu] dcgm_host_engine`` setting (see `host_engines`).
        auto_address: where ``auto`` looks for a running nv-hostengine.
        find: locates libdcgm when no path is given (`find_libdcgm`).
        update_freq_s: how often the host engine samples the fields.
        retry_min_s: first delay before re-starting a lost host engine; doubles per failed
            attempt up to ``retry_max_s``.
        retry_max_s: longest delay between attempts.
        clock: monotonic seconds (injectable for tests).
    """

    name = "dcgm"

    def __init__(
        self,
        library_path: str | None = None,
        *,
        host_engine: str = "auto",
        auto_address: str = DEFAULT_HOST_ENGINE,
        find: Callable[[], str | None] = find_libdcgm,
        update_freq_s: float = 1.0,
        retry_min_s: float = 1.0,
        retry_max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        proc_root: Path = Path("/proc"),
    ) -> None:
        self._library_path = library_path
        self._proc_root = proc_root
        #: Why the listener ``auto`` found was not used ("" when none was refused).
        self.refused_engine = ""
        self._candidates = host_engines(host_engine, auto_address)
        self._engine = self._candidates[0]  # the one in use, chosen by start()
        self._find = find
        self._update_freq_us = max(1, int(update_freq_s * 1e6))
        self._retry_min_s = retry_min_s
        self._retry_max_s = retry_max_s
        self._clock = clock
        self._pause = ProfilingPause(clock)
        # One lock for every DCGM call: RPC threads pause/resume while collect runs.
        self._lock = threading.Lock()
        self._lib: DcgmLib | None = None
        self._watch: Watch | None = None
        self._no_profiling = ""  # why the profiling fields are not watched; "" when they are
        self._lib_paused = False  # dcgmProfPause is in force in the engine
        self._down = ""  # why the host engine is unusable; "" while it works
        self._retry_at: float | None = None
        self._retry_delay = retry_min_s
        #: Host-engine re-starts attempted since start (for status and tests).
        self.restart_attempts = 0

    # ---- lifecycle ----

    def start(self) -> None:
        """Load libdcgm, reach the first host engine that answers and watch the fields.

        Raises:
            CollectorUnavailable: no libdcgm, no host engine starts or answers, or it sees no
                GPU.
        """
        path = self._library_path or self._find()
        if path is None:
            # No libdcgm: the GPU manager is optional, its absence normal.
            raise CollectorUnavailable(NOT_FOUND, absent=True)
        try:
            lib = DcgmLib(path)
        except DcgmLibraryError as e:
            raise CollectorUnavailable(f"{e} — {NOT_FOUND}") from e
        with self._lock:
            self._lib = lib
            for engine in self._candidates:
                self._engine = engine
                untrusted = untrusted_listener(engine, self._proc_root)
                if untrusted:
                    log.warning("dcgm: %s; starting an embedded host engine", untrusted)
                    self.refused_engine = untrusted
                    continue
                try:
                    self._connect()
                    break
                except DcgmError as e:
                    if engine is not self._candidates[-1]:
                        log.info("dcgm: no %s (%s); starting an embedded host engine", engine, e)
                        continue
                    self._lib = None
                    raise CollectorUnavailable(_engine_hint(engine, str(e))) from e
            if self._watch is None:
                self._disconnect()
                self._lib = None
                raise CollectorUnavailable(
                    "DCGM lists no supported GPU — check `dcgmi discovery -l` and `nvidia-smi -L`"
                )
        log.info("dcgm: %s", self.health()[1])

    def close(self) -> None:
        """Stop the embedded host engine (or disconnect from nv-hostengine) and shut DCGM
        down. Idempotent."""
        with self._lock:
            if self._lib is not None:
                self._disconnect()
                self._lib = None

    def _connect(self) -> None:
        """dcgmInit, start or reach the engine, watch the fields (self._watch None: no GPU).

        Raises:
            DcgmError: a call failed; DCGM is shut down again.
        """
        lib, engine = self._lib, self._engine
        assert lib is not None
        lib.init()
        try:
            if engine.embedded:
                handle = lib.start_embedded()
            else:
                handle = lib.connect(
                    engine.address, unix_socket=engine.unix_socket, timeout_ms=CONNECT_TIMEOUT_MS
                )
        except DcgmError:
            _quietly(lib.shutdown)
            raise
        try:
            gpus = lib.supported_gpus(handle)
            if not gpus:
                self._watch = None
                self._release(lib, handle)
                return
            keep_age_s = 2 * self._update_freq_us / 1e6 + 1
            try:
                watch = lib.watch(handle, gpus, ALL_FIELDS, self._update_freq_us, keep_age_s)
                self._no_profiling = ""
            except DcgmError as e:
                if e.status not in _NO_PROFILING:
                    raise
                watch = lib.watch(handle, gpus, BASE_FIELDS, self._update_freq_us, keep_age_s)
                self._no_profiling = lib.error_text(e.status)
                log.warning("dcgm: profiling fields unavailable (%s); SM clock and power only", e)
            self._watch = watch
            self._lib_paused = False
            if self._pause.current() is not None and not self._no_profiling:
                lib.prof_pause(handle)  # a dcgm-pause outlives an engine restart
                self._lib_paused = True
        except DcgmError:
            self._release(lib, handle)
            self._watch = None
            raise

    def _release(self, lib: DcgmLib, handle: int) -> None:
        """Stop our embedded engine, or leave nv-hostengine (it drops our watches); shut down."""
        if self._engine.embedded:
            _quietly(lambda: lib.stop_embedded(handle))
        else:
            _quietly(lambda: lib.disconnect(handle))
        _quietly(lib.shutdown)

    def _disconnect(self) -> None:
        lib, watch = self._lib, self._watch
        self._watch = None
        self._lib_paused = False
        if lib is None:
            return
        if watch is not None:
            self._release(lib, watch.handle)

    # ---- recovery ----

    def _lost(self, why: str) -> None:
        log.warning("dcgm: %s lost (%s); trying again with back-off", self._engine, why)
        self._disconnect()
        self._down = why
        self._retry_at = self._clock() + self._retry_delay

    def _restart(self) -> None:
        self.restart_attempts += 1
        try:
            self._connect()
        except DcgmError as e:
            self._down = str(e)
        else:
            if self._watch is not None:
                log.info("dcgm: %s is back", self._engine)
                self._down = ""
                self._retry_at = None
                self._retry_delay = self._retry_min_s
                return
            self._down = "DCGM lists no supported GPU"
        self._retry_delay = min(self._retry_delay * 2, self._retry_max_s)
        self._retry_at = self._clock() + self._retry_delay

    # ---- collection ----

    def collect(self) -> Sequence[Sample]:
        """One round: dynolog's field set for every GPU; nothing while the engine is lost."""
        with self._lock:
            lib = self._lib
            if lib is None:
                return []
            if self._retry_at is not None and self._clock() >= self._retry_at:
                self._restart()
            watch = self._watch
            if watch is None:
                return []
            try:
                self._sync_pause(lib, watch)
                lib.update_all_fields(watch.handle)
                per_gpu = {gpu: lib.latest_values(watch, gpu) for gpu in watch.gpu_ids}
            except DcgmError as e:
                self._lost(str(e))
                return []
            paused = 1.0 if self._lib_paused else 0.0
        out: list[Sample] = []
        for gpu, values in per_gpu.items():
            labels = {"gpu": str(gpu)}
            for field_id, value in values.items():
                spec, factor = DCGM_FIELDS[field_id]
                # While paused the engine may still hand out the last values: not this round's.
                if paused and field_id >= FIRST_PROF_FIELD:
                    continue
                if not math.isnan(value):
                    out.append(sample(spec, value * factor, labels))
            if not self._no_profiling:
                out.append(sample(PROFILING_PAUSED, paused, labels))
        return out

    def _sync_pause(self, lib: DcgmLib, watch: Watch) -> None:
        """Make the engine's profiling state match the dcgm-pause state (under the lock).

        Also ends an expired pause, and applies a request that arrived while a round held
        the lock.

        Raises:
            DcgmError: the call failed.
        """
        want = self._pause.current() is not None and not self._no_profiling
        if want and not self._lib_paused:
            lib.prof_pause(watch.handle)
            self._lib_paused = True
        elif self._lib_paused and not want:
            lib.prof_resume(watch.handle)
            self._lib_paused = False
            log.info("dcgm: profiling resumed")

    # ---- profiling pause (dcgm-pause / dcgm-resume) ----

    def pause_profiling(self, duration_s: float) -> bool:
        """dcgmProfPause for ``duration_s`` seconds; resumed by the first round after that.

        Thread-safe and quick: when a round holds the engine (dcgmUpdateAllFields waits for
        an update), the request is applied at the start of the next round instead of
        blocking the caller (an RPC on the event loop). Returns whether DCGM accepted or will
        apply it (False without a running host engine or without profiling fields).

        Raises:
            InvalidArgument: ``duration_s`` breaks `bpfdyno.core.rules.pause_duration_s`.
        """
        pause = self._pause.pause(duration_s)
        ok = self._apply_pause("dcgm-pause")
        if ok:
            log.info("dcgm: profiling paused until %s (dcgm-pause)", _iso(pause.until_wall))
        return ok

    def resume_profiling(self) -> bool:
        """dcgmProfResume now (or at the next round, see `pause_profiling`). Thread-safe.

        Returns whether DCGM accepted or will apply it.
        """
        self._pause.resume()
        return self._apply_pause("dcgm-resume")

    def _apply_pause(self, what: str) -> bool:
        if not self._lock.acquire(timeout=_RPC_LOCK_WAIT_S):
            return self._watch is not None and not self._no_profiling  # next round applies it
        try:
            lib, watch = self._lib, self._watch
            if lib is None or watch is None or self._no_profiling:
                return False
            try:
                self._sync_pause(lib, watch)
            except DcgmError as e:
                log.warning("dcgm: %s failed: %s", what, e)
                return False
            return True
        finally:
            self._lock.release()

    def health(self) -> tuple[PartState, str]:
        """(state, one-line reason): DEGRADED while the host engine is lost."""
        if self._lib is None:
            return PartState.STOPPED, "not started"
        if self._down:
            again = "re-start" if self._engine.embedded else "re-connect"
            retry = (
                ""
                if self._retry_at is None
                else f"; {again} in {max(0.0, self._retry_at - self._clock()):.0f} s"
            )
            return PartState.DEGRADED, f"DCGM {self._engine} lost: {self._down}{retry}"
        watch = self._watch
        gpus = len(watch.gpu_ids) if watch else 0
        manual = self._pause.current()
        if self._no_profiling:
            prof = f"unavailable: {self._no_profiling} (SM clock and power only)"
        elif self._lib_paused and manual is not None:
            prof = f"paused (dcgm-pause, until {_iso(manual.until_wall)})"
        else:
            prof = "active"
        refused = f"; {self.refused_engine}" if self.refused_engine else ""
        return PartState.OK, (
            f"{gpus} GPU(s) via DCGM {self._engine} ({self._lib.path}); profiling: {prof}{refused}"
        )


def _quietly(call: Callable[[], None]) -> None:
    """Tear-down calls: a failure there changes nothing (the engine is being dropped)."""
    try:
        call()
    except DcgmError as e:
        log.debug("dcgm: %s", e)


def _engine_hint(engine: HostEngine, error: str) -> str:
    if engine.embedded:
        return (
            f"DCGM host engine did not start ({error}) — check that `nvidia-smi` works and "
            "that the DCGM version matches the driver; disable with [collectors.dcgm] "
            "enabled = false"
        )
    return (
        f"cannot reach the DCGM {engine} ({error}) — start it (`systemctl start "
        'nvidia-dcgm`), fix [gpu] dcgm_host_engine, or set it to "embedded"'
    )


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "DCGM_FIELDS",
    "DCGM_SONAMES",
    "DEFAULT_HOST_ENGINE",
    "DcgmCollector",
    "HostEngine",
    "find_libdcgm",
    "host_engines",
]
