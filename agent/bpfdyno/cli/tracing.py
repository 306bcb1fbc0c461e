"""`bpfdyno trainers`, `gputrace`, `dcgm-pause`, `dcgm-resume`: the tracing commands.

`gputrace` takes every flag of ``dyno gputrace`` with the same defaults and meaning, and adds
``--wait`` (follow the trace until every triggered process has written its file), ``--host``
and ``--json``. Unlike dyno it prints only the files that will really be written — those of
the processes that were triggered — with Kineto's real names, and when nothing matched it
lists the registered trainers and why each did not match. Given a job id without ``--host``
(or with ``--hosts``), it traces every node of the job at once (`bpfdyno.cli.cluster`).

``--json`` writes the API's messages with the .proto field names: ``trainers`` the
``ListTrainersResponse``, ``gputrace`` ``{"request": StartTraceResponse}`` plus, with
``--wait``, ``"trace": TraceStatus``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from bpfdyno.cli.cluster import (
    ClusterUsageError,
    add_cluster_arguments,
    cluster_requested,
    job_cluster,
    run_job_trace,
)
from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_target_argument,
    default_target,
)
from bpfdyno.client.errors import AgentError, ErrorKind
from bpfdyno.client.pods import PodNotFound, add_pod_argument, pod_processes
from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.identity import user_name
from bpfdyno.core.k8s_jobs import check_job_name, job_id_of
from bpfdyno.core.rules import pause_duration_s
from bpfdyno.rpc.traces import (
    PROFILER_SWITCHES,
    DcgmResult,
    ProcessTraceState,
    TraceSpec,
    TraceStart,
    TraceStatus,
    Trainer,
)
from bpfdyno.rpc.wire import record_dict

#: How long `gputrace --wait` waits when --timeout is not given.
DEFAULT_WAIT_S = 120.0
#: dyno's defaults, which `TraceSpec` holds.
_DEFAULT = TraceSpec()
#: ``gputrace``'s numbers that are `TraceSpec` fields as they are, with dyno's flags:
#: (flag, field, help), defaulting to the spec's defaults. The switches are
#: `PROFILER_SWITCHES` (``--record-shapes``...), off by default.
SPEC_NUMBERS = (
    ("--duration-ms", "duration_ms", "duration of the trace in ms"),
    ("--iterations", "iterations", "trace this many iterations (> 0) instead"),
    ("--profile-start-time", "profile_start_time_ms", "epoch ms to start at (0 = ~7 s)"),
    (
        "--profile-start-iteration-roundup",
        "profile_start_iteration_roundup",
        "start an iteration trace at a multiple of this",
    ),
    ("--process-limit", "process_limit", "most processes to trace"),
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``trainers``, ``gputrace``, ``dcgm-pause`` and ``dcgm-resume`` to ``bpfdyno``."""
    p = subparsers.add_parser("trainers", help="list the PyTorch processes registered for tracing")
    add_target_argument(p)
    p.add_argument("--job-id", type=int, default=None, help="only this job's trainers")
    add_job_name_argument(p, "only the trainers of this Kubernetes training job")
    add_pod_argument(p, "only the trainers running in this Kubernetes pod")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_trainers)

    p = subparsers.add_parser(
        "kineto-dir",
        help="print your own Kineto socket directory (the agent makes it if needed)",
        description="Print the directory to give your trainers as KINETO_IPC_SOCKET_DIR: "
        "your own, mode 0700, where only you and root can reach their sockets. Needs an "
        "agent with [kineto] user_socket_root set. `bpfdyno run` uses it for you.",
    )
    add_target_argument(p)
    p.add_argument(
        "--uid", type=int, default=None, help="whose directory (root only; default: yours)"
    )
    p.set_defaults(handler=cmd_kineto_dir)

    p = subparsers.add_parser(
        "gputrace",
        help="trace PyTorch processes on demand (dyno gputrace flags, plus --wait)",
    )
    add_target_argument(p)
    p.add_argument(
        "--job-id",
        default=str(_DEFAULT.job_id),
        help="job id of the processes to trace; without --host, every node of the job "
        "(SLURM: 1234, an array task 1234_5, a het component 1234+1)",
    )
    p.add_argument("--pids", default="0", help="pids to trace, comma separated; 0 = all in job")
    add_pod_argument(p, "trace the trainers running in this Kubernetes pod (on this node)")
    add_job_name_argument(p, "trace this Kubernetes training job's trainers (as --job-id)")
    p.add_argument(
        "--log-file",
        default="",
        help="trace file (Kineto inserts _<pid>); default: a timestamped name in your own "
        "trace directory on each node (/var/tmp/bpfdyno/USER, [tracing] user_dirs)",
    )
    for flag, field, help_text in SPEC_NUMBERS:
        default = getattr(_DEFAULT, field)
        p.add_argument(flag, dest=field, type=int, default=default, help=help_text)
    for field, _, help_text in PROFILER_SWITCHES:
        p.add_argument(f"--{field.replace('_', '-')}", action="store_true", help=help_text)
    p.add_argument(
        "--fail-on-no-process", action="store_true", help="exit 1 when no process matched"
    )
    p.add_argument(
        "--kernel-tracks",
        default="",
        metavar="TRACKS",
        help="kernel tracks merged into each file: some of net,sched,nccl,gpu,fabric, or all, "
        "or none (default: the agent's [capture] default_tracks)",
    )
    p.add_argument(
        "--pre-window-s",
        type=float,
        default=None,
        metavar="S",
        help="add the rare network events of this many seconds before the request (default: "
        "the agent's [capture] pre_window_s)",
    )
    p.add_argument(
        "--wait", action="store_true", help="wait until every triggered process wrote its file"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds to follow the trace (default: {DEFAULT_WAIT_S:g} with --wait)",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    add_cluster_arguments(p)
    p.set_defaults(handler=cmd_gputrace)

    p = subparsers.add_parser("dcgm-pause", help="pause GPU profiling metrics (for Nsight and co.)")
    add_target_argument(p)
    p.add_argument("--duration-s", type=int, default=300, help="seconds to pause")
    p.set_defaults(handler=cmd_dcgm_pause)

    p = subparsers.add_parser("dcgm-resume", help="resume GPU profiling metrics")
    add_target_argument(p)
    p.set_defaults(handler=cmd_dcgm_resume)


def add_job_name_argument(p: argparse.ArgumentParser, help_text: str) -> None:
    """``--job NAME``: a Kubernetes training job by name (PyTorchJob, TrainJob, JobSet)."""
    p.add_argument(
        "--job",
        default=None,
        type=_job_name,
        metavar="NAME",
        help=f"{help_text}: its name (PyTorchJob, TrainJob, JobSet; see docs/deployment.md)",
    )


def _job_name(word: str) -> str:
    try:
        return check_job_name(word)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _target(args: argparse.Namespace) -> str:
    return str(args.target or default_target())


def _ago(ts: float) -> str:
    return f"{max(0.0, time.time() - ts):.1f}s ago"


# -- trainers -------------------------------------------------------------------------------


def cmd_trainers(args: argparse.Namespace) -> int:
    """Run ``bpfdyno trainers``; returns the exit status."""

    job_id = args.job_id
    if args.job is not None:
        if job_id is not None:
            print("bpfdyno: give --job or --job-id, not both", file=sys.stderr)
            return EXIT_USAGE
        job_id = job_id_of(args.job)

    async def show(agent: AgentClient) -> int:
        trainers = await agent.trainers(job_id)
        if args.pod:
            try:
                trainers = (await pod_processes(agent, args.pod)).trainers(trainers)
            except PodNotFound as e:
                print(f"bpfdyno: {e}", file=sys.stderr)
                return EXIT_FAIL
        if args.json:
            # The same shape whether or not a trainer is registered.
            print_json({"trainers": [record_dict(t) for t in trainers]})
        elif not trainers:
            print(_no_trainers_hint())
        else:
            print(format_trainers(trainers))
        return EXIT_OK

    return with_agent(_target(args), show)


def cmd_kineto_dir(args: argparse.Namespace) -> int:
    """Run ``bpfdyno kineto-dir``; returns the exit status."""

    async def show(agent: AgentClient) -> int:
        print(await agent.kineto_socket_dir(args.uid))
        return EXIT_OK

    return with_agent(_target(args), show)


def format_trainers(trainers: Sequence[Trainer]) -> str:
    """A table of registered trainers."""
    # PID is the process here (what ps, top and the kernel tracks name); NS PID the pid it
    # reports from a pid namespace of its own (a container), which its file names use.
    lines = [
        f"{'PID':>8} {'NS PID':>7} {'JOB':>10} {'STATE':<15}{'ROLE':<12}{'OWNER':<12}"
        f"{'POLLS':>6}  {'LAST POLL':<11}{'TRACE':<17}ANCESTORS"
    ]
    for t in trainers:
        role = t.role or "unknown"
        owner = (user_name(t.uid) or str(t.uid)) if t.uid is not None else "?"
        ns_pid = str(t.pid) if t.host_pid and t.host_pid != t.pid else "-"
        # A Kubernetes job by its name (its derived id is in --json).
        job = t.job_name or str(t.job_id)
        lines.append(
            f"{t.host_pid or t.pid:>8} {ns_pid:>7} {job:>10} {t.state:<15}{role:<12}"
            f"{owner:<12}{t.polls:>6}  "
            f"{_ago(t.last_poll_unix_seconds):<11}{t.trace_id or '-':<17}"
            f"{','.join(str(a) for a in t.ancestors)}"
        )
    return "\n".join(lines)


def _no_trainers_hint() -> str:
    return (
        "No trainers are registered with the agent. Start the PyTorch job with "
        "KINETO_USE_DAEMON=1 (and, if KINETO_IPC_SOCKET_DIR is set for it, the same "
        "directory as the agent's [kineto] socket_dir); a process registers when it imports "
        "torch and polls every few seconds."
    )


# -- gputrace -------------------------------------------------------------------------------


def _parse_pids(text: str) -> list[int]:
    pids = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise ValueError(f"--pids {text!r}: expected comma-separated pids such as 12,34")
        pids.append(int(part))
    return pids


def cmd_gputrace(args: argparse.Namespace) -> int:
    """Run ``bpfdyno gputrace``; returns the exit status."""
    try:
        pids = _parse_pids(args.pids)
    except ValueError as e:
        print(f"bpfdyno: {e}", file=sys.stderr)
        return EXIT_USAGE
    job_id = args.job_id.strip()
    if args.job is not None:
        if job_id != str(_DEFAULT.job_id):
            print("bpfdyno: give --job or --job-id, not both", file=sys.stderr)
            return EXIT_USAGE
        # The id the agents give the job's trainers (on every node: the same number).
        job_id = args.job_id = str(job_id_of(args.job))
    if args.pod and (pids != [0] or args.hosts is not None or args.hosts_file is not None):
        print(
            "bpfdyno: --pod picks the trainers of one pod on one node: leave out --pids, "
            "--hosts and --hosts-file (--host names the pod's node's agent)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if not (cluster_requested(args) and not args.pod) and not job_id.isdigit():
        print(
            f"bpfdyno: --job-id {job_id!r}: one agent (--host) matches the numeric "
            "$SLURM_JOB_ID of its processes; leave out --host to trace a SLURM job, array "
            "task or het component on all its nodes",
            file=sys.stderr,
        )
        return EXIT_USAGE
    # Durations, limits and paths are checked by the agent (the same rules for every entry
    # point); a refusal comes back as INVALID_ARGUMENT and exits 2 below.
    wait_s = args.timeout if args.timeout is not None else DEFAULT_WAIT_S
    spec = TraceSpec(
        log_file=args.log_file,
        **{field: getattr(args, field) for _, field, _ in SPEC_NUMBERS},
        **{field: getattr(args, field) for field, _, _ in PROFILER_SWITCHES},
        pids=() if pids == [0] else tuple(pids),
        job_id=int(job_id) if job_id.isdigit() else 0,
        timeout_seconds=wait_s if (args.wait or args.timeout is not None) else 0.0,
        kernel_tracks=args.kernel_tracks,
        pre_window_seconds=args.pre_window_s,
    )
    if cluster_requested(args) and not args.pod:
        try:
            cluster = job_cluster(args, "gputrace")
        except ClusterUsageError as e:
            print(f"bpfdyno: {e}", file=sys.stderr)
            return EXIT_USAGE
        if cluster is not None:
            return run_job_trace(args, spec, wait_s, cluster)

    async def trace(agent: AgentClient) -> int:
        request = spec
        if args.pod:
            try:
                ours = (await pod_processes(agent, args.pod)).trainers(await agent.trainers())
            except PodNotFound as e:
                print(f"bpfdyno: {e}", file=sys.stderr)
                return EXIT_FAIL
            if not ours:
                print(
                    f"bpfdyno: pod {args.pod} runs here, but none of its processes is "
                    "registered for tracing: start its trainers with KINETO_USE_DAEMON=1 and "
                    "the agent's Kineto socket directory mounted (bpfdyno trainers lists "
                    "who is registered)",
                    file=sys.stderr,
                )
                return EXIT_FAIL
            # By their pids here: the pids they report are their pod's, which others share.
            request = replace(spec, pids=tuple(sorted(t.host_pid or t.pid for t in ours)))
        try:
            started = await agent.start_trace(request, timeout_s=10)
        except AgentError as e:
            if e.kind is not ErrorKind.REFUSED:
                raise
            print(f"bpfdyno: trace request rejected: {e.details}", file=sys.stderr)
            return EXIT_USAGE
        if not args.json:
            print(format_start(started), flush=True)
        final = None
        said: dict[int, ProcessTraceState] = {}
        if args.wait and started.triggered:
            async for final in agent.follow_trace(started.trace_id, wait_s):
                if not args.json:
                    _print_changes(said, final)
        if args.json:
            out: dict[str, Any] = {"request": record_dict(started)}
            if final is not None:
                out["trace"] = record_dict(final)
            print_json(out)
        elif final is not None:
            print(format_final(final))
        if not started.processes_matched and args.fail_on_no_process:
            return EXIT_FAIL
        if started.busy and not started.triggered:
            # Nothing will be written: say it in the exit status too (scripts, --wait).
            if not args.json:
                print(
                    "bpfdyno: nothing was traced: every matched process is busy; try again "
                    "when its trace is written (bpfdyno trainers shows each one's state)",
                    file=sys.stderr,
                )
            return EXIT_FAIL
        if final is not None and final.count(ProcessTraceState.WRITTEN) < len(final.processes):
            return EXIT_FAIL
        return EXIT_OK

    return with_agent(_target(args), trace)


def _print_changes(said: dict[int, ProcessTraceState], now: TraceStatus) -> None:
    """Say each process whose state is not the one ``said`` holds for it (then hold it)."""
    for p in now.processes:
        if said.get(p.pid) != p.state:
            said[p.pid] = p.state
            print(f"  {time.strftime('%H:%M:%S')} pid {p.pid}: {p.state} — {p.reason}", flush=True)


def format_start(resp: TraceStart) -> str:
    """What a trace request did, in words: triggered files, busy and skipped processes."""
    lines = [
        f"trace {resp.trace_id}: matched {len(resp.processes_matched)}, triggered "
        f"{len(resp.triggered)}, busy {len(resp.busy)}, over the limit {len(resp.over_limit)}"
    ]
    if resp.triggered:
        lines.append("Trace files that will be written:")
        lines += [f"  pid {p.pid:>8} (job {p.job_id}): {p.output_path}" for p in resp.triggered]
    for title, items in (("Busy (not traced):", resp.busy), ("Not traced:", resp.over_limit)):
        if items:
            lines.append(title)
            lines += [f"  pid {s.pid:>8} (job {s.job_id}): {s.reason}" for s in items]
    if not resp.processes_matched:
        lines.append("No processes were matched.")
        if resp.not_matched:
            lines.append("Registered trainers, and why each did not match:")
            lines += [f"  pid {s.pid:>8} (job {s.job_id}): {s.reason}" for s in resp.not_matched]
        else:
            lines.append(_no_trainers_hint())
    return "\n".join(lines)


def format_final(status: TraceStatus) -> str:
    """Per process: state, size and path, once the trace is over (or the wait timed out)."""
    lines = [f"trace {status.trace_id}: {'done' if status.done else 'still open'}"]
    for p in status.processes:
        size = f"{p.size_bytes} bytes" if p.size_bytes >= 0 else "-"
        lines.append(f"  pid {p.pid:>8} {p.state:<10} {size:>14}  {p.output_path}")
        if p.state is not ProcessTraceState.WRITTEN:
            lines.append(f"  {'':>12} {p.reason}")
        tracks = p.kernel_tracks.describe()
        if tracks:
            lines.append(f"  {'':>12} {tracks}")
    return "\n".join(lines)


# -- dcgm -----------------------------------------------------------------------------------


def _dcgm(args: argparse.Namespace, call: Callable[[AgentClient], Awaitable[DcgmResult]]) -> int:
    async def ask(agent: AgentClient) -> int:
        resp = await call(agent)
        print(
            f"status: {'true' if resp.status else 'false'}"
            + (f" ({resp.reason})" if resp.reason else "")
        )
        return EXIT_OK if resp.status else EXIT_FAIL

    return with_agent(_target(args), ask)


def cmd_dcgm_pause(args: argparse.Namespace) -> int:
    """Run ``bpfdyno dcgm-pause``; returns the exit status."""
    try:
        pause_duration_s(args.duration_s)  # the agent's own rule: fail fast, same words
    except InvalidArgument as e:
        print(f"bpfdyno: {e}", file=sys.stderr)
        return EXIT_USAGE
    return _dcgm(args, lambda agent: agent.dcgm_pause(args.duration_s))


def cmd_dcgm_resume(args: argparse.Namespace) -> int:
    """Run ``bpfdyno dcgm-resume``; returns the exit status."""
    return _dcgm(args, lambda agent: agent.dcgm_resume())
