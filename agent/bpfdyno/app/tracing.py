"""`TracingComponent`: the on-demand tracing part of the daemon, started and stopped as one.

It owns the Kineto IPC endpoint, the legacy dyno RPC server and two small timers (the
registry sweep, and file checks that run only while a trace is open), all on the daemon's
event loop; and, when it is given a `CaptureManager`, the kernel tracks of traced processes
(`bpfdyno.tracing.kernel_tracks`). A part that cannot start (the @dynolog@ name taken, port
1778 in use) is reported "unavailable" with the reason and a fix; the daemon keeps running.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable

from bpfdyno.analysis.tracefile import ReadLimits
from bpfdyno.core.config import Config
from bpfdyno.core.events import FlightRecorder
from bpfdyno.core.status import PartState, PartStatus
from bpfdyno.core.workers import DaemonExecutor
from bpfdyno.ebpf.errors import BpfLoadError
from bpfdyno.server.legacy_rpc import LegacyRpcHandler, LegacyRpcServer
from bpfdyno.services.tracing import DcgmPause, DcgmResume, TracingService
from bpfdyno.tracing.audit import AuditLog
from bpfdyno.tracing.capture.manager import CaptureManager
from bpfdyno.tracing.capture.records import NO_TRACKS, KernelTrackRequest, Track
from bpfdyno.tracing.ipc.endpoint import QUEUE_LEN, EndpointUnavailable, KinetoEndpoint
from bpfdyno.tracing.ipc.guard import KernelGuard
from bpfdyno.tracing.ipc.pod_dirs import SCAN_INTERVAL_S, PodSocketDirs
from bpfdyno.tracing.ipc.user_dirs import UserSocketDirs, private_dir_access
from bpfdyno.tracing.kernel_tracks import KernelTracks
from bpfdyno.tracing.name_holder import agent_uids, name_holders, taken_reason
from bpfdyno.tracing.policy import TraceLimits
from bpfdyno.tracing.trainers import TrainerRegistry
from bpfdyno.version import __version__

log = logging.getLogger(__name__)

#: How often silent trainers are looked for.
SWEEP_INTERVAL_S = 5.0
#: Longest wait for one part (the capture) to stop at shutdown.
STOP_TIMEOUT_S = 2.0
#: The interpreter's thread switch interval while the component runs. A Kineto client waits
#: only ~80 ms for a reply, and a collector thread running pure-Python code holds the GIL
#: for up to the switch interval (CPython's default: 5 ms) before the event loop gets it;
#: 1 ms keeps replies within about a millisecond (see docs/performance.md).
IPC_SWITCH_INTERVAL_S = 0.001


def default_tracks(cfg: Config) -> KernelTrackRequest:
    """The kernel tracks of requests that name none: ``[capture] default_tracks``."""
    return KernelTrackRequest(
        frozenset(Track(name) for name in cfg.capture.default_tracks),
        cfg.capture.pre_window_s,
    )


def allowed_dirs(cfg: Config) -> list[str]:
    """Where trace files may go: ``[tracing] allowed_dirs`` plus ``trace_dir``."""
    dirs = list(cfg.tracing.allowed_dirs)
    if cfg.tracing.trace_dir and cfg.tracing.trace_dir not in dirs:
        dirs.append(cfg.tracing.trace_dir)
    return dirs


async def _bounded(
    fn: Callable[[], None], what: str, harmless: Callable[[], str | None] = lambda: None
) -> None:
    """Run ``fn`` on a daemon thread; wait at most `STOP_TIMEOUT_S` for it.

    ``harmless`` says why not waiting loses nothing, when that is so (then the overrun is
    an information, not an error)."""
    done = asyncio.wrap_future(DaemonExecutor(f"stop-{what}").submit(fn))
    try:
        await asyncio.wait_for(done, STOP_TIMEOUT_S)
    except TimeoutError:
        reason = harmless()
        if reason is not None:
            log.info("%s %s; stopping without waiting for it", what, reason)
        else:
            log.error("%s did not stop within %g s; stopping without it", what, STOP_TIMEOUT_S)


class TracingComponent:
    """The tracing component the daemon drives.

    Args:
        cfg: the daemon configuration (``[kineto]``, ``[tracing]``, ``[legacy_rpc]``).
        dcgm_pause: the GPU monitor's ``pause(duration_s) -> bool``, if there is one.
        dcgm_resume: the GPU monitor's ``resume() -> bool``.
        version: reported to ``dyno version``.
        tune_switch_interval: lower ``sys.setswitchinterval`` to `IPC_SWITCH_INTERVAL_S`
            while running (restored on stop), so threads holding the GIL delay replies less.
        queue_len: datagrams the kernel may queue on the IPC socket (0: kernel default).
        capture: records the kernel tracks of traced processes (None: traces get none).
        recorder: the flight recorder, for the kernel tracks' pre-window.

    Attributes:
        service: the `TracingService` for the gRPC servicer and the CLI.
    """

    name = "tracing"

    def __init__(
        self,
        cfg: Config,
        dcgm_pause: DcgmPause | None = None,
        dcgm_resume: DcgmResume | None = None,
        version: str = __version__,
        tune_switch_interval: bool = True,
        queue_len: int = QUEUE_LEN,
        capture: CaptureManager | None = None,
        recorder: FlightRecorder | None = None,
    ) -> None:
        self._cfg = cfg
        self._tune_switch_interval = tune_switch_interval
        self._saved_switch_interval: float | None = None
        registry = TrainerRegistry(
            cfg.kineto.registry_max_entries,
            cfg.kineto.expire_after_s,
            cfg.kineto.max_trainers_per_uid,
        )
        self.service = TracingService(
            allowed_dirs=allowed_dirs(cfg),
            default_timeout_s=cfg.tracing.default_timeout_s,
            registry=registry,
            trace_dir=cfg.tracing.trace_dir,
            user_dirs=cfg.tracing.user_dirs,
            allow_home=cfg.tracing.allow_home,
            dcgm_pause=dcgm_pause,
            dcgm_resume=dcgm_resume,
            version=version,
            default_tracks=default_tracks(cfg) if capture is not None else NO_TRACKS,
            limits=TraceLimits.from_config(cfg.tracing),
            audit=AuditLog(cfg.tracing.audit_records, cfg.tracing.audit_file),
            read_limits=ReadLimits.from_config(cfg.tracing),
        )
        self.capture = capture
        self.kernel_tracks: KernelTracks | None = None
        if capture is not None:
            self.kernel_tracks = KernelTracks(
                capture,
                self.service.tracker,
                recorder,
                ReadLimits.from_config(cfg.tracing),
                self.service.user_files,
            )
        self.endpoint = KinetoEndpoint(self.service, cfg.kineto.socket_dir, queue_len=queue_len)
        #: The per-user socket directories, when configured (`bpfdyno.tracing.ipc.user_dirs`).
        self.user_dirs = (
            UserSocketDirs(cfg.kineto.user_socket_root, self.service)
            if cfg.kineto.user_socket_root
            else None
        )
        self._user_dirs_error = ""
        #: The per-pod socket directories, when configured (`bpfdyno.tracing.ipc.pod_dirs`).
        self.pod_dirs = (
            PodSocketDirs(cfg.kineto.pod_socket_root, self.service)
            if cfg.kineto.pod_socket_root
            else None
        )
        self._pod_dirs_error = ""
        #: The kernel guard of trainers' abstract sockets (`bpfdyno.tracing.ipc.guard`).
        self.guard = KernelGuard() if cfg.kineto.kernel_guard else None
        self._guard_error = ""
        self.legacy: LegacyRpcServer | None = None
        if cfg.legacy_rpc.enabled:
            self.legacy = LegacyRpcServer(
                LegacyRpcHandler(self.service),
                cfg.legacy_rpc.listen,
                cfg.legacy_rpc.timeout_s,
                cfg.legacy_rpc.max_connections,
                cfg.legacy_rpc.max_connections_per_peer,
                cfg.legacy_rpc.idle_timeout_s,
            )
        self._ipc_error = ""
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False

    async def start(self) -> None:
        """Open the IPC endpoint and the legacy RPC; never raises for a missing capability."""
        loop = asyncio.get_running_loop()
        if self.capture is not None and self.kernel_tracks is not None:
            self.capture.start()  # loads the capture programs on its own thread
            self.service.tracker.set_listener(self.kernel_tracks)
        await self._open_endpoint(loop)
        if self.guard is not None:
            try:
                self.guard.load()
                self.service.guard = self.guard
                self._guard_error = ""
            except BpfLoadError as e:
                self._guard_error = str(e)
                log.warning("Kineto guard unavailable: %s", e)
        if self.user_dirs is not None:
            try:
                self.user_dirs.open(loop)
                self._user_dirs_error = ""
            except EndpointUnavailable as e:
                self._user_dirs_error = str(e)
                log.warning("per-user Kineto socket directories unavailable: %s", e)
        if self.pod_dirs is not None:
            try:
                self.pod_dirs.open(loop)
                self._pod_dirs_error = ""
            except EndpointUnavailable as e:
                self._pod_dirs_error = str(e)
                log.warning("per-pod Kineto socket directories unavailable: %s", e)
        if self.legacy is not None:
            await self.legacy.start()
        if self._tune_switch_interval and sys.getswitchinterval() > IPC_SWITCH_INTERVAL_S:
            self._saved_switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(IPC_SWITCH_INTERVAL_S)
        self._tasks = [
            asyncio.create_task(self._sweep(), name="tracing-sweep"),
            asyncio.create_task(self.service.tracker.run_file_checks(), name="tracing-files"),
        ]
        if self.pod_dirs is not None and self.pod_dirs.is_open:
            self._tasks.append(asyncio.create_task(self._scan_pods(), name="kineto-pod-dirs"))
        self._started = True

    async def stop(self) -> None:
        """Close everything start() opened."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self.kernel_tracks is not None:
            await self.kernel_tracks.stop()
        self.service.user_files.stop()  # summaries still reading are not waited for
        if self.capture is not None:
            capture = self.capture
            await _bounded(
                capture.stop,
                "the kernel-track capture",
                # Its thread compiles the programs (seconds on a loaded machine) before it
                # takes any trace: nothing is being recorded, and the kernel unloads whatever
                # was loaded when the agent exits.
                lambda: None if capture.wait_loaded(0) else "was still compiling its programs",
            )
        self.endpoint.close()
        if self.user_dirs is not None:
            self.user_dirs.close()
        if self.pod_dirs is not None:
            self.pod_dirs.close()
        if self.guard is not None:
            self.service.guard = None
            self.guard.close()
        if self.legacy is not None:
            await self.legacy.stop()
        if self._saved_switch_interval is not None:
            if sys.getswitchinterval() == IPC_SWITCH_INTERVAL_S:  # nobody changed it since
                sys.setswitchinterval(self._saved_switch_interval)
            self._saved_switch_interval = None
        self._started = False

    async def _open_endpoint(self, loop: asyncio.AbstractEventLoop) -> None:
        """Open the Kineto endpoint; when the abstract name is taken, say who holds it (a
        user holding it is reported as an attack: `bpfdyno.tracing.name_holder`)."""
        try:
            self.endpoint.open(loop)
            self._ipc_error = ""
        except EndpointUnavailable as e:
            error = str(e)
            if not self.endpoint.socket_dir:
                holders = await asyncio.to_thread(name_holders)
                if holders or "already bound" in error:
                    error = taken_reason(holders, agent_uids())
            if error != self._ipc_error:
                log.warning("Kineto IPC endpoint unavailable: %s", error)
            self._ipc_error = error
        self.service.unavailable_reason = (
            f"the Kineto IPC endpoint is not running: {self._ipc_error}" if self._ipc_error else ""
        )

    async def _scan_pods(self) -> None:
        """Serve pods' directories as the kubelet makes them; close those that went."""
        assert self.pod_dirs is not None
        while True:
            try:
                self.pod_dirs.scan()
            except Exception:
                log.exception("scanning the pod socket directories failed; trying again later")
            await asyncio.sleep(SCAN_INTERVAL_S)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            if self._ipc_error and not self.endpoint.socket_dir:
                # The abstract name was taken: take it as soon as it is free again (and
                # keep naming whoever holds it meanwhile).
                try:
                    await self._open_endpoint(asyncio.get_running_loop())
                except Exception:
                    log.exception("retrying the Kineto endpoint failed; trying again later")
            try:
                for address in self.service.sweep():
                    if self.user_dirs is not None and self.user_dirs.forget_client(address):
                        continue
                    if self.pod_dirs is not None and self.pod_dirs.forget_client(address):
                        continue
                    self.endpoint.forget_client(address)
            except Exception:
                log.exception("tracing registry sweep failed; continuing")

    def _identity_notes(self) -> str:
        """What the identity rules turned away, when they did: polls claiming another
        process's pid, and trainers over their uid's registry quota."""
        notes = ""
        claims = self.service.false_claims
        if claims:
            uids = ", ".join(str(u) for u in sorted(claims)[:5])
            notes += (
                f", {sum(claims.values())} polls claiming another process's pid ignored "
                f"(uid {uids})"
            )
        unresolved = self.service.unresolved
        if unresolved:
            uids = ", ".join(str(u) for u in sorted(unresolved)[:5])
            notes += (
                f", {sum(unresolved.values())} polls whose sender /proc does not show ignored "
                f"(uid {uids})"
            )
        stats = self.service.registry.stats
        if stats.refused_uid_quota:
            notes += (
                f", {stats.refused_uid_quota} polls of users over [kineto] "
                f"max_trainers_per_uid ({self.service.registry.max_per_uid}) not registered"
            )
        if stats.displaced:
            notes += (
                f", {stats.displaced} trainers of the users holding the most gave their place "
                "to other users' (registry full)"
            )
        return notes

    def _open_layout_note(self) -> str:
        """Which protection the trainers have, and how many still poll in the open layout
        (anyone on the node can configure those, bypassing the agent)."""
        trainers = self.service.registry.trainers()
        dirs = self.user_dirs
        guard = self.guard if self.guard is not None and self.guard.active else None
        protections = []
        if guard is not None:
            protections.append(f"kernel guard ({guard.guarded} abstract sockets)")
        elif self._guard_error:
            protections.append(f"no kernel guard ({self._guard_error})")
        if dirs is not None:
            protections.append("per-user directories")
        pods = self.pod_dirs
        if pods is not None:
            protections.append("per-pod directories")
        # Open: a shared directory's socket, or an abstract name without the guard.
        open_ = [
            t
            for t in trainers
            if not (dirs is not None and dirs.serves(t.address))
            and not (pods is not None and pods.serves(t.address))
            and not (guard is not None and t.address.startswith(b"\0"))
        ]
        protection = "protection: " + (", ".join(protections) or "none")
        if not open_:
            return f"; {protection}"
        return (
            f"; {protection}; {len(open_)} trainers use the open layout (any local user can "
            "configure them without the agent; start them with `bpfdyno run`)"
        )

    def _layout_status(self) -> PartStatus:
        assert self.user_dirs is not None
        if self._user_dirs_error:
            return PartStatus("kineto_dirs", PartState.UNAVAILABLE, self._user_dirs_error)
        if not self.user_dirs.is_open:
            return PartStatus("kineto_dirs", PartState.STOPPED, "not started")
        t = self.user_dirs.totals()
        return PartStatus(
            "kineto_dirs",
            PartState.OK,
            f"{self.user_dirs.root}/<uid> ({private_dir_access()[1]:04o} each): {t.users} "
            f"users; {t.received} "
            f"datagrams, {t.replied} replies, {t.dropped} dropped",
            last_success_ts=time.time(),
        )

    def _pod_layout_status(self) -> PartStatus:
        assert self.pod_dirs is not None
        if self._pod_dirs_error:
            return PartStatus("kineto_pod_dirs", PartState.UNAVAILABLE, self._pod_dirs_error)
        if not self.pod_dirs.is_open:
            return PartStatus("kineto_pod_dirs", PartState.STOPPED, "not started")
        t = self.pod_dirs.totals()
        refused = self.pod_dirs.refused
        note = ""
        if refused:
            name, why = sorted(refused.items())[0]
            note = f"; {len(refused)} not served ({name}: {why})"
        return PartStatus(
            "kineto_pod_dirs",
            PartState.OK,
            f"{self.pod_dirs.root}/<pod> (one per trainer pod, the root 0700): {t.users} pods; "
            f"{t.received} datagrams, {t.replied} replies, {t.dropped} dropped{note}",
            last_success_ts=time.time(),
        )

    def tracing_pids(self) -> set[int]:
        """Pids whose profiler is tracing now (for the GPU collector to pause GPM)."""
        return self.service.tracing_pids()

    def statuses(self) -> list[PartStatus]:
        """The IPC endpoint's and the legacy RPC's state, with reasons (the daemon's Component
        protocol)."""
        if self.endpoint.is_open:
            n = len(self.service.registry)
            ipc = PartStatus(
                "kineto_ipc",
                PartState.OK,
                f"{self.endpoint.address} (queue {self.endpoint.queue_len}): {n} trainers; "
                f"{self.endpoint.stats.summary()}{self._identity_notes()}"
                f"{self._open_layout_note()}",
                last_success_ts=time.time(),
            )
        elif self._ipc_error:
            ipc = PartStatus("kineto_ipc", PartState.UNAVAILABLE, self._ipc_error)
        else:
            ipc = PartStatus("kineto_ipc", PartState.STOPPED, "not started")
        parts = [ipc]
        if self.user_dirs is not None:
            parts.append(self._layout_status())
        if self.pod_dirs is not None:
            parts.append(self._pod_layout_status())
        if self.legacy is None:
            legacy = PartStatus("legacy_rpc", PartState.DISABLED, "[legacy_rpc] enabled = false")
        elif not self._started:
            legacy = PartStatus("legacy_rpc", PartState.STOPPED, "not started")
        else:
            legacy = self.legacy.status()
        parts.append(legacy)
        if self.capture is not None:
            parts.append(self.capture.status())
        return parts
