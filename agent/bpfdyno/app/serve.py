"""`bpfdyno serve`: assemble the daemon, serve it, stop it gracefully."""

from __future__ import annotations

import asyncio
import ctypes
import grp
import logging
import os
import time

from bpfdyno.app import assembly
from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon, install_signal_handlers, notify_systemd
from bpfdyno.core.config import DEFAULT_SOCKET, Config, ConfigError
from bpfdyno.core.connections import ConnectionLimits
from bpfdyno.server.grpc_server import AddressInUse, GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.version import __version__

__all__ = ["AddressInUse", "run"]

log = logging.getLogger(__name__)

#: The agent is gone this long after SIGTERM whatever its workers are doing (systemd's
#: TimeoutStopSec and most supervisors allow far more; `bpfdyno run` waits 30 s).
EXIT_WITHIN_S = 4.5
#: The graceful stop's own bound (the exit deadline is the backstop).
STOP_TIMEOUT_S = 4.0


#: glibc's mallopt parameter M_ARENA_MAX.
_M_ARENA_MAX = -8
#: Malloc arenas the daemon's threads share.
MALLOC_ARENAS = 2


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Let every thread share ``arenas`` malloc arenas (glibc makes up to 8 per core).

    Each thread that allocates gets an arena of its own by default, and what it freed
    stays in it: the threads that compiled BPF programs kept tens of MB each in an idle
    daemon. Call before the daemon starts its threads. Returns whether the C library took it
    (a libc without mallopt, such as musl, keeps its own policy).
    """
    try:
        return bool(ctypes.CDLL(None).mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False


def check_socket_group(cfg: Config) -> None:
    """Refuse ``[grpc] socket_group`` naming the agent's own group.

    The agent's group may own what the agent writes (its caches under a umask such as the
    unit's 0007): a user let into it for the socket could change the agent's files, the
    BPF headers it compiles included. Socket access gets a group of its own
    (``bpfdyno-users`` in the package).

    Raises:
        ConfigError: it does.
    """
    name = cfg.grpc.socket_group
    if not name:
        return
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        return  # the server says it does not exist
    if gid == os.getegid() and gid != 0:
        raise ConfigError(
            f"names the agent's own group ({name}): its members could change the agent's "
            "files, not only use the socket; give socket access a group of its own (the "
            'package makes "bpfdyno-users": socket_group = "bpfdyno-users")',
            "'grpc.socket_group'",
        )


async def run(cfg: Config) -> int:
    """Run until SIGTERM/SIGINT. Raises AddressInUse before starting anything if needed.

    Raises:
        ConfigError: see `check_socket_group`.
    """
    check_socket_group(cfg)
    t0 = time.monotonic()
    limit_malloc_arenas()
    asm = assembly.build(cfg)
    daemon = Daemon(
        cfg,
        asm.collectors,
        asm.components,
        asm.sinks,
        disabled=asm.disabled,
        catalog=CATALOG,
        demand=asm.demand,
        steady=asm.steady,
    )
    assembly.bind_daemon(asm, daemon)
    streams = ConnectionLimits(cfg.grpc.max_streams, cfg.grpc.max_streams_per_user)
    server = GrpcServer(cfg.grpc, AgentService(daemon, streams=streams), asm.servicers)
    server.check_addresses()
    install_signal_handlers(daemon, EXIT_WITHIN_S)
    await server.start()
    try:
        await daemon.start()
        log.info(
            "bpfdyno %s ready in %.2f s (config %s)", __version__, time.monotonic() - t0, cfg.source
        )
        for line in next_steps(cfg):
            log.info("%s", line)
        notify_systemd("READY=1")
        await daemon.wait_stopped()
        log.info("stopping")
        notify_systemd("STOPPING=1")
    finally:
        try:
            await asyncio.wait_for(_stop(server, daemon), STOP_TIMEOUT_S)
        except TimeoutError:
            log.error("stopping took longer than %g s; exiting without the rest", STOP_TIMEOUT_S)
    return 0


def next_steps(cfg: Config) -> list[str]:
    """What to do once the agent is ready: where its API is, and three commands to try (with
    ``--socket`` when it is not where clients look by default)."""
    where = f"unix:{cfg.grpc.socket}" + (f" and {cfg.grpc.tcp} (TLS)" if cfg.grpc.tcp else "")
    who = "every local user, each as itself" if cfg.grpc.socket_mode & 0o006 else "root"
    if not cfg.grpc.socket_mode & 0o006 and cfg.grpc.socket_group:
        who += f" and the group {cfg.grpc.socket_group}"
    target = "" if cfg.grpc.socket == DEFAULT_SOCKET else f" --socket {cfg.grpc.socket}"
    return [
        f"API on {where} ({who})",
        f"next: bpfdyno status{target}  |  bpfdyno top{target}  |  bpfdyno gputrace{target} "
        "--pids PID --iterations 5 --wait (PyTorch started with KINETO_USE_DAEMON=1)",
    ]


async def _stop(server: GrpcServer, daemon: Daemon) -> None:
    await server.stop()
    await daemon.stop()
