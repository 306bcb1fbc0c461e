"""The daemon is assembled from the configuration: which parts exist and how they are tied."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from bpfdyno.app import assembly
from bpfdyno.core.config import KNOWN_COLLECTORS, Config, load
from bpfdyno.ebpf.introspect import LoadedMap, loaded_maps, loaded_programs
from bpfdyno.ebpf.program import BpfProgram


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


# --- the BPF programs of the assembled collectors ------------------------------------------


def _collector(cfg: Config, name: str) -> Any:
    return next(c for c in assembly.build(cfg).collectors if c.name == name)


def _kernel_maps(program: BpfProgram) -> dict[str, LoadedMap]:
    """Every map of ``program`` as the kernel lists it, by the name the C code gives it."""
    kernel = {m.id: m for m in loaded_maps(prefix="")}
    return {name: kernel[i] for name, i in program.map_ids().items()}


@contextlib.contextmanager
def started(cfg: Config, name: str) -> Iterator[Any]:
    """The ``name`` collector of the daemon built from ``cfg``, started."""
    collector = _collector(cfg, name)
    collector.start()
    try:
        yield collector
    finally:
        collector.close()


@pytest.mark.root
@pytest.mark.parametrize(("name", "overrides"), [("sched", []), ("net", [])])
def test_every_map_of_the_sched_and_net_programs_carries_the_prefix(
    name: str, overrides: list[tuple[str, str]]
) -> None:
    with started(load(None, overrides), name) as collector:
        program = collector._require()
        maps = _kernel_maps(program)
        prog_ids = set(program.program_ids().values())
        used = {i for p in loaded_programs(prefix="") if p.id in prog_ids for i in p.map_ids}
    assert used <= {m.id for m in maps.values()}, "a program uses a map bcc did not list"
    assert all(m.name.startswith("bpfdyno_") for m in maps.values()), maps
    # The kernel kept every name whole (15 characters at most), so they are unique there too.
    assert [m.name for m in maps.values()] == list(maps)
    if overrides:
        assert "bpfdyno_nrflags" in maps
