"""What ``gputrace`` and ``top`` share for a whole job: the options that name its nodes, the
node lookup (`bpfdyno.client.cluster`), and the report of a job-wide trace.

Not a command group: `bpfdyno.cli.tracing` and `bpfdyno.cli.top` use it.

A command works on a whole job when ``--hosts`` or ``--hosts-file`` is given, or when a job id
is given without ``--host``/``--socket`` (nor ``$BPFDYNO_TARGET``): the job's nodes then come
from SLURM. With ``--host``/``--socket`` it talks to that one agent, as before.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bpfdyno.analysis.verdict import verdict_text
from bpfdyno.cli.output import print_json
from bpfdyno.client.cluster import (
    DEFAULT_AGENT_PORT,
    FanOut,
    HostOutcome,
    HostTrace,
    JobOutcome,
    JobRef,
    JobTraceResult,
    Node,
    NodeResolutionError,
    SchedulerUnavailable,
    parse_hosts,
    read_hosts_file,
    resolve_slurm_job,
    trace_job,
)
from bpfdyno.client.cluster.fanout import DEFAULT_CONCURRENCY, DEFAULT_HOST_TIMEOUT_S
from bpfdyno.client.cluster.jobtrace import JOB_ATTEMPTS, hosts_failed_alike, summarize
from bpfdyno.client.connection import EXIT_FAIL, EXIT_OK, EXIT_USAGE
from bpfdyno.client.errors import TARGET_ENV, ClientSetupError, ErrorKind
from bpfdyno.core.config import DEFAULT_CONFIG_PATH, ConfigError, load
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.rpc.wire import record_dict

#: Exit status of a job-wide command when some hosts succeeded and others did not.
EXIT_PARTIAL = 3


class ClusterUsageError(Exception):
    """The options cannot name a job's nodes; the message says what to write instead."""


class NoScheduler(ClusterUsageError):
    """A job id without --hosts, and no scheduler answers here to name the job's nodes."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def job_cluster(args: argparse.Namespace, command: str) -> Cluster | None:
    """The nodes of a job-wide ``command`` (`resolve_cluster`), or None when no scheduler
    answers and the job id means this node's agent instead (`this_node_instead`).

    Raises:
        ClusterUsageError: the options cannot name the job's nodes (its message says why).
    """
    try:
        return resolve_cluster(args)
    except NoScheduler as e:
        if this_node_instead(args, e, command):
            return None
        raise


def this_node_instead(args: argparse.Namespace, err: NoScheduler, command: str) -> bool:
    """Whether ``--job-id`` may mean this node's agent because no scheduler answers (what
    dyno users mean by it: the trainers of that job here); prints the one-line note if so.

    A job named with ``--hosts``, or an array task / het component (only SLURM knows their
    processes' ids), keeps its job-wide meaning and its error.
    """
    job = str(args.job_id or "").strip()
    if args.hosts is not None or args.hosts_file is not None or not job.isdigit():
        return False
    print(
        f"bpfdyno {command}: no scheduler answers here ({err.reason}): job {job} on this "
        "node's agent only; for every node of the job run it where SLURM answers, or name "
        "the nodes with --hosts h1,h2",
        file=sys.stderr,
    )
    return True


@dataclass(frozen=True, slots=True)
class Cluster:
    """The nodes a job-wide command works on.

    Attributes:
        nodes: each agent to ask.
        job: the job as the user named it ("" when only hosts were given).
        job_id: the job id to ask for on nodes that list none of their own.
        source: where the nodes came from, for the report (``SLURM`` or the hosts option).
        not_running: parts of the job without nodes (pending array tasks...).
        timeout_s: deadline of each host's call.
        concurrency: most hosts asked at once.
    """

    nodes: tuple[Node, ...]
    job: str
    job_id: int
    source: str
    not_running: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_HOST_TIMEOUT_S
    concurrency: int = DEFAULT_CONCURRENCY

    def fanout(self) -> FanOut:
        """A `FanOut` over the nodes with these settings.

        Raises:
            ClientSetupError: the TLS/token environment variables are unusable.
        """
        return FanOut(self.nodes, timeout_s=self.timeout_s, concurrency=self.concurrency)


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """``--hosts``, ``--hosts-file``, ``--port``, ``--config``, ``--host-timeout``,
    ``--concurrency``: where a job's agents are and how to ask them."""
    g = parser.add_argument_group(
        "whole job (a job id without --host, or --hosts/--hosts-file)",
        "Every node of the job is asked at once over gRPC TCP (TLS and token from "
        "$BPFDYNO_TLS_CA, $BPFDYNO_TOKEN_FILE...). The nodes come from SLURM unless given.",
    )
    g.add_argument(
        "--hosts", default=None, help="the job's nodes: HOST[:PORT],HOST[:PORT],... (not SLURM)"
    )
    g.add_argument(
        "--hosts-file", type=Path, default=None, help="the job's nodes, one per line ('#' comments)"
    )
    g.add_argument(
        "--port",
        type=int,
        default=None,
        help="the agents' gRPC TCP port (default: the port of [grpc] tcp in the config file, "
        f"else {DEFAULT_AGENT_PORT})",
    )
    g.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config file to take the port from (default: {DEFAULT_CONFIG_PATH} if it exists)",
    )
    g.add_argument(
        "--host-timeout",
        type=float,
        default=DEFAULT_HOST_TIMEOUT_S,
        help="seconds each agent has to answer",
    )
    g.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="most agents asked at once",
    )


def cluster_requested(args: argparse.Namespace) -> bool:
    """Whether the options ask for a whole job rather than one agent."""
    if args.hosts is not None or args.hosts_file is not None:
        return True
    job = str(args.job_id or "0").strip()
    return job != "0" and args.target is None and not os.environ.get(TARGET_ENV)


def agent_port(args: argparse.Namespace) -> int:
    """``--port``, else the port of ``[grpc] tcp`` in the config file, else the default.

    Raises:
        ClusterUsageError: a bad port, or an unreadable config file.
    """
    if args.port is not None:
        if not 0 < args.port < 65536:
            raise ClusterUsageError(f"--port {args.port}: give a port in 1..65535")
        return int(args.port)
    path = args.config
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = DEFAULT_CONFIG_PATH
    if path is None:
        return DEFAULT_AGENT_PORT
    try:
        # Only the port: the agent's TLS key and token files are not the caller's to read.
        tcp = load(path, validate=False).grpc.tcp
    except ConfigError as e:
        raise ClusterUsageError(f"cannot take the agents' port from the config: {e}") from e
    if not tcp:
        return DEFAULT_AGENT_PORT
    port = tcp.rpartition(":")[2]
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterUsageError(
            f"cannot take the agents' port from the config: [grpc] tcp = {tcp!r} is not "
            "host:port; fix it, or give --port"
        )
    return int(port)


def resolve_cluster(args: argparse.Namespace) -> Cluster:
    """The nodes the options name: ``--hosts``/``--hosts-file``, else the job's from SLURM.

    Raises:
        ClusterUsageError: conflicting options, a bad job id, no SLURM and no hosts...
    """
    if args.target is not None:
        raise ClusterUsageError(
            "--host/--socket names one agent and --hosts/--hosts-file the agents of a job: "
            "give one or the other"
        )
    if args.host_timeout <= 0:
        raise ClusterUsageError("--host-timeout must be above 0 seconds")
    if args.concurrency < 1:
        raise ClusterUsageError("--concurrency must be at least 1")
    port = agent_port(args)
    job = str(args.job_id or "0").strip()
    try:
        ref = JobRef.parse(job)
        if args.hosts is not None or args.hosts_file is not None:
            if not ref.plain:
                raise ClusterUsageError(
                    f"--job-id {job} with --hosts: the hosts' agents match the numeric "
                    "$SLURM_JOB_ID the processes carry; for an array task that is its own id "
                    f"(`squeue -h -j {job} -o %A`), for a heterogeneous job the leader's"
                )
            nodes: list[Node] = []
            if args.hosts is not None:
                nodes += parse_hosts(args.hosts, port)
            if args.hosts_file is not None:
                nodes += read_hosts_file(args.hosts_file, port)
            unique = tuple({n.target: n for n in nodes}.values())
            source = "--hosts" if args.hosts_file is None else "--hosts-file"
            return Cluster(
                unique,
                job if job != "0" else "",
                ref.job,
                source,
                timeout_s=args.host_timeout,
                concurrency=args.concurrency,
            )
        slurm = resolve_slurm_job(ref, port)
    except SchedulerUnavailable as e:
        raise NoScheduler(str(e), e.reason) from e
    except NodeResolutionError as e:
        raise ClusterUsageError(str(e)) from e
    return Cluster(
        slurm.nodes,
        job,
        ref.job,
        "SLURM",
        slurm.not_running,
        timeout_s=args.host_timeout,
        concurrency=args.concurrency,
    )


# -- gputrace for a whole job ------------------------------------------------------------------


def run_job_trace(
    args: argparse.Namespace, spec: TraceSpec, wait_s: float, cluster: Cluster
) -> int:
    """``bpfdyno gputrace`` over every node of a job; returns the exit status.

    0: every host traced; 3 (`EXIT_PARTIAL`): some did, others failed; 1: none did; 2: bad
    options, or a request every agent refused for the same rule.
    """
    if spec.pids:
        print(
            "bpfdyno: --pids are per machine; a job-wide trace takes every process of the job "
            "on each node (use --host for one machine's pids)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        fanout = cluster.fanout()
    except ClientSetupError as e:
        print(f"bpfdyno: {e}", file=sys.stderr)
        return EXIT_USAGE
    spec = replace(spec, job_id=cluster.job_id)
    report = None if args.json else _ProgressPrinter(cluster)
    if report is not None:
        report.header(spec)

    async def run() -> JobTraceResult:
        async with fanout:
            return await trace_job(
                fanout,
                spec,
                wait=args.wait,
                wait_s=wait_s,
                on_progress=report.progress if report is not None else None,
            )

    result = asyncio.run(run())
    if args.json:
        print_json(job_trace_dict(cluster, result))
    else:
        assert report is not None
        report.final(result)
    return job_trace_exit_status(result)


def job_trace_exit_status(result: JobTraceResult) -> int:
    """0 all hosts, 3 some, 1 none; 2 when every host refused the request for one rule."""
    if result.outcome is JobOutcome.ALL:
        return EXIT_OK
    if result.outcome is JobOutcome.SOME_FAILED:
        return EXIT_PARTIAL
    same = hosts_failed_alike(result)
    if same is not None and same.kind is ErrorKind.REFUSED:
        return EXIT_USAGE
    return EXIT_FAIL


def _clock_text(h: HostTrace) -> str:
    if h.clock is None:
        return "-"
    c = h.clock
    return f"{c.offset_s * 1e3:+.1f}ms ±{c.uncertainty_s * 1e3:.1f}"


def _clock_ms(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


class _ProgressPrinter:
    """Prints a job trace as it goes: the plan, each host's answer, each file's progress."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._states: dict[tuple[str, int], str] = {}
        self._table_printed = False
        self._attempt = 1

    def header(self, spec: TraceSpec) -> None:
        c = self.cluster
        what = f"job {c.job}" if c.job else "the given hosts"
        names = ", ".join(n.name for n in c.nodes[:8]) + (" ..." if len(c.nodes) > 8 else "")
        print(f"{what}: {len(c.nodes)} node(s) from {c.source}: {names}", flush=True)
        for part in c.not_running:
            print(f"  not running, left out: {part}", flush=True)
        if spec.iteration_mode:
            print(
                f"iteration trace of {spec.iterations} step(s), starting on every rank at the "
                f"next multiple of {spec.profile_start_iteration_roundup}",
                flush=True,
            )
            if spec.profile_start_iteration_roundup == 1 and len(c.nodes) > 1:
                print(
                    "  (each rank starts at its first step after it gets the config, up to one "
                    "poll apart; --profile-start-iteration-roundup N, N above the steps of one "
                    "poll interval, starts every rank at the same step)",
                    flush=True,
                )

    def progress(self, result: JobTraceResult) -> None:
        if result.attempt != self._attempt and result.earlier:
            self._attempt = result.attempt
            self._states.clear()
            self._table_printed = False
            print(format_job_again(result), flush=True)
        if not self._table_printed and all(h.requests or h.error is not None for h in result.hosts):
            self._table_printed = True
            print(format_job_start(result), flush=True)
        if not result.waited or not self._table_printed:
            return
        for h in result.hosts:
            for f in h.files():
                key = (h.node.name, f.pid)
                if f.state != "triggered" and self._states.get(key) != f.state:
                    self._states[key] = f.state
                    print(
                        f"  {time.strftime('%H:%M:%S')} {h.node.name} pid {f.pid}: {f.state}"
                        f" — {f.reason}",
                        flush=True,
                    )

    def final(self, result: JobTraceResult) -> None:
        if not self._table_printed:
            print(format_job_start(result))
        if result.waited:
            for earlier in result.earlier:
                print(format_job_files(earlier))
            print(format_job_files(result))
        print(format_job_outcome(result))
        if result.verdict is not None:
            print(verdict_text(result.verdict))


def format_job_start(result: JobTraceResult) -> str:
    """The common start, and a table of what each host did with the request."""
    spec = result.spec
    lines = []
    if not spec.iteration_mode and spec.profile_start_time_ms:
        ahead = spec.profile_start_time_ms / 1000 - time.time()
        lines.append(
            f"duration trace of {spec.duration_ms} ms, starting at "
            f"{_clock_ms(spec.profile_start_time_ms)} (in {max(0.0, ahead):.1f} s) on every "
            f"host's clock (PROFILE_START_TIME={spec.profile_start_time_ms})"
        )
    width = max([4, *(len(h.node.name) for h in result.hosts)])
    lines.append(
        f"{'HOST':<{width}}  {'CLOCK OFFSET':<16}{'MATCHED':>8}{'TRIGGERED':>10}{'BUSY':>5}  "
        f"{'RESULT':<12}TRACE"
    )
    for h in result.hosts:
        counts = (
            f"{h.matched:>8}{h.triggered:>10}{h.busy:>5}"
            if h.error is None
            else f"{'-':>8}{'-':>10}{'-':>5}"
        )
        outcome = h.outcome.value.replace("_", " ")
        if h.outcome is HostOutcome.IN_PROGRESS:
            outcome = "triggered"  # the files' fate follows
        traces = ",".join(h.trace_ids) or "-"
        lines.append(f"{h.node.name:<{width}}  {_clock_text(h):<16}{counts}  {outcome:<12}{traces}")
    same = hosts_failed_alike(result)
    if same is not None and len(result.hosts) > 1:
        lines.append(f"every host: {same.message}")
    else:
        for h in result.hosts:
            if h.outcome is not HostOutcome.OK and h.reason:
                lines.append(f"  {h.node.name} ({h.node.target}): {h.reason}")
    files = [f for f in result.files()]
    if files and not result.waited:
        lines.append("Trace files that will be written:")
        lines += [f"  {f.host} pid {f.pid:>8} (job {f.job_id}): {f.path}" for f in files]
    return "\n".join(lines)


def format_job_again(result: JobTraceResult) -> str:
    """Why the job is traced again: the ranks whose Kineto dropped the last try's config."""
    last = result.earlier[-1]
    dropped = last.dropped()
    who = ", ".join(f"{f.host} pid {f.pid}" for f in dropped[:4])
    more = f" and {len(dropped) - 4} more" if len(dropped) > 4 else ""
    return (
        f"try {last.attempt}: Kineto dropped the config of {who}{more} (it never started "
        f"tracing: stalled or too busy at its warm-up tick), so the ranks share no window; "
        f"tracing the whole job again (try {result.attempt} of at most {JOB_ATTEMPTS}) with "
        "a new common start"
    )


def format_job_files(result: JobTraceResult) -> str:
    """Per host and process: state, size and path, once the traces are over."""
    tries = result.attempt > 1 or bool(result.dropped())
    lines = [f"Trace files (try {result.attempt}):" if tries else "Trace files:"]
    for h in result.hosts:
        for f in h.files():
            size = f"{f.size_bytes} bytes" if f.size_bytes is not None else "-"
            lines.append(f"  {f.host} pid {f.pid:>8} {f.state:<10} {size:>14}  {f.path}")
            if f.state != "written":
                lines.append(f"  {'':>{len(f.host) + 13}} {f.reason}")
    if len(lines) == 1:
        lines.append("  none")
    return "\n".join(lines)


def format_job_outcome(result: JobTraceResult) -> str:
    """One line: how many hosts were traced, and the exit status that says so."""
    counts = summarize(result.hosts)
    total = len(result.hosts)
    ok = counts[HostOutcome.OK]
    if result.outcome is JobOutcome.ALL:
        return f"all {total} host(s) traced"
    failed = ", ".join(
        f"{n} {o.value.replace('_', ' ')}"
        for o, n in counts.items()
        if n and o is not HostOutcome.OK
    )
    if result.outcome is JobOutcome.SOME_FAILED:
        return f"{ok} of {total} host(s) traced; {failed} (exit {EXIT_PARTIAL})"
    return f"no host traced: {failed} (exit {job_trace_exit_status(result)})"


def job_trace_dict(cluster: Cluster, result: JobTraceResult) -> dict[str, Any]:
    """The ``--json`` document of a job-wide trace (API field names, numbers as numbers)."""
    counts = summarize(result.hosts)
    return {
        "job": cluster.job,
        "nodes_from": cluster.source,
        "not_running": list(cluster.not_running),
        "outcome": result.outcome.value,
        "request": record_dict(result.spec),
        "hosts": [_host_dict(h) for h in result.hosts],
        "summary": {"hosts": len(result.hosts), **{o.value: n for o, n in counts.items()}},
        **({"verdict": record_dict(result.verdict)} if result.verdict is not None else {}),
        "attempt": result.attempt,
        # The tries before this one (a rank's Kineto dropped its config): their own
        # request (start time, log file) and files.
        "earlier_attempts": [
            {
                "attempt": e.attempt,
                "outcome": e.outcome.value,
                "request": record_dict(e.spec),
                "hosts": [_host_dict(h) for h in e.hosts],
            }
            for e in result.earlier
        ],
    }


def _host_dict(h: HostTrace) -> dict[str, Any]:
    out: dict[str, Any] = {
        "host": h.node.name,
        "target": h.node.target,
        "job_ids": list(h.node.job_ids),
        "outcome": h.outcome.value,
        "reason": h.reason,
    }
    if h.clock is not None:
        out["clock_offset_seconds"] = h.clock.offset_s
        out["round_trip_seconds"] = h.clock.round_trip_s
    if h.error is not None:
        out["error"] = {"kind": h.error.kind.value, "message": h.error.message}
    out["requests"] = [
        {
            "job_id": r.job_id,
            "response": record_dict(r.start),
            **({"trace": record_dict(r.final)} if r.final is not None else {}),
        }
        for r in h.requests
    ]
    out["files"] = [
        {
            "pid": f.pid,
            "job_id": f.job_id,
            "path": f.path,
            "state": f.state,
            "reason": f.reason,
            "config_dropped": f.config_dropped,
            **({"size_bytes": f.size_bytes} if f.size_bytes is not None else {}),
        }
        for f in h.files()
    ]
    return out
