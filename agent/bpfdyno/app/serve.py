"""`bpfdyno serve`: assemble the daemon, serve it, stop it gracefully."""

from __future__ import annotations

import logging
import sys
import time

from bpfdyno.app import assembly
from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Daemon, install_signal_handlers, notify_systemd
from bpfdyno.core.config import Config
from bpfdyno.server.grpc_server import AddressInUse, GrpcServer
from bpfdyno.services.agent import AgentService
from bpfdyno.version import __version__

__all__ = ["AddressInUse", "run"]

log = logging.getLogger(__name__)


async def run(cfg: Config) -> int:
    """Run until SIGTERM/SIGINT. Raises AddressInUse before starting anything if needed."""
    t0 = time.monotonic()
    asm = assembly.build(cfg)
    daemon = Daemon(
        cfg, asm.collectors, asm.components, asm.sinks, disabled=asm.disabled, catalog=CATALOG
    )
    server = GrpcServer(cfg.grpc, AgentService(daemon), asm.servicers)
    server.check_addresses()
    install_signal_handlers(daemon)
    await server.start()
    try:
        await daemon.start()
        if "bcc" in sys.modules:
            from bpfdyno.ebpf.compiler import release_compiler_pages

            release_compiler_pages()
        log.info(
            "bpfdyno %s ready in %.2f s (config %s)", __version__, time.monotonic() - t0, cfg.source
        )
        notify_systemd("READY=1")
        await daemon.wait_stopped()
        log.info("stopping")
        notify_systemd("STOPPING=1")
    finally:
        await server.stop()
        await daemon.stop()
    return 0
