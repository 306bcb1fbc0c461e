"""The daemon is assembled from the configuration: which parts exist and how they are tied."""

from __future__ import annotations

from bpfdyno.app import assembly
from bpfdyno.core.config import KNOWN_COLLECTORS, load


def test_default_assembly_has_every_collector_and_the_tracing_component() -> None:
    asm = assembly.build(load(None))
    assert [c.name for c in asm.collectors] == list(KNOWN_COLLECTORS)
    assert asm.disabled == []
    assert [c.name for c in asm.components] == ["tracing"]
    assert len(asm.servicers) == 2  # Kernel and Tracing (Agent is always added by the server)
    assert asm.sinks == []


def test_disabled_collectors_are_listed_and_config_reaches_them() -> None:
    cfg = load(
        None,
        [
            ("collectors.gpu.enabled", "false"),
            ("collectors.procs.enabled", "false"),
            ("sched.track_wakeups", "false"),
        ],
    )
    asm = assembly.build(cfg)
    assert asm.disabled == ["gpu", "procs"]
    names = [c.name for c in asm.collectors]
    assert "gpu" not in names and "procs" not in names
    sched = next(c for c in asm.collectors if c.name == "sched")
    programs = [tp for tp, _ in sched._programs]  # type: ignore[attr-defined]
    assert "sched_switch" in programs
    assert not any(tp.startswith("sched_wakeup") for tp in programs)
