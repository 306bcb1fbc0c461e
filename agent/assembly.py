"""Wiring: which collectors, components and gRPC services a daemon is built from.

This is the one place that knows every part; each part knows only its own inputs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from bpfdyno.collectors.base import Collector
from bpfdyno.config import Config
from bpfdyno.daemon import Component, RoundSink
from bpfdyno.exporters.jsonl import JsonlExporter
from bpfdyno.rpc.server import ServicerFactory

log = logging.getLogger(__name__)


@dataclass
class Assembly:
    collectors: list[Collector] = field(default_factory=list)
    components: list[Component] = field(default_factory=list)
    sinks: list[RoundSink] = field(default_factory=list)
    servicers: list[ServicerFactory] = field(default_factory=list)
    #: Collectors turned off in the config, reported as "disabled" by status.
    disabled: list[str] = field(default_factory=list)


def build(cfg: Config) -> Assembly:
    """Create every enabled part of the daemon from the configuration (nothing is started)."""
    from bpfdyno.collectors.host import HostCollector
    from bpfdyno.collectors.self_stats import SelfCollector

    asm = Assembly()
    candidates: list[tuple[str, type[Collector]]] = [
        ("host", HostCollector),
        ("self", SelfCollector),
    ]
    for name, factory in candidates:
        if cfg.collector_enabled(name):
            asm.collectors.append(factory())
        else:
            asm.disabled.append(name)
    if cfg.export.jsonl.enabled:
        asm.sinks.append(JsonlExporter(cfg.export.jsonl))
    return asm
