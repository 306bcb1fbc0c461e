"""Daemon configuration: a TOML file, then command-line overrides, validated in one place.

Every problem is reported as a `ConfigError` naming the file, the line and the key, so the
CLI can print it and exit 2 before anything is started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bpfdyno.rpc.kernel_tracks import KERNEL_TRACKS

DEFAULT_CONFIG_PATH = Path("/etc/bpfdyno/bpfdyno.toml")
DEFAULT_SOCKET = "/run/bpfdyno/bpfdyno.sock"

#: Collectors the daemon knows; ``[collectors.<name>]`` may only name these.
KNOWN_COLLECTORS = (
    "host", "self", "sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "kubelet",
    "fabric", "irq", "nccl_profiler", "detection",
)  # fmt: skip
#: Collectors whose own interval is not the daemon's by default: the kubelet's allocations
#: change only when pods start or end; the fabric's counters (RDMA ports, NIC driver
#: statistics) are cumulative, so every 5 s they are exact over 5 s, at a fifth of the cost
#: (a sysfs walk and an ioctl per interface: ~0.07 % of a core every second on a 2-CPU VM
#: with three interfaces). A trace's fabric track samples them at its own rate. The budget
#: has a round as each of its run-statistics windows completes ([budget] stats_period_s,
#: stats_rest_period_s at rest); its interval only bounds the wait when there are none
#: (statistics refused), longer than the rest period so that it never adds a round.
DEFAULT_INTERVALS_S = {"kubelet": 10.0, "fabric": 5.0, "detection": 5.0, "budget": 30.0}


class ConfigError(Exception):
    """A configuration problem, with where it is and what to do about it."""

    def __init__(self, message: str, source: str = "", line: int | None = None) -> None:
        where = source
        if line is not None:
            where = f"{source}:{line}" if source else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)
        self.source = source
        self.line = line


@dataclass
class DaemonSection:
    #: Default collection interval for every collector, in seconds.
    interval_s: float = 1.0
    #: Seconds between rounds while nobody reads (no query, stream, process listing or
    #: scrape for 30 s): the kernel keeps counting, the rates cover the longer interval, and
    #: a read wakes a fresh round first. 0: every interval_s always. An exporter that writes
    #: every round (jsonl, otlp) keeps interval_s.
    idle_interval_s: float = 5.0
    #: How much history the in-memory store keeps for window queries, in seconds.
    history_s: float = 900.0
    #: Most series the store holds before evicting the least recently updated.
    max_series: int = 50_000
    #: Per-CPU series (host CPU ratios, sched, perf_sw and pmu per CPU, the irq collector's
    #: interrupts and softirq time) are reported every round on nodes of up to this many
    #: CPUs; a node with more reports them every ceil(CPUs / this) rounds, each rate over
    #: that interval, so they cost what this many CPUs cost (host-wide totals stay every
    #: round). 0: every round whatever the node.
    per_cpu_series_max: int = 16
    #: One of debug, info, warning, error.
    log_level: str = "info"


@dataclass
class GrpcSection:
    #: Unix socket path of the gRPC API.
    socket: str = DEFAULT_SOCKET
    #: Permission bits of the socket file. 0o666: every local user may connect, and each
    #: acts only as itself (its uid comes from the kernel: docs/security.md); 0o660 with
    #: socket_group: only root and that group's members.
    socket_mode: int = 0o666
    #: Group owning the socket (e.g. "bpfdyno"); with socket_mode = 0o660, only its
    #: members (and root) may connect.
    socket_group: str = ""
    #: "host:port" to also listen on TCP; empty (the default) means Unix socket only.
    #: TCP needs tls_cert + tls_key and token_file and/or tls_client_ca.
    tcp: str = ""
    #: PEM certificate (chain) the TCP listener presents.
    tls_cert: str = ""
    #: PEM private key of tls_cert; keep it readable by root only.
    tls_key: str = ""
    #: PEM CA bundle; when set, TCP clients must present a certificate it signed.
    tls_client_ca: str = ""
    #: File holding a bearer token; when set, every TCP call must carry
    #: "authorization: Bearer <token>" metadata.
    token_file: str = ""
    #: Allow TCP without TLS or client authentication (anyone who can connect is trusted).
    insecure_tcp: bool = False
    #: The uid whose rights a TCP client authenticated by TLS + token or client certificate
    #: acts with: -1 (the default): such clients may read but not start traces; 0: an
    #: operator, who may trace every process (then keep the token to operators: whoever
    #: holds it is root over TCP). Without TLS, a client on this host acts as the owner of
    #: its socket and a remote one may not start traces (docs/security.md).
    tcp_uid: int = -1
    #: StreamMetrics calls open at once, in all (each holds a queue of rounds)...
    max_streams: int = 256
    #: ... and of one user (root is not limited per user).
    max_streams_per_user: int = 8


@dataclass
class JsonlSection:
    #: Write every collection round as one JSON line.
    enabled: bool = False
    #: Output file, or "-" for stdout.
    path: str = "-"
    #: Rotate the file when the next line would take it past this size (bytes).
    max_bytes: int = 64 * 1024 * 1024
    #: Rotated files kept (path.1 ... path.N).
    backups: int = 5


@dataclass
class PrometheusSection:
    #: Serve every metric at http://<listen>/metrics for Prometheus to scrape.
    enabled: bool = False
    #: "host:port" of the /metrics endpoint (IPv6 as "[::1]:9470"). The default is reachable
    #: from this machine only; "0.0.0.0:9470" lets a Prometheus server elsewhere scrape it.
    listen: str = "127.0.0.1:9470"
    #: Connections served at once; more are answered 503 at once.
    max_connections: int = 16
    #: Of them, from one user of this host (or one address elsewhere); root is not limited.
    max_connections_per_peer: int = 4
    #: A connection is closed this long after it was accepted, finished or not.
    timeout_s: float = 10.0


@dataclass
class OtlpSection:
    #: Push every metric to an OpenTelemetry collector (OTLP) every interval_s.
    enabled: bool = False
    #: "grpc" (OTLP/gRPC, port 4317) or "http/protobuf" (OTLP/HTTP, port 4318).
    protocol: str = "grpc"
    #: Collector URL; https:// means TLS. "" means http://localhost:4317 for grpc and
    #: http://localhost:4318/v1/metrics for http/protobuf.
    endpoint: str = ""
    #: Extra request headers, "name=value" each (e.g. an API key for a hosted collector).
    headers: list[str] = field(default_factory=list)
    #: PEM CA bundle to verify an https:// collector; "" means the system's roots.
    tls_ca: str = ""
    #: PEM client certificate, for a collector that requires one (mTLS).
    tls_cert: str = ""
    #: PEM private key of tls_cert.
    tls_key: str = ""
    #: Seconds between exports.
    interval_s: float = 10.0
    #: Seconds one export may take before it is abandoned (and counted as failed).
    timeout_s: float = 10.0
    #: The resource attribute "cluster" (the name of the cluster this node belongs to).
    cluster: str = ""
    #: More resource attributes, "key=value" each ($OTEL_RESOURCE_ATTRIBUTES adds more).
    resource_attributes: list[str] = field(default_factory=list)


@dataclass
class ExportSection:
    jsonl: JsonlSection = field(default_factory=JsonlSection)
    prometheus: PrometheusSection = field(default_factory=PrometheusSection)
    otlp: OtlpSection = field(default_factory=OtlpSection)


@dataclass
class CollectorSection:
    #: Run this collector (a missing capability makes it "unavailable" on its own).
    enabled: bool = True
    #: Overrides [daemon].interval_s for this collector; 0 means "use the daemon's".
    interval_s: float = 0.0


@dataclass
class KinetoSection:
    #: Directory of the Kineto IPC socket (the trainers' KINETO_IPC_SOCKET_DIR); "" means the
    #: abstract name @dynolog@ of this network namespace. Defaults to $KINETO_IPC_SOCKET_DIR.
    socket_dir: str = field(default_factory=lambda: os.environ.get("KINETO_IPC_SOCKET_DIR", ""))
    #: Most trainers remembered at once.
    registry_max_entries: int = 4096
    #: Most trainers of one uid (root excepted), so that no user can fill the registry with
    #: sockets of its own and keep other users' trainers out.
    max_trainers_per_uid: int = 512
    #: A trainer that has not polled for this long is forgotten (dynolog: 60 s).
    expire_after_s: float = 60.0
    #: Root-owned parent of the per-user socket directories (one ``<root>/<uid>``, mode
    #: 0700, per user, the agent's endpoint bound in each; ``bpfdyno run`` and the SLURM
    #: prolog ask for them, trainers get theirs as KINETO_IPC_SOCKET_DIR); "" for none.
    #: Nobody but a trainer's owner and root can reach it there (docs/security.md).
    user_socket_root: str = ""
    #: Kubernetes: the agent's parent (made mode 0700) of per-pod socket directories: each
    #: trainer pod mounts hostPath ``<root>/<name>`` at the same path as its
    #: KINETO_IPC_SOCKET_DIR, and the agent serves an endpoint in every such directory
    #: (`bpfdyno.tracing.ipc.pod_dirs`, deploy/kubernetes/trainer-example.yaml); "" for none.
    pod_socket_root: str = ""
    #: Where the kernel has cgroup hooks for Unix sockets (Linux 6.7+), refuse datagrams
    #: (and connects) to a registered trainer's abstract socket from anyone but its user,
    #: root and the agent: a BPF program on the root cgroup (docs/security.md).
    kernel_guard: bool = True


@dataclass
class TracingSection:
    #: Where traces go when a request names no log file, for every requester; "" = each
    #: user's own directory under ``user_dirs`` (or, with that empty, allowed_dirs[0]). Also
    #: allowed for log files (besides allowed_dirs).
    trace_dir: str = ""
    #: Parent of the per-user trace directories: the agent makes ``<user_dirs>/<user>`` (the
    #: user's own, mode 0700, in a parent only the agent writes) for a request that names no
    #: log file, and verifies it before every use; log files may be named anywhere under it.
    #: Under /tmp because newer libkineto writes on-demand traces only under
    #: $KINETO_ONDEMAND_TRACE_DIR, /tmp/ by default (docs/tracing.md); where /tmp is a small
    #: tmpfs, point this at a disk and set that variable in jobs. "" = none.
    user_dirs: str = "/tmp/bpfdyno"
    #: A user may also name log files under its own home directory (the passwd database's).
    allow_home: bool = True
    #: Directories trace log files must be inside.
    allowed_dirs: list[str] = field(default_factory=lambda: ["/tmp"])
    #: How long a trace is followed before its unfinished processes are "timed out".
    default_timeout_s: float = 300.0
    #: Longest duration trace a request may ask for (ACTIVITIES_DURATION_MSECS and the other
    #: duration keys). The traced process keeps every event in memory until the file is
    #: written: ~160 MiB per traced second with stacks and shapes at 1000 steps/s
    #: (docs/security.md).
    max_duration_ms: int = 30_000
    #: Most optimizer steps an iteration trace may record (ACTIVITIES_ITERATIONS, and the
    #: warm-up iterations).
    max_iterations: int = 100
    #: Latest start a request may ask for: PROFILE_START_TIME at most this far ahead (and
    #: ACTIVITIES_WARMUP_PERIOD_SECS at most this long). The process stays busy until then.
    max_start_delay_s: float = 120.0
    #: Latest start of an iteration trace: PROFILE_START_ITERATION and
    #: PROFILE_START_ITERATION_ROUNDUP at most this.
    max_start_iterations: int = 10_000
    #: Append every trace request's audit record to this file as a JSON line (created 0600);
    #: "" = only the daemon's log (logger bpfdyno.audit, i.e. the journal under systemd).
    audit_file: str = ""
    #: Audit records kept in memory for `bpfdyno audit` / the gRPC Audit service.
    audit_records: int = 1000
    #: Most bytes of JSON the agent reads from one trace file (after decompression) to merge
    #: or summarise it: a small gzip file can inflate to gigabytes. A 3 s CUDA trace with
    #: stacks and shapes is ~400 MB.
    max_trace_json_bytes: int = 4 << 30
    #: Most bytes of one event of a trace file the agent parses (Kineto's are < 10 KB; one
    #: huge JSON string would otherwise cost its size several times over in memory).
    max_trace_event_bytes: int = 16 << 20


@dataclass
class LegacyRpcSection:
    #: Serve the dyno CLI's JSON RPC.
    enabled: bool = True
    #: Addresses to listen on ("host:port", IPv6 as "[::1]:1778").
    listen: list[str] = field(default_factory=lambda: ["127.0.0.1:1778", "[::1]:1778"])
    #: A connection must send its whole request within this time.
    timeout_s: float = 5.0
    #: Connections served at once.
    max_connections: int = 64
    #: Connections one peer (one uid on this host, else one address) may hold at once.
    max_connections_per_peer: int = 8
    #: A connection that sends nothing for this long is closed (dyno sends at once).
    idle_timeout_s: float = 1.0


@dataclass
class GpuSection:
    #: NVML library to load instead of the driver's libnvidia-ml.so.1; "" for the system one.
    library_path: str = ""
    #: Read GPM profiling metrics (SM active, tensor active...) on Hopper-class GPUs.
    gpm_enabled: bool = True
    #: Watch XID and other critical GPU events.
    events_enabled: bool = True
    #: The DCGM host engine of the dcgm collector: "auto" (a running nv-hostengine on
    #: 127.0.0.1:5555 if one answers, else one embedded in the agent), "embedded",
    #: "HOST:PORT" or "unix:PATH" (that nv-hostengine only: share it with dcgm-exporter).
    dcgm_host_engine: str = "auto"


@dataclass
class KubeletSection:
    #: The kubelet's pod-resources socket: which pod and container holds each GPU (the
    #: kubelet collector; absent: not a Kubernetes node).
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"


@dataclass
class SchedSection:
    """The scheduler collector's BPF program; these defaults are the only ones (the C code
    refuses to compile without its settings)."""

    #: Thread exits remembered between two collections (the last books of each exited
    #: thread, until the next collection reads them). Beyond it, an exiting thread's times
    #: are lost: sched_dropped_total{reason="exit_map_full"} counts them. Sized for
    #: daemon.idle_interval_s (5 s of ~13,000 exits a second), and a faster churn brings the
    #: normal cadence back. A ring buffer of 80 bytes an exit, rounded up to a power of two
    #: of pages, held in kernel memory from the start (8 MiB at 65,536).
    max_exits: int = 65536
    #: Exec/exit event ring buffer size in pages (a power of two). Events that find it
    #: full are dropped: sched_dropped_total{reason="ringbuf_full"}.
    ringbuf_pages: int = 64


@dataclass
class NetSection:
    """The network collector's BPF program; these defaults are the only ones (the C code
    refuses to compile without its settings)."""

    #: Where per-process byte counts come from: "auto" (sock:sock_{send,recv}_length when
    #: the kernel has them, else the socket syscalls), "sock" or "syscalls".
    byte_source: str = "auto"
    #: TCP sockets tracked at once (entries of the socket BPF map); beyond it the least
    #: recently used one is evicted and its connection disappears from ListConnections.
    max_socks: int = 16384
    #: Processes with per-process counters at once. Beyond it, updates are lost:
    #: net_process_map_full_total counts them.
    max_procs: int = 16384
    #: Event ring buffer size in pages (a power of two). Events that find it full are
    #: lost: net_events_lost_total counts them.
    ringbuf_pages: int = 64
    #: Sample 1 in this many tcp:tcp_probe events (per CPU) for RTT and congestion window;
    #: 1 samples every received segment, at a cost on the receive path.
    probe_sample_every: int = 16


@dataclass
class FabricSection:
    """The fabric collector: RDMA ports (sysfs) and NIC driver statistics (ethtool)."""

    #: Interfaces whose driver statistics (ETHTOOL_GSTATS) are read, as shell patterns
    #: ("*" all; e.g. ["eth*", "ens*"]). Loopback has none.
    nic_interfaces: list[str] = field(default_factory=lambda: ["*"])
    #: Also export per-queue driver statistics (rx0_packets, rx_queue_3_drops, ...): tens
    #: per queue on a multi-queue NIC. Their totals are exported either way.
    nic_queue_stats: bool = False
    #: Most driver statistics exported per interface; the rest are counted in
    #: nic_driver_statistics_omitted.
    max_stats_per_interface: int = 1024


@dataclass
class IrqSection:
    """The interrupt collector: softirq time (bpf/irq.bpf.c) and /proc/interrupts."""

    #: Most (IRQ, CPU) pairs reported by irq_cpu_interrupts_per_second (each pair from its
    #: first interrupt on); beyond it, pairs are counted in irq_cpu_series_omitted.
    max_irq_cpu_series: int = 4096


@dataclass
class EventsSection:
    #: The kernel/GPU event flight recorder keeps events this long (seconds)...
    max_age_s: float = 300.0
    #: ...and at most about this much memory (bytes).
    max_bytes: int = 32 * 1024 * 1024
    #: Most active processes kept in the process table (registered trainers come on top).
    process_table_size: int = 200


@dataclass
class CaptureSection:
    """Kernel tracks merged into on-demand traces: what the agent records of each traced
    process while its trace runs (bpf/capture.bpf.c, bpf/nccl.bpf.c, NVML), and the limits.
    These defaults are the only ones (the C code refuses to compile without its settings)."""

    #: Record kernel tracks at all; false: traces are left exactly as Kineto wrote them.
    enabled: bool = True
    #: Tracks added when a request names none (and for every dyno RPC request): any of
    #: "net", "sched", "nccl", "gpu", "fabric".
    default_tracks: list[str] = field(default_factory=lambda: list(KERNEL_TRACKS))
    #: Rare network events (retransmits, resets, connection changes) from this many seconds
    #: before the request are added from the flight recorder.
    pre_window_s: float = 5.0
    #: Most events kept per traced process; beyond it the oldest are dropped (counted and
    #: stated in the file). About 150 bytes of agent memory each.
    max_events_per_process: int = 100_000
    #: Processes traced at once, with their child processes (DataLoader workers: 8 ranks of
    #: 16 workers need 136), entries of the traced-process BPF maps (64 bytes each).
    max_processes: int = 1024
    #: Threads of traced processes tracked at once (off-CPU state, NCCL calls in progress).
    max_threads: int = 16384
    #: Sockets of traced processes tracked at once (bursts, owners of softirq events).
    max_sockets: int = 16384
    #: Size of each capture ring buffer in pages (a power of two); a full one loses events,
    #: counted per process and stated in the file.
    ringbuf_pages: int = 256
    #: One thread's socket calls on one socket in one direction are coalesced into a burst
    #: while each comes at most this long after the previous one; 0 = one event per call.
    net_coalesce_gap_us: int = 50
    #: ...and while the burst spans at most this long.
    net_coalesce_max_us: int = 1000
    #: Each TCP connection of a traced process is sampled (round-trip time, congestion window,
    #: bytes in flight, retransmission timeout) at its socket calls, at most once per this
    #: long; 0 = never (retransmits, resets and state changes still carry a sample).
    net_tcp_sample_us: int = 5000
    #: Off-CPU intervals shorter than this are counted and summed, not written one by one.
    sched_min_offcpu_us: int = 0
    #: GPU counters of the traced processes' GPUs are read this often while a trace runs.
    gpu_sample_hz: float = 10.0
    #: RDMA port and NIC counters, and interrupt time, of the traced processes' fabric are
    #: read this often while a trace runs (the "fabric" track).
    fabric_sample_hz: float = 10.0


@dataclass
class BudgetSection:
    """The overhead budget: the most the agent may cost, which it keeps by itself
    (docs/performance.md, "The overhead budget")."""

    #: Keep the agent within the budget below (false: measure and report only, reduce nothing).
    enabled: bool = True
    #: The most the agent may cost as a share of one CPU (0.01 = 1 % of a core): its BPF
    #: programs' run time (kernel run statistics) plus its threads' CPU time. Over it, it
    #: samples, detaches and slows down in steps, and undoes them once the storm passes.
    #: 2 %: the whole agent at rest costs 0.7-1.4 % of a core on a small VM (docs/performance.md),
    #: and a budget that near it would slow collection with no storm at all.
    cpu_ratio: float = 0.02
    #: The most resident memory (bytes) before it trims its heap and sheds history.
    rss_bytes: int = 256 * 1024 * 1024
    #: BPF run statistics are measured for this long ...
    stats_window_s: float = 0.5
    #: ... once per this period (the statistics cost ~20 ns per BPF run while on).
    stats_period_s: float = 2.0
    #: While nothing happens (the kernel's event counts and the agent's CPU as at the
    #: latest window, the agent far under its budget), a window only this often; a check
    #: every stats_period_s brings one at once when they rise. 0: a window every period.
    stats_rest_period_s: float = 10.0
    #: A step is undone after the cost stayed at or below half the budget this long (longer
    #: each time the same step had to be taken again soon after).
    restore_after_s: float = 30.0
    #: The most CPU one user's requests may have the agent spend, as a share of one CPU over
    #: 10 s (refreshing what they read, answering their queries, recording the kernel tracks
    #: of their traces); past it their requests are refused until it refills. This work is
    #: theirs: it never counts against cpu_ratio, and a trace's recording is never reduced.
    requested_per_user_ratio: float = 0.05


@dataclass
class DetectionSection:
    """Detection without anyone asking: straggling and hung training ranks, compared every
    [collectors.detection] interval_s (5 s) from per-rank signals (docs/detection.md)."""

    #: A rank is an outlier in an interval when its score exceeds the job's median by more
    #: than this many robust standard deviations (1.4826 times the median absolute deviation).
    k: float = 3.0
    #: The hysteresis counts outlier intervals among the last this many ...
    window: int = 6
    #: ... this many make a rank suspected ...
    suspect_at: int = 2
    #: ... this many confirmed ...
    confirm_at: int = 3
    #: ... and a suspected or confirmed rank is cleared when at most this many remain.
    clear_at: int = 1
    #: A job whose ranks on this node moved no bytes this long hangs (longer than the longest
    #: phase of a step that does no I/O, or that phase looks like a spinning rank).
    hang_after_s: float = 30.0
    #: Events held for `bpfdyno events` and new watchers (the newest are kept).
    max_events: int = 256
    #: The agents of this node's jobs on other nodes (Unix socket paths or host:port, reached
    #: as `bpfdyno` reaches agents: TLS and token from BPFDYNO_* in the agent's environment):
    #: their ranks' signals are pulled every interval so the job's ranks are compared across
    #: nodes. When set, they are the peers (an override of those `discover_peers` finds).
    peers: list[str] = field(default_factory=list)
    #: Without configured peers: the other nodes of this node's ranks' SLURM jobs (their
    #: $SLURM_JOB_ID, looked up with squeue/scontrol as `bpfdyno gputrace --job-id` does),
    #: each at this agent's own [grpc] tcp port, are the peers.
    discover_peers: bool = True
    #: Networks (CIDR) whose addresses may be asked as peers when found from a job's ranks'
    #: own TCP connections (a job no scheduler names: torchrun's), with the TLS and token of
    #: the agent's environment, without a certificate proving the address. Outside them, a
    #: found address is asked only after a TLS handshake verified its certificate against
    #: $BPFDYNO_TLS_CA, for that address (docs/security.md). Empty: only verified ones.
    peer_networks: list[str] = field(default_factory=list)
    #: Time gloo ranks' threads wait for their peers (uprobe pairs on gloo's
    #: UnboundBuffer::waitRecv and waitSend in the library that holds it, libtorch_cpu.so):
    #: the signal peer_wait_s and the score peer_wait_share.
    gloo_peer_waits: bool = True
    #: Ranks whose gloo waits are followed at once (the BPF map's size) ...
    gloo_max_ranks: int = 256
    #: ... and their threads waiting at the same moment.
    gloo_max_threads: int = 4096
    #: Trace a job's ranks on this node when one is a confirmed straggler, as the agent's own
    #: (audited) request, into [tracing] trace_dir (or the agent's own directory under
    #: user_dirs). Off by default.
    auto_trace: bool = False
    #: ... for this many iterations ...
    auto_trace_iterations: int = 10
    #: ... or, when above 0, for this many seconds from one start time common to the job's
    #: ranks (about 12 s after the confirmation: the trainers' next config poll and Kineto's
    #: warm-up), so that every rank's window is the same stretch of time.
    auto_trace_seconds: float = 0.0
    #: ... at most once per job in this many seconds.
    auto_trace_every_s: float = 3600.0
    #: Trace the job's ranks on its other nodes too (the peers whose rank signals hold ranks
    #: of the job), through their agents with the TLS and token of this agent's environment
    #: (BPFDYNO_TLS_CA, BPFDYNO_TOKEN_FILE...), as `gputrace --job-id` does; the verdict then
    #: compares every node's ranks. Off: only this node's ranks.
    auto_trace_job_wide: bool = True


def _default_collectors() -> dict[str, CollectorSection]:
    return {
        name: CollectorSection(interval_s=DEFAULT_INTERVALS_S.get(name, 0.0))
        for name in KNOWN_COLLECTORS
    }


@dataclass
class Config:
    daemon: DaemonSection = field(default_factory=DaemonSection)
    grpc: GrpcSection = field(default_factory=GrpcSection)
    export: ExportSection = field(default_factory=ExportSection)
    collectors: dict[str, CollectorSection] = field(default_factory=_default_collectors)
    kineto: KinetoSection = field(default_factory=KinetoSection)
    tracing: TracingSection = field(default_factory=TracingSection)
    legacy_rpc: LegacyRpcSection = field(default_factory=LegacyRpcSection)
    gpu: GpuSection = field(default_factory=GpuSection)
    kubelet: KubeletSection = field(default_factory=KubeletSection)
    events: EventsSection = field(default_factory=EventsSection)
    sched: SchedSection = field(default_factory=SchedSection)
    net: NetSection = field(default_factory=NetSection)
    fabric: FabricSection = field(default_factory=FabricSection)
    irq: IrqSection = field(default_factory=IrqSection)
    capture: CaptureSection = field(default_factory=CaptureSection)
    budget: BudgetSection = field(default_factory=BudgetSection)
    detection: DetectionSection = field(default_factory=DetectionSection)
    #: Where the values came from, for error messages and `status`.
    source: str = field(default="<defaults>", compare=False)

    def collector_interval(self, name: str) -> float:
        section = self.collectors.get(name)
        if section is not None and section.interval_s > 0:
            return section.interval_s
        if section is None and name in DEFAULT_INTERVALS_S:  # a part without a section
            return DEFAULT_INTERVALS_S[name]
        return self.daemon.interval_s

    def collector_enabled(self, name: str) -> bool:
        section = self.collectors.get(name)
        return section is None or section.enabled


_LOG_LEVELS = ("debug", "info", "warning", "error")


def load(
    path: Path | None,
    overrides: list[tuple[str, str]] = (),  # type: ignore[assignment]
    *,
    validate: bool = True,
) -> Config:
    """Read ``path`` (None: defaults only), apply ``overrides`` ("section.key", "value").

    ``validate=False`` checks keys and types only, not the values against each other or the
    files they name (TLS keys, tokens): for a client that wants one value from the agent's
    config and may not read the agent's secrets.

    Raises:
        ConfigError: unreadable file, TOML syntax error, unknown key, wrong type, bad value.
    """
    cfg = Config()
    if path is not None:
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(
                f"cannot read the config file ({e.strerror}); fix the path or its permissions, "
                "or leave out --config to use the defaults",
                source,
            ) from e
        except UnicodeDecodeError as e:
            raise ConfigError("the config file is not UTF-8 text", source) from e
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            m = re.search(r"\(at line (\d+), column \d+\)", str(e))
            line = int(m.group(1)) if m else None
            msg = re.sub(r"\s*\(at line \d+, column \d+\)", "", str(e))
            raise ConfigError(f"TOML syntax error: {msg}", source, line) from e
        _apply(cfg, data, (), _Locator(source, text))
        cfg.source = source
    for dotted, raw in overrides:
        _apply_override(cfg, dotted, raw)
    if overrides:
        cfg.source = "command line" if path is None else f"{cfg.source} + command line"
    if validate:
        _validate(cfg, path)
    return cfg


class _Locator:
    """Finds the line of ``section.key`` in the TOML text, for error messages."""

    def __init__(self, source: str, text: str) -> None:
        self.source = source
        self.lines = text.splitlines()

    def line_of(self, path: tuple[str, ...]) -> int | None:
        if not path:
            return None
        table: tuple[str, ...] = ()
        key = path[-1]
        parent = path[:-1]
        header = re.compile(r"^\s*\[\s*([^\]]+?)\s*\]\s*(#.*)?$")
        for i, line in enumerate(self.lines, start=1):
            m = header.match(line)
            if m:
                table = tuple(p.strip().strip('"') for p in m.group(1).split("."))
                if table == path:
                    return i
                continue
            m = re.match(r"^\s*([A-Za-z0-9_\-.\"]+)\s*=", line)
            if m:
                full = table + tuple(p.strip().strip('"') for p in m.group(1).split("."))
                if full == path or (full[-1] == key and table == parent):
                    return i
        return None

    def error(self, message: str, path: tuple[str, ...]) -> ConfigError:
        return ConfigError(message, self.source, self.line_of(path))


def _apply(obj: Any, data: dict[str, Any], path: tuple[str, ...], loc: _Locator) -> None:
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj) if f.name != "source"}
    for key, value in data.items():
        kpath = (*path, key)
        dotted = ".".join(kpath)
        if key not in names:
            known = ", ".join(sorted(names))
            raise loc.error(f"unknown key '{dotted}'; known keys here: {known}", kpath)
        target_type = hints[key]
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise loc.error(f"'{dotted}' must be a table ([{dotted}])", kpath)
            _apply(current, value, kpath, loc)
        elif isinstance(current, dict):
            if not isinstance(value, dict):
                raise loc.error(f"'{dotted}' must be a table ([{dotted}.<name>])", kpath)
            for sub, subval in value.items():
                spath = (*kpath, sub)
                if sub not in current:
                    known = ", ".join(sorted(current))
                    raise loc.error(f"unknown key '{dotted}.{sub}'; known: {known}", spath)
                if not isinstance(subval, dict):
                    raise loc.error(f"'{dotted}.{sub}' must be a table", spath)
                _apply(current[sub], subval, spath, loc)
        else:
            setattr(obj, key, _coerce(value, target_type, dotted, kpath, loc))


def _coerce(value: Any, target: Any, dotted: str, kpath: tuple[str, ...], loc: _Locator) -> Any:
    origin = typing.get_origin(target)
    if origin is list:
        (item_type,) = typing.get_args(target)
        if not isinstance(value, list):
            raise loc.error(f"'{dotted}' must be a list, got {type(value).__name__}", kpath)
        return [_coerce(v, item_type, dotted, kpath, loc) for v in value]
    if origin in (typing.Union, types.UnionType):
        raise TypeError("unions are not supported in config sections")
    if target is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if target is bool and not isinstance(value, bool):
        raise loc.error(f"'{dotted}' must be true or false, got {value!r}", kpath)
    if target is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise loc.error(f"'{dotted}' must be an integer, got {value!r}", kpath)
    if not isinstance(value, target):
        raise loc.error(f"'{dotted}' must be a {target.__name__}, got {value!r}", kpath)
    return value


def _apply_override(cfg: Config, dotted: str, raw: str) -> None:
    """Apply one ``--set section.key=value`` (value parsed as a TOML value, else a string)."""
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    nested: dict[str, Any] = {}
    cursor = nested
    parts = dotted.split(".")
    for p in parts[:-1]:
        cursor = cursor.setdefault(p, {})
    cursor[parts[-1]] = value
    _apply(cfg, nested, (), _Locator("command line", ""))


def _validate_detection(d: DetectionSection, bad: typing.Callable[[str, str], ConfigError]) -> None:
    if d.k <= 0:
        raise bad("must be above 0", "detection.k")
    if not 0 <= d.clear_at < d.suspect_at <= d.confirm_at <= d.window:
        raise bad(
            f"must satisfy 0 <= clear_at < suspect_at <= confirm_at <= window (now {d.clear_at}"
            f" < {d.suspect_at} <= {d.confirm_at} <= {d.window})",
            "detection.suspect_at",
        )
    if d.hang_after_s <= 0:
        raise bad("must be above 0 seconds", "detection.hang_after_s")
    if d.max_events < 1:
        raise bad("must be at least 1", "detection.max_events")
    if d.auto_trace_iterations < 1:
        raise bad("must be at least 1", "detection.auto_trace_iterations")
    if not 0 <= d.auto_trace_seconds <= 3600:
        raise bad("must be 0 (iterations) to 3600 seconds", "detection.auto_trace_seconds")
    if d.auto_trace_every_s < 0:
        raise bad("must be 0 or more seconds", "detection.auto_trace_every_s")
    for net in d.peer_networks:
        try:
            ipaddress.ip_network(net.strip(), strict=False)
        except ValueError:
            raise bad(
                f"must list networks like 10.0.0.0/8 or fd00::/64, got {net!r}",
                "detection.peer_networks",
            ) from None
    if not 1 <= d.gloo_max_ranks <= 65536:
        raise bad(f"must be in 1..65536, got {d.gloo_max_ranks}", "detection.gloo_max_ranks")
    if not 1 <= d.gloo_max_threads <= 1_048_576:
        raise bad(f"must be in 1..1048576, got {d.gloo_max_threads}", "detection.gloo_max_threads")


def _validate(cfg: Config, path: Path | None) -> None:
    def bad(msg: str, dotted: str) -> ConfigError:
        loc = _Locator("command line" if path is None else str(path), "")
        if path is not None:
            with contextlib.suppress(OSError):
                loc = _Locator(str(path), path.read_text(encoding="utf-8"))
        return loc.error(f"'{dotted}' {msg}", tuple(dotted.split(".")))

    if cfg.daemon.interval_s < 0.05:
        raise bad("must be at least 0.05 seconds", "daemon.interval_s")
    _validate_detection(cfg.detection, bad)
    if cfg.daemon.idle_interval_s < 0:
        raise bad("must be 0 (off) or a number of seconds", "daemon.idle_interval_s")
    if cfg.daemon.history_s < cfg.daemon.interval_s:
        raise bad("must be at least daemon.interval_s", "daemon.history_s")
    if cfg.daemon.max_series < 100:
        raise bad("must be at least 100", "daemon.max_series")
    if cfg.daemon.per_cpu_series_max < 0:
        raise bad("must be 0 (every round) or a number of CPUs", "daemon.per_cpu_series_max")
    if cfg.daemon.log_level not in _LOG_LEVELS:
        raise bad(f"must be one of {', '.join(_LOG_LEVELS)}", "daemon.log_level")
    if not cfg.grpc.socket.startswith("/"):
        raise bad("must be an absolute path", "grpc.socket")
    if not 0 <= cfg.grpc.socket_mode <= 0o777:
        raise bad("must be permission bits such as 0o660", "grpc.socket_mode")
    if cfg.grpc.max_streams < 1:
        raise bad("must be at least 1", "grpc.max_streams")
    if not 1 <= cfg.grpc.max_streams_per_user <= cfg.grpc.max_streams:
        raise bad("must be at least 1 and at most grpc.max_streams", "grpc.max_streams_per_user")
    if cfg.grpc.tcp and not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}", cfg.grpc.tcp):
        raise bad("must be host:port (e.g. 127.0.0.1:50051 or [::1]:50051)", "grpc.tcp")
    if cfg.grpc.tcp:
        _validate_tcp_security(cfg.grpc, bad)
    if cfg.export.jsonl.max_bytes < 4096:
        raise bad("must be at least 4096 bytes", "export.jsonl.max_bytes")
    if cfg.export.jsonl.backups < 0:
        raise bad("must be 0 or more", "export.jsonl.backups")
    for name, section in cfg.collectors.items():
        if section.interval_s < 0 or 0 < section.interval_s < 0.05:
            raise bad(
                "must be 0 (daemon default) or at least 0.05", f"collectors.{name}.interval_s"
            )
    if cfg.events.max_age_s <= 0:
        raise bad("must be more than 0 seconds", "events.max_age_s")
    if cfg.events.max_bytes < 64 * 1024:
        raise bad("must be at least 65536 bytes", "events.max_bytes")
    if not 1 <= cfg.events.process_table_size <= 100_000:
        raise bad("must be in 1..100000", "events.process_table_size")
    _validate_tracing(cfg, bad)
    _validate_security(cfg, bad)
    _validate_bpf_sizes(cfg, bad)
    _validate_export(cfg, bad)
    engine = cfg.gpu.dcgm_host_engine
    if engine not in ("auto", "embedded") and not re.fullmatch(
        r"unix:/\S+|(\[[0-9a-fA-F:.]+\]|[^:\s/\[\]]+)(:\d{1,5})?", engine
    ):
        raise bad(
            'must be "auto", "embedded", "HOST", "HOST:PORT" or "unix:/PATH" (e.g. '
            '"127.0.0.1:5555")',
            "gpu.dcgm_host_engine",
        )
    if not cfg.kubelet.pod_resources_socket.startswith("/"):
        raise bad("must be an absolute path", "kubelet.pod_resources_socket")
    _validate_capture(cfg.capture, bad)
    _validate_fabric(cfg, bad)
    _validate_budget(cfg.budget, bad)


_PEM_MARKERS = {
    "tls_cert": "-----BEGIN CERTIFICATE-----",
    "tls_key": "PRIVATE KEY-----",
    "tls_client_ca": "-----BEGIN CERTIFICATE-----",
}


def _validate_tcp_security(g: GrpcSection, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """TCP is exposed to the network: require TLS and client authentication, readable files."""
    if bool(g.tls_cert) != bool(g.tls_key):
        missing = "grpc.tls_key" if g.tls_cert else "grpc.tls_cert"
        raise bad("is missing: TLS needs both grpc.tls_cert and grpc.tls_key", missing)
    tls = bool(g.tls_cert)
    if not g.insecure_tcp and not tls:
        raise bad(
            "needs TLS: set grpc.tls_cert and grpc.tls_key to PEM files (see "
            "docs/deployment.md), or set grpc.insecure_tcp = true to serve plain text",
            "grpc.tcp",
        )
    if not g.insecure_tcp and not (g.token_file or g.tls_client_ca):
        raise bad(
            "needs client authentication: set grpc.token_file (a bearer token) and/or "
            "grpc.tls_client_ca (client certificates), or set grpc.insecure_tcp = true",
            "grpc.tcp",
        )
    if not tls:
        for key in ("token_file", "tls_client_ca"):
            if getattr(g, key):
                raise bad(
                    "needs TLS: set grpc.tls_cert and grpc.tls_key as well (a token or "
                    "client certificate is only checked over TLS)",
                    f"grpc.{key}",
                )
    for key in ("tls_cert", "tls_key", "tls_client_ca", "token_file"):
        path = getattr(g, key)
        if not path:
            continue
        dotted = f"grpc.{key}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise bad(
                f"cannot read {path} ({e.strerror}); fix the path or its permissions", dotted
            ) from e
        except UnicodeDecodeError as e:
            raise bad(f"{path} is not text; it must be a PEM file", dotted) from e
        marker = _PEM_MARKERS.get(key)
        if marker is not None and marker not in text:
            raise bad(f"{path} is not a PEM file (no '{marker}' line)", dotted)
        if key == "token_file" and not text.strip():
            raise bad(
                f"{path} is empty; write a token into it (e.g. `openssl rand -hex 32`)", dotted
            )
        if key == "token_file":
            _check_token_mode(path, dotted, bad)


def _check_token_mode(
    path: str, dotted: str, bad: typing.Callable[[str, str], ConfigError]
) -> None:
    """The token file is a password: only its owner (root or the agent's user) may read it."""
    st = os.stat(path)
    if st.st_mode & 0o077:
        raise bad(
            f"{path} has mode {st.st_mode & 0o777:04o}: others than its owner may read the "
            "token, and whoever holds it acts over TCP as grpc.tcp_uid; make it the agent's "
            f"alone (chmod 600 {path}) and hand operators a copy of their own",
            dotted,
        )
    if st.st_uid not in (0, os.geteuid()):
        raise bad(
            f"{path} belongs to uid {st.st_uid}: that user may rewrite the token; make it "
            f"root's or the agent's (chown root {path})",
            dotted,
        )


def _validate_tracing(cfg: Config, bad: typing.Callable[[str, str], ConfigError]) -> None:
    k, t, rpc = cfg.kineto, cfg.tracing, cfg.legacy_rpc
    if k.socket_dir and not k.socket_dir.startswith("/"):
        raise bad("must be an absolute directory, or empty for @dynolog@", "kineto.socket_dir")
    # sun_path holds 107 bytes; the trainers' names there are 52 bytes long.
    if len(os.path.join(k.socket_dir, "dynoconfigclient").encode()) + 36 > 107:
        raise bad(
            "is too long for a Unix socket path (keep it under 55 bytes)", "kineto.socket_dir"
        )
    if k.user_socket_root and not k.user_socket_root.startswith("/"):
        raise bad("must be an absolute directory, or empty for none", "kineto.user_socket_root")
    # <root>/<uid of up to 10 digits>/dynoconfigclient<uuid> must fit in sun_path too.
    if len(os.path.join(k.user_socket_root, "4294967295", "dynoconfigclient").encode()) + 36 > 107:
        raise bad(
            "is too long for a Unix socket path (keep it under 44 bytes)",
            "kineto.user_socket_root",
        )
    if k.pod_socket_root and not k.pod_socket_root.startswith("/"):
        raise bad("must be an absolute directory, or empty for none", "kineto.pod_socket_root")
    # <root>/<a name of 16 or more bytes>/dynoconfigclient<uuid> must fit in sun_path too.
    pod_path = os.path.join(k.pod_socket_root, "n" * 16, "dynoconfigclient")
    if k.pod_socket_root and len(pod_path.encode()) + 36 > 107:
        raise bad(
            "is too long for a Unix socket path (keep it under 38 bytes: each pod's "
            "directory name needs room too)",
            "kineto.pod_socket_root",
        )
    if not 1 <= k.registry_max_entries <= 1_000_000:
        raise bad("must be in 1..1000000", "kineto.registry_max_entries")
    if k.expire_after_s < 5:
        raise bad("must be at least 5 seconds (Kineto polls every 1-5 s)", "kineto.expire_after_s")
    for key, dirs in (
        ("tracing.trace_dir", [t.trace_dir] if t.trace_dir else []),
        ("tracing.user_dirs", [t.user_dirs] if t.user_dirs else []),
        ("tracing.allowed_dirs", t.allowed_dirs),
    ):
        for d in dirs:
            if not d.startswith("/") or ".." in d.split("/"):
                raise bad(f"must hold absolute paths without '..', got {d!r}", key)
    if t.default_timeout_s <= 0:
        raise bad("must be more than 0 seconds", "tracing.default_timeout_s")
    for addr in rpc.listen:
        if (
            not re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):\d{1,5}", addr)
            or int(addr.rsplit(":", 1)[1]) > 65535
        ):
            raise bad(
                f"entries must be host:port such as 127.0.0.1:1778 or [::1]:1778, got {addr!r}",
                "legacy_rpc.listen",
            )
    if rpc.timeout_s <= 0:
        raise bad("must be more than 0 seconds", "legacy_rpc.timeout_s")
    if rpc.max_connections < 1:
        raise bad("must be at least 1", "legacy_rpc.max_connections")


def _validate_security(cfg: Config, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """The limits that keep one local user from harming others (docs/security.md)."""
    t, rpc = cfg.tracing, cfg.legacy_rpc
    if not 1 <= cfg.kineto.max_trainers_per_uid <= cfg.kineto.registry_max_entries:
        raise bad(
            "must be at least 1 and at most kineto.registry_max_entries",
            "kineto.max_trainers_per_uid",
        )
    if not 1 <= t.max_duration_ms <= 2**31 - 1:
        raise bad(f"must be in 1..{2**31 - 1} ms", "tracing.max_duration_ms")
    if not 1 <= t.max_iterations <= 2**31 - 1:
        raise bad(f"must be in 1..{2**31 - 1}", "tracing.max_iterations")
    if t.max_start_delay_s < 10:
        raise bad(
            "must be at least 10 seconds (Kineto needs a start at least 5 s ahead)",
            "tracing.max_start_delay_s",
        )
    if not 1 <= t.max_start_iterations <= 2**31 - 1:
        raise bad(f"must be in 1..{2**31 - 1}", "tracing.max_start_iterations")
    if t.audit_file and not t.audit_file.startswith("/"):
        raise bad(
            "must be an absolute path, or empty for the daemon's log only", "tracing.audit_file"
        )
    if not 1 <= t.audit_records <= 1_000_000:
        raise bad("must be in 1..1000000", "tracing.audit_records")
    if t.max_trace_json_bytes < 1 << 20:
        raise bad("must be at least 1 MiB (1048576)", "tracing.max_trace_json_bytes")
    if not 64 << 10 <= t.max_trace_event_bytes <= t.max_trace_json_bytes:
        raise bad(
            "must be at least 64 KiB (65536) and at most tracing.max_trace_json_bytes",
            "tracing.max_trace_event_bytes",
        )
    if not 1 <= rpc.max_connections_per_peer <= rpc.max_connections:
        raise bad(
            "must be at least 1 and at most legacy_rpc.max_connections",
            "legacy_rpc.max_connections_per_peer",
        )
    if rpc.idle_timeout_s <= 0:
        raise bad("must be more than 0 seconds", "legacy_rpc.idle_timeout_s")
    if cfg.grpc.tcp_uid < -1:
        raise bad("must be a uid, or -1 to let authenticated TCP clients only read", "grpc.tcp_uid")


#: Most threads or processes a Linux system can have (PID_MAX_LIMIT).
_PID_MAX_LIMIT = 4 * 1024 * 1024
#: Largest ring buffer, in pages (256 MiB of 4 KiB pages).
_MAX_RINGBUF_PAGES = 65536
_NET_BYTE_SOURCES = ("auto", "sock", "syscalls")


def _validate_bpf_sizes(cfg: Config, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """Sizes of the BPF maps and ring buffers ([sched], [net], [capture] ring buffer); the
    kernel refuses others."""
    limits = (
        ("sched.max_exits", cfg.sched.max_exits, _PID_MAX_LIMIT),
        ("net.max_socks", cfg.net.max_socks, 16 * 1024 * 1024),
        ("net.max_procs", cfg.net.max_procs, _PID_MAX_LIMIT),
        ("net.probe_sample_every", cfg.net.probe_sample_every, 2**32 - 1),
    )
    for dotted, value, most in limits:
        if not 1 <= value <= most:
            raise bad(f"must be in 1..{most}, got {value}", dotted)
    for dotted, pages in (
        ("sched.ringbuf_pages", cfg.sched.ringbuf_pages),
        ("net.ringbuf_pages", cfg.net.ringbuf_pages),
        ("capture.ringbuf_pages", cfg.capture.ringbuf_pages),
    ):
        if not 1 <= pages <= _MAX_RINGBUF_PAGES or pages & (pages - 1):
            raise bad(
                f"must be a power of two in 1..{_MAX_RINGBUF_PAGES} (the kernel's ring buffer "
                f"size rule), got {pages}",
                dotted,
            )
    if cfg.net.byte_source not in _NET_BYTE_SOURCES:
        raise bad(
            f"must be one of {', '.join(_NET_BYTE_SOURCES)}, got {cfg.net.byte_source!r}",
            "net.byte_source",
        )


_HOST_PORT = re.compile(r"(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):(\d{1,5})")
_OTLP_PROTOCOLS = ("grpc", "http/protobuf")


def _validate_export(cfg: Config, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """[export.prometheus] and [export.otlp]: addresses, URLs, pairs, readable TLS files."""
    prom, otlp = cfg.export.prometheus, cfg.export.otlp
    m = _HOST_PORT.fullmatch(prom.listen)
    if m is None or not 1 <= int(m.group(2)) <= 65535:
        raise bad(
            f"must be host:port such as 127.0.0.1:9470 or [::1]:9470, got {prom.listen!r}",
            "export.prometheus.listen",
        )
    if not 1 <= prom.max_connections_per_peer <= prom.max_connections:
        raise bad(
            "must be at least 1 and at most export.prometheus.max_connections",
            "export.prometheus.max_connections_per_peer",
        )
    if prom.timeout_s <= 0:
        raise bad("must be more than 0 seconds", "export.prometheus.timeout_s")
    if otlp.protocol not in _OTLP_PROTOCOLS:
        raise bad(
            f"must be one of {', '.join(_OTLP_PROTOCOLS)}, got {otlp.protocol!r}",
            "export.otlp.protocol",
        )
    if otlp.endpoint and not re.match(r"https?://[^\s/]+", otlp.endpoint):
        raise bad(
            "must be a URL starting with http:// or https:// (e.g. https://otel.example:4317), "
            f"got {otlp.endpoint!r}",
            "export.otlp.endpoint",
        )
    for key in ("headers", "resource_attributes"):
        for pair in getattr(otlp, key):
            name, eq, _ = pair.partition("=")
            if not eq or not name.strip():
                raise bad(f"entries must be name=value, got {pair!r}", f"export.otlp.{key}")
    if otlp.interval_s < 1:
        raise bad("must be at least 1 second", "export.otlp.interval_s")
    if otlp.timeout_s <= 0:
        raise bad("must be more than 0 seconds", "export.otlp.timeout_s")
    if bool(otlp.tls_cert) != bool(otlp.tls_key):
        missing = "export.otlp.tls_key" if otlp.tls_cert else "export.otlp.tls_cert"
        raise bad("is missing: a client certificate needs both tls_cert and tls_key", missing)
    if not otlp.enabled:
        return
    for key in ("tls_ca", "tls_cert", "tls_key"):
        path = getattr(otlp, key)
        if path and not os.access(path, os.R_OK):
            raise bad(f"cannot read {path}; fix the path or its permissions", f"export.otlp.{key}")


def _validate_capture(c: CaptureSection, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """The [capture] section: track names, the pre-window and the BPF map sizes (its ring
    buffer with the others', `_validate_bpf_sizes`)."""
    for name in c.default_tracks:
        if name not in KERNEL_TRACKS:
            raise bad(
                f"names an unknown track {name!r}; choose from {', '.join(KERNEL_TRACKS)}",
                "capture.default_tracks",
            )
    if not 0 <= c.pre_window_s <= 3600:
        raise bad(f"must be in 0..3600 seconds, got {c.pre_window_s}", "capture.pre_window_s")
    limits = (
        ("capture.max_events_per_process", c.max_events_per_process, 100, 100_000_000),
        ("capture.max_processes", c.max_processes, 1, 65536),
        ("capture.max_threads", c.max_threads, 1, _PID_MAX_LIMIT),
        ("capture.max_sockets", c.max_sockets, 1, 16 * 1024 * 1024),
        ("capture.net_coalesce_gap_us", c.net_coalesce_gap_us, 0, 10_000_000),
        ("capture.net_coalesce_max_us", c.net_coalesce_max_us, 0, 10_000_000),
        ("capture.net_tcp_sample_us", c.net_tcp_sample_us, 0, 10_000_000),
        ("capture.sched_min_offcpu_us", c.sched_min_offcpu_us, 0, 10_000_000),
    )
    for dotted, value, least, most in limits:
        if not least <= value <= most:
            raise bad(f"must be in {least}..{most}, got {value}", dotted)
    for key in ("gpu_sample_hz", "fabric_sample_hz"):
        hz = getattr(c, key)
        if not 0.1 <= hz <= 1000:
            raise bad(f"must be in 0.1..1000, got {hz}", f"capture.{key}")


def _validate_fabric(cfg: Config, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """The [fabric] and [irq] sections: bounds on the series they may create."""
    for pattern in cfg.fabric.nic_interfaces:
        if not pattern.strip():
            raise bad(
                "must hold interface names or shell patterns, not ''", "fabric.nic_interfaces"
            )
    limits = (
        ("fabric.max_stats_per_interface", cfg.fabric.max_stats_per_interface, 0, 65536),
        ("irq.max_irq_cpu_series", cfg.irq.max_irq_cpu_series, 0, 1_000_000),
    )
    for dotted, value, least, most in limits:
        if not least <= value <= most:
            raise bad(f"must be in {least}..{most}, got {value}", dotted)


def _validate_budget(b: BudgetSection, bad: typing.Callable[[str, str], ConfigError]) -> None:
    """The [budget] section: a share of one CPU, a memory size, a run-statistics schedule."""
    if not 0.0005 <= b.cpu_ratio <= 1.0:
        raise bad(
            f"must be a share of one CPU in 0.0005..1 (0.01 = 1 %), got {b.cpu_ratio}",
            "budget.cpu_ratio",
        )
    if b.rss_bytes < 32 * 1024 * 1024:
        raise bad(f"must be at least 33554432 (32 MiB), got {b.rss_bytes}", "budget.rss_bytes")
    if not 0.05 <= b.stats_window_s <= b.stats_period_s:
        raise bad(
            "must be at least 0.05 s and at most budget.stats_period_s", "budget.stats_window_s"
        )
    if b.stats_period_s > 60:
        raise bad("must be at most 60 s", "budget.stats_period_s")
    if b.stats_rest_period_s and not b.stats_period_s <= b.stats_rest_period_s <= 60:
        raise bad(
            "must be 0 (a window every period) or from budget.stats_period_s to 60 s",
            "budget.stats_rest_period_s",
        )
    if b.restore_after_s < 1:
        raise bad("must be at least 1 second", "budget.restore_after_s")
