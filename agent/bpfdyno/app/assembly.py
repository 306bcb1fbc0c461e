"""Wiring: which collectors, components and gRPC services a daemon is built from.

This is the one place that knows every part; each part knows only its own inputs. Nothing
is started here: collectors start on their own worker threads (BPF compiles, NVML init) once
the daemon runs, so a missing capability only disables that collector.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Protocol

from bpfdyno.app.catalog import CATALOG
from bpfdyno.app.daemon import Component, RoundSink
from bpfdyno.core.budget import REQUESTED
from bpfdyno.core.config import Config
from bpfdyno.core.demand import ReadDemand
from bpfdyno.core.events import FewerEvents, FlightRecorder
from bpfdyno.exporters.jsonl import JsonlExporter
from bpfdyno.exporters.rounds import SampleProvider
from bpfdyno.server.grpc_server import ServicerFactory
from bpfdyno.sources.base import Collector

if TYPE_CHECKING:
    from bpfdyno.app.daemon import Daemon
    from bpfdyno.detection.collector import DetectionCollector
    from bpfdyno.rpc.detection import RankSignal
    from bpfdyno.sources.budget.controller import BudgetCollector
    from bpfdyno.sources.procs.table import ProcessTable

log = logging.getLogger(__name__)


@dataclass
class Assembly:
    collectors: list[Collector] = field(default_factory=list)
    components: list[Component] = field(default_factory=list)
    sinks: list[RoundSink] = field(default_factory=list)
    servicers: list[ServicerFactory] = field(default_factory=list)
    #: Collectors turned off in the config, reported as "disabled" by status.
    disabled: list[str] = field(default_factory=list)
    #: The overhead budget (also among the collectors); `bind_daemon` gives it the daemon's
    #: own steps.
    budget: BudgetCollector | None = None
    #: Who reads (the services and the Prometheus exporter note each read; the daemon's
    #: cadence follows it).
    demand: ReadDemand = field(default_factory=ReadDemand)
    #: Collectors that keep their cadence while nobody reads: the budget measures the
    #: agent, detection watches ranks whoever reads. (The NCCL profiler reader, whose times
    #: detection reads, keeps it while a trainer's plugin file is read: its
    #: `longest_interval_s`.)
    steady: frozenset[str] = frozenset({"budget", "detection"})


class ProfilingSource(Protocol):
    """A collector whose profiling metrics dcgm-pause / dcgm-resume act on."""

    def pause_profiling(self, duration_s: float) -> bool: ...

    def resume_profiling(self) -> bool: ...


def profiling_controls(
    sources: Sequence[ProfilingSource],
) -> tuple[Callable[[float], bool] | None, Callable[[], bool] | None]:
    """dcgm-pause / dcgm-resume acting on every profiling source (NVML GPM and DCGM).

    Each returns True if any source accepted; every source is asked even after one
    accepted. (None, None) without a source, so dcgm-pause answers "no GPU monitor".
    An invalid duration raises ValueError from the first source, before any is paused.
    """
    if not sources:
        return None, None

    def pause(duration_s: float) -> bool:
        return any([s.pause_profiling(duration_s) for s in sources])  # a list: ask them all

    def resume() -> bool:
        return any([s.resume_profiling() for s in sources])

    return pause, resume


def build(cfg: Config) -> Assembly:
    """Create every enabled part of the daemon from the configuration (nothing is started)."""
    # Imported here so `bpfdyno status` and other client commands never load bcc or NVML.
    from bpfdyno.app.detection_peers import PeerSignals, SlurmPeers, ask_ranks, own_port
    from bpfdyno.app.detection_trace import AutoTrace
    from bpfdyno.app.rank_peers import ConnectionPeers, PeerTrust, parse_networks
    from bpfdyno.app.tracing import TracingComponent
    from bpfdyno.detection.collector import DetectionCollector, DetectionSettings
    from bpfdyno.detection.events import EventLog
    from bpfdyno.detection.nccl_times import NcclCollectiveTimes
    from bpfdyno.detection.signals import RankProcess
    from bpfdyno.server.audit import audit_servicer_factory
    from bpfdyno.server.detection import detection_servicer_factory
    from bpfdyno.server.kernel import kernel_servicer_factory
    from bpfdyno.server.kineto import kineto_servicer_factory
    from bpfdyno.server.tracing import servicer_factory as tracing_servicer_factory
    from bpfdyno.services.detection import DetectionService
    from bpfdyno.services.kernel import KernelService
    from bpfdyno.sources.budget.controller import BudgetCollector
    from bpfdyno.sources.fabric.collector import FabricCollector
    from bpfdyno.sources.gloo.waits import GlooSettings, GlooWaits
    from bpfdyno.sources.gpu.collector import GpuCollector
    from bpfdyno.sources.gpu.dcgm import DcgmCollector
    from bpfdyno.sources.host.collector import HostCollector
    from bpfdyno.sources.host.self_stats import SelfCollector
    from bpfdyno.sources.irq.collector import IrqCollector
    from bpfdyno.sources.kubelet.collector import PodResourcesCollector
    from bpfdyno.sources.nccl_profiler.collector import NcclProfilerCollector
    from bpfdyno.sources.net.collector import NetCollector
    from bpfdyno.sources.percpu import rounds_between
    from bpfdyno.sources.perf.collector import PerfSwCollector, PmuCollector
    from bpfdyno.sources.perf.perf_event import online_cpus
    from bpfdyno.sources.procs.collector import ProcsCollector
    from bpfdyno.sources.procs.table import ProcessTable
    from bpfdyno.sources.sched.collector import SchedCollector
    from bpfdyno.tracing.capture.manager import PRELOAD_DELAY_S, CaptureManager
    from bpfdyno.tracing.nccl_track import NcclTrack

    asm = Assembly()
    on = cfg.collector_enabled
    # Per-CPU series every few rounds on a big node (their cost per CPU, bpfdyno.sources.percpu).
    per_cpu_every = rounds_between(len(online_cpus()), cfg.daemon.per_cpu_series_max)
    recorder = FlightRecorder(max_age_s=cfg.events.max_age_s, max_bytes=cfg.events.max_bytes)

    # The thread walk follows the process table's readers (the table is made below).
    sched = (
        SchedCollector.from_config(
            cfg.sched,
            sink=recorder.add,
            walk_demand=lambda: table is not None and table.in_demand(),
            per_cpu_every=per_cpu_every,
            round_s=cfg.collector_interval("sched"),
            readers=lambda: table.readers() if table is not None else (),
        )
        if on("sched")
        else None
    )
    net = NetCollector.from_config(cfg.net, sink=recorder.add) if on("net") else None
    kubelet = PodResourcesCollector(cfg.kubelet.pod_resources_socket) if on("kubelet") else None
    gpu = (
        GpuCollector.from_config(
            cfg.gpu,
            event_sink=recorder.add,
            device_owners=(lambda: kubelet.owners) if kubelet is not None else None,
            # Its per-process queries follow processes starting and exiting.
            process_churn=(lambda: sched.process_events) if sched is not None else None,
            # Its costly GPM metric is computed every round while someone reads.
            read_demand=lambda: asm.demand.active_for() > 0,
        )
        if on("gpu")
        else None
    )
    dcgm = DcgmCollector(host_engine=cfg.gpu.dcgm_host_engine) if on("dcgm") else None
    fabric = FabricCollector.from_config(cfg.fabric, sink=recorder.add) if on("fabric") else None
    irq = IrqCollector.from_config(cfg.irq, per_cpu_every=per_cpu_every) if on("irq") else None
    pause, resume = profiling_controls([c for c in (gpu, dcgm) if c is not None])
    # Kernel tracks of traced processes: their programs load in the background at start.
    capture = (
        CaptureManager(
            cfg.capture,
            gpu=gpu,
            interrupts=irq,
            preload_delay_s=PRELOAD_DELAY_S,
        )
        if cfg.capture.enabled
        else None
    )
    tracing = TracingComponent(
        cfg, dcgm_pause=pause, dcgm_resume=resume, capture=capture, recorder=recorder
    )
    if gpu is not None:
        # GPM counters are shared with CUPTI: pause them while a trace runs on that GPU.
        gpu.set_traced_pids_provider(tracing.service.tracing_pids)
    table = (
        ProcessTable(
            top_n=cfg.events.process_table_size,
            # Each update of the table has the threads walked unless a walk is under half a
            # round old: its scheduler times are as fresh as its /proc reading.
            sched=sched.fresh_per_process if sched else None,
            net=net.per_process if net else None,
            # GPU processes no older than one of the GPU's rounds, whoever updates the table.
            gpu_memory=(
                partial(gpu.fresh_gpu_memory_by_pid, cfg.collector_interval("gpu")) if gpu else None
            ),
            pods=gpu.pods_by_pid if gpu else None,
            # By the pid here: a container's trainer reports its namespace's.
            pinned=lambda: {t.host_pid or t.pid for t in tracing.service.registry.trainers()},
        )
        if on("procs")
        else None
    )
    registry = tracing.service.registry
    detection_log = EventLog(cfg.detection.max_events)
    d = cfg.detection
    peers = (
        PeerSignals(
            d.peers,
            cfg.collector_interval("detection"),
            # The jobs of the ranks the detection saw in its last round (read when pulling:
            # the collector is made below).
            jobs=lambda: {r.job_id for r in detection.rank_signals()} if detection else (),
            discovery=(
                SlurmPeers(own_port(cfg.grpc.tcp), [cfg.grpc.tcp] if cfg.grpc.tcp else [])
                if d.discover_peers
                else None
            ),
            # A job no scheduler names: its other agents from its ranks' connections, asked
            # only under the trust rule (docs/security.md).
            rank_pids=lambda: _pids_by_job(detection.rank_signals() if detection else ()),
            connections=(
                ConnectionPeers(
                    own_port(cfg.grpc.tcp),
                    PeerTrust.from_env(parse_networks(d.peer_networks)),
                    partial(ask_ranks, timeout_s=max(1.0, cfg.collector_interval("detection") / 2)),
                    [cfg.grpc.tcp] if cfg.grpc.tcp else [],
                )
                if d.discover_peers
                else None
            ),
        )
        if (d.peers or d.discover_peers) and on("detection")
        else None
    )
    # Trainers' NCCL profiler plugin files; registered trainers are looked up in their own
    # mount namespace too (containers), by their pid here: a container's trainer reports its
    # namespace's (1), which here is another process.
    nccl_profiler = (
        NcclProfilerCollector(
            trainer_pids=lambda: [t.host_pid or t.pid for t in registry.trainers()]
        )
        if on("nccl_profiler")
        else None
    )
    if nccl_profiler is not None and tracing.kernel_tracks is not None:
        # During a trace asking for the nccl track, the plugin's full-mode records become
        # rows of the file.
        tracing.kernel_tracks.nccl = NcclTrack(
            nccl_profiler.receiver, lambda: [t.host_pid or t.pid for t in registry.trainers()]
        )
    detection = (
        DetectionCollector(
            # In the agent's pid namespace: what /proc shows (host_pid 0: the same).
            lambda: [RankProcess(t.host_pid or t.pid, str(t.job_id)) for t in registry.trainers()],
            detection_log,
            socket.gethostname(),
            DetectionSettings.of(
                d.k, d.window, d.suspect_at, d.confirm_at, d.clear_at, d.hang_after_s
            ),
            # NCCL's own times where trainers load the plugin: time in collectives and how
            # late each local rank arrived at them.
            collectives=(
                NcclCollectiveTimes(nccl_profiler.receiver.snapshot)
                if nccl_profiler is not None
                else None
            ),
            peers=peers.signals if peers is not None else None,
            # gloo ranks' waits for their peers' data, from a uprobe pair in gloo.
            peer_waits=(
                GlooWaits(GlooSettings(d.gloo_max_ranks, d.gloo_max_threads))
                if d.gloo_peer_waits
                else None
            ),
            # The ranks' TCP connections as the net collector last read them: the network
            # scores.
            connections=net,
            # The interrupt collector's per-CPU books: the ranks' interrupt share.
            interrupts=irq,
        )
        if on("detection")
        else None
    )
    candidates: dict[str, Collector | None] = {
        "host": HostCollector(per_cpu_every=per_cpu_every) if on("host") else None,
        "self": SelfCollector() if on("self") else None,
        "sched": sched,
        "net": net,
        "pmu": PmuCollector(per_cpu_every=per_cpu_every) if on("pmu") else None,
        # Per-CPU context switches from the sched programs when they run: a perf counter of
        # its own would cost every context switch again.
        "perf_sw": (
            PerfSwCollector(
                switch_counts=sched.cpu_switch_counts if sched else None,
                switch_estimate=sched.switch_estimate if sched else None,
                per_cpu_every=per_cpu_every,
            )
            if on("perf_sw")
            else None
        ),
        "gpu": gpu,
        "dcgm": dcgm,
        "procs": ProcsCollector(table) if table is not None else None,
        "kubelet": kubelet,
        "fabric": fabric,
        "irq": irq,
        # Trainers' NCCL profiler plugin files; registered trainers are looked up in their
        # own mount namespace too (containers).
        "nccl_profiler": nccl_profiler,
        "detection": detection,
    }
    for name, collector in candidates.items():
        if collector is None:
            asm.disabled.append(name)
        else:
            asm.collectors.append(collector)
    # The overhead budget: every collector's steps, asked as it decides; the capture's
    # programs are the trace requesters' work, charged to them and never stepped down.
    parts = list(asm.collectors)
    REQUESTED.ratio = cfg.budget.requested_per_user_ratio
    asm.budget = BudgetCollector(
        cfg.budget,
        [lambda: [r for c in parts for r in c.reductions()]],
        [FewerEvents(recorder)],
    )
    if capture is not None:
        asm.budget.add_requested_programs(capture.requested_programs)
    if irq is not None:  # its programs, while its step holds, run only for traces
        asm.budget.add_requested_programs(irq.requested_programs)
    if detection is not None and net is not None:
        asm.budget.add_needs(partial(detection_needs, detection))
    asm.collectors.append(asm.budget)

    asm.components.append(tracing)
    asm.servicers.append(
        kernel_servicer_factory(
            KernelService(recorder, table, net, cfg.collector_interval("procs"), demand=asm.demand)
        )
    )
    asm.servicers.append(tracing_servicer_factory(tracing.service))
    asm.servicers.append(audit_servicer_factory(tracing.service.audit))
    asm.servicers.append(kineto_servicer_factory(tracing.user_dirs))
    asm.servicers.append(
        detection_servicer_factory(
            DetectionService(
                detection_log, detection.rank_signals if detection is not None else None
            )
        )
    )
    if peers is not None:
        asm.components.append(peers)
    if detection is not None and d.auto_trace:
        rank_signals = detection.rank_signals
        auto = AutoTrace(
            tracing.service,
            d.auto_trace_iterations,
            d.auto_trace_every_s,
            detection_log,
            socket.gethostname(),
            job_ranks=lambda job: [r.pid for r in rank_signals(job)],
            seconds=d.auto_trace_seconds,
            # The job's ranks on other nodes are traced too, through their agents.
            job_peers=peers.job_peers if peers is not None and d.auto_trace_job_wide else None,
            peer_pids=peers.job_peer_pids if peers is not None else None,
        )
        detection_log.listeners.append(auto.on_events)
        asm.components.append(auto)
    if cfg.export.jsonl.enabled:
        asm.sinks.append(JsonlExporter(cfg.export.jsonl))
    asm.sinks += _metric_exporters(cfg, table, asm.demand)
    return asm


def _pids_by_job(signals: Iterable[RankSignal]) -> dict[str, list[int]]:
    """The pids of this node's ranks, by job id."""
    out: dict[str, list[int]] = {}
    for s in signals:
        out.setdefault(s.job_id, []).append(s.pid)
    return out


def _metric_exporters(
    cfg: Config, table: ProcessTable | None, demand: ReadDemand
) -> list[RoundSink]:
    """Prometheus and OTLP, when enabled, with the process table's rows as a provider; a
    scrape is a read (`scrape_read`)."""
    providers: list[SampleProvider] = []
    if table is not None:
        from bpfdyno.sources.procs.samples import row_samples

        providers.append(lambda: row_samples(table.snapshot.rows))
    sinks: list[RoundSink] = []
    if cfg.export.prometheus.enabled:
        from bpfdyno.exporters.prometheus import PrometheusExporter
        from bpfdyno.server.peers import http_requester

        prom = PrometheusExporter(
            cfg.export.prometheus, providers, CATALOG, identify=http_requester
        )
        prom.read_by = partial(scrape_read, demand, table, cfg.collector_interval("procs"))
        sinks.append(prom)
    if cfg.export.otlp.enabled:
        from bpfdyno.exporters.otlp import OtlpExporter

        sinks.append(OtlpExporter(cfg.export.otlp, providers, CATALOG))
    return sinks


#: Who a Prometheus scrape is, as a reader (its HTTP peer is not known at the scrape).
SCRAPE_READER = "prometheus scrape"
#: Longest a scrape waits for fresh rounds (Prometheus's own timeout is 10 s by default).
SCRAPE_FRESH_S = 5.0


def scrape_read(demand: ReadDemand, table: ProcessTable | None, procs_interval_s: float) -> None:
    """A scrape reads (on the exporter's HTTP thread): rounds no older than one normal round,
    per-CPU series every round while scraped, the process table's rows as fresh."""
    from bpfdyno.sources.percpu import PER_CPU_READS

    PER_CPU_READS.note()
    demand.read_blocking(SCRAPE_READER, SCRAPE_FRESH_S)
    if table is None:
        return
    age = table.age_s()
    with REQUESTED.work((SCRAPE_READER,)):
        if age is not None and age <= 1.5 * procs_interval_s:
            table.read(SCRAPE_READER)  # the rounds keep it this fresh while it is read
        else:
            table.fresh_snapshot(procs_interval_s, SCRAPE_READER)


def detection_needs(detection: DetectionCollector) -> dict[str, str]:
    """The budget steps the detection needs undone while it watches a job: the net parts its
    network scores read (a detached RTT program left a delayed link unseen)."""
    from bpfdyno.sources.net.collector import detached_step

    who = detection.watching()
    return {detached_step(part): who for part in detection.NET_INPUTS} if who else {}


def bind_daemon(asm: Assembly, daemon: Daemon) -> None:
    """Give the budget the daemon's own steps (call on the event loop, once it runs)."""
    if asm.budget is None:
        return
    # The detection keeps its interval: a job's straggler is noticed as fast under a storm
    # (4x slower, its 5 s became 20 s; its own cost is a few /proc reads per rank).
    slower = daemon.slower_collection(keep=frozenset({asm.budget.name, "detection"}))
    asm.budget.add_source(lambda: [slower])
    asm.budget.add_memory_steps([daemon.less_history()])
    asm.budget.set_collector_cpu(daemon.collector_cpu_ns)
