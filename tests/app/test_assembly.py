"""The daemon is assembled from the configuration: which parts exist and how they are tied."""

from __future__ import annotations

import contextlib
import math
import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from bpfdyno.app import assembly
from bpfdyno.core.config import KNOWN_COLLECTORS, Config, NetSection, SchedSection, load
from bpfdyno.ebpf.introspect import LoadedMap, loaded_maps, loaded_programs
from bpfdyno.ebpf.program import BpfProgram
from bpfdyno.sources.gpu.dcgm import HostEngine


def test_default_assembly_has_every_collector_and_the_tracing_component() -> None:
    asm = assembly.build(load(None))
    # The overhead budget is a collector too (it reports costs every round), always there.
    assert [c.name for c in asm.collectors] == [*KNOWN_COLLECTORS, "budget"]
    assert asm.budget is asm.collectors[-1]
    assert asm.disabled == []
    # The detection's peers are found from the job (SLURM) unless configured by hand.
    assert [c.name for c in asm.components] == ["tracing", "detection_peers"]
    assert len(asm.servicers) == 5  # Kernel, Tracing, Audit, Kineto, Detection (+ Agent)
    assert asm.sinks == []
    # perf_sw counts context switches with the sched programs' counters, not its own.
    by_name: dict[str, Any] = {c.name: c for c in asm.collectors}
    assert by_name["perf_sw"]._switch_counts == by_name["sched"].cpu_switch_counts
    no_sched = assembly.build(load(None, [("collectors.sched.enabled", "false")]))
    assert next(c for c in no_sched.collectors if c.name == "perf_sw")._switch_counts is None  # type: ignore[attr-defined]


def test_disabled_collectors_are_listed_and_config_reaches_them() -> None:
    cfg = load(
        None,
        [
            ("collectors.gpu.enabled", "false"),
            ("collectors.procs.enabled", "false"),
            ("sched.max_exits", "123"),
        ],
    )
    asm = assembly.build(cfg)
    assert asm.disabled == ["gpu", "procs"]
    names = [c.name for c in asm.collectors]
    assert "gpu" not in names and "procs" not in names
    sched = next(c for c in asm.collectors if c.name == "sched")
    # 123 records of 80 bytes: three pages, a power of two of them
    assert sched._defines["SCHED_EXIT_PAGES"] == 4  # type: ignore[attr-defined]


def test_the_kubelet_and_dcgm_settings_reach_their_collectors() -> None:
    cfg = load(
        None,
        [
            ("kubelet.pod_resources_socket", '"/run/kubelet/pod-resources/kubelet.sock"'),
            ("gpu.dcgm_host_engine", '"unix:/run/nv-hostengine"'),
        ],
    )
    by_name: dict[str, Any] = {c.name: c for c in assembly.build(cfg).collectors}
    assert by_name["kubelet"].socket_path == "/run/kubelet/pod-resources/kubelet.sock"
    assert by_name["dcgm"]._candidates == (HostEngine("/run/nv-hostengine", unix_socket=True),)
    # The GPU series are attributed with the kubelet collector's latest lookup.
    assert by_name["gpu"]._device_owners() is by_name["kubelet"].owners
    assert cfg.collectors["kubelet"].interval_s == 10.0


# --- the [sched] and [net] settings reach the kernel -------------------------------------

PAGE = os.sysconf("SC_PAGE_SIZE")


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
@pytest.mark.parametrize(
    ("name", "overrides"),
    [("sched", []), ("net", []), ("net", [("net.byte_source", "syscalls")])],
)
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


@pytest.mark.root
def test_sched_sizes_from_the_config_reach_the_kernel() -> None:
    with started(load(None), "sched") as collector:
        defaults = _kernel_maps(collector._require())
    # The exited threads' ring buffer: max_exits records of 80 bytes, in a power of two of
    # pages (65,536 records: 2,048 pages).
    assert defaults["bpfdyno_sexit"].max_entries == 2048 * PAGE
    assert defaults["bpfdyno_sevents"].max_entries == SchedSection.ringbuf_pages * PAGE
    cfg = load(None, [("sched.max_exits", "300"), ("sched.ringbuf_pages", "4")])
    with started(cfg, "sched") as collector:
        maps = _kernel_maps(collector._require())
    assert maps["bpfdyno_sexit"].max_entries == 8 * PAGE  # 300 records: 5.9 pages
    assert maps["bpfdyno_sevents"].max_entries == 4 * PAGE


@pytest.mark.root
def test_net_sizes_from_the_config_reach_the_kernel() -> None:
    with started(load(None), "net") as collector:
        defaults = _kernel_maps(collector._require())
    assert defaults["bpfdyno_nsocks"].max_entries == NetSection.max_socks
    assert defaults["bpfdyno_nprocs"].max_entries == NetSection.max_procs
    assert defaults["bpfdyno_nevents"].max_entries == NetSection.ringbuf_pages * PAGE
    cfg = load(
        None, [("net.max_socks", "1000"), ("net.max_procs", "300"), ("net.ringbuf_pages", "2")]
    )
    with started(cfg, "net") as collector:
        maps = _kernel_maps(collector._require())
    assert maps["bpfdyno_nsocks"].max_entries == 1000
    assert maps["bpfdyno_nprocs"].max_entries == 300
    assert maps["bpfdyno_nevents"].max_entries == 2 * PAGE


@contextlib.contextmanager
def _loopback_exchange() -> Iterator[int]:
    """An open TCP connection on 127.0.0.1 that carried a few segments each way; yields its
    client port."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        server, _ = listener.accept()
        with client, server:
            for _ in range(5):
                client.sendall(b"x" * 1000)
                assert len(server.recv(4096)) > 0
                server.sendall(b"y" * 1000)
                assert len(client.recv(4096)) > 0
            yield int(client.getsockname()[1])


@pytest.mark.root
@pytest.mark.parametrize("every", [1, 2**32 - 1])
def test_net_probe_sampling_from_the_config_reaches_the_kernel(every: int) -> None:
    with started(load(None, [("net.probe_sample_every", str(every))]), "net") as collector:
        with _loopback_exchange() as port:
            collector.collect()
        sampled = collector.counter("NET_C_PROBE_SAMPLES")
        ours = [c for c in collector.connections() if port in (c.sport, c.dport)]
    assert len(ours) == 2, ours  # both ends are tracked
    if every == 1:  # every received segment is sampled: both ends have an RTT
        assert sampled > 0
        assert all(c.srtt_s > 0 for c in ours), ours
    else:  # no CPU sees 2**32 - 1 segments during the test: nothing is sampled
        assert sampled == 0
        assert all(math.isnan(c.srtt_s) for c in ours)
