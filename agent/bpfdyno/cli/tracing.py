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
from collections.abc import Callable
from typing import Any

import grpc

from bpfdyno.cli.cluster import add_cluster_arguments, cluster_requested, run_job_trace
from bpfdyno.cli.output import message_dict, print_json, report_rpc_error
from bpfdyno.client.connection import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_target_argument,
    channel,
    default_target,
)
from bpfdyno.core.errors import InvalidArgument
from bpfdyno.core.identity import user_name
from bpfdyno.core.rules import pause_duration_s
from bpfdyno.rpc.kernel_tracks import describe_kernel_tracks
from bpfdyno.rpc.traces import TraceSpec, spec_to_pb
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc

#: How long `gputrace --wait` waits when --timeout is not given.
DEFAULT_WAIT_S = 120.0
#: dyno's defaults, which `TraceSpec` holds.
_DEFAULT = TraceSpec()


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``trainers``, ``gputrace``, ``dcgm-pause`` and ``dcgm-resume`` to ``bpfdyno``."""
    p = subparsers.add_parser("trainers", help="list the PyTorch processes registered for tracing")
    add_target_argument(p)
    p.add_argument("--job-id", type=int, default=None, help="only this job's trainers")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_trainers)

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
    p.add_argument(
        "--duration-ms",
        type=int,
        default=_DEFAULT.duration_ms,
        help="duration of the trace in ms",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=_DEFAULT.iterations,
        help="trace this many iterations (> 0) instead",
    )
    p.add_argument("--log-file", required=True, help="trace file (Kineto inserts _<pid>)")
    p.add_argument(
        "--profile-start-time",
        type=int,
        default=_DEFAULT.profile_start_time_ms,
        help="epoch ms to start at (0 = ~7 s)",
    )
    p.add_argument(
        "--profile-start-iteration-roundup",
        type=int,
        default=_DEFAULT.profile_start_iteration_roundup,
        help="start an iteration trace at a multiple of this",
    )
    p.add_argument(
        "--process-limit",
        type=int,
        default=_DEFAULT.process_limit,
        help="most processes to trace",
    )
    p.add_argument("--record-shapes", action="store_true", help="record operator input shapes")
    p.add_argument("--profile-memory", action="store_true", help="profile memory")
    p.add_argument("--with-stacks", action="store_true", help="record Python stacks")
    p.add_argument("--with-flops", action="store_true", help="estimate operator FLOPs")
    p.add_argument("--with-modules", action="store_true", help="record nn.Module hierarchy")
    p.add_argument(
        "--fail-on-no-process", action="store_true", help="exit 1 when no process matched"
    )
    p.add_argument(
        "--kernel-tracks",
        default="",
        metavar="TRACKS",
        help="kernel tracks merged into each file: some of net,sched,nccl,gpu, or all, or none "
        "(default: the agent's [capture] default_tracks)",
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


def _target(args: argparse.Namespace) -> str:
    return str(args.target or default_target())


def _state(value: int, enum: Any, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()


def _ago(ts: float) -> str:
    return f"{max(0.0, time.time() - ts):.1f}s ago"


# -- trainers -------------------------------------------------------------------------------


def cmd_trainers(args: argparse.Namespace) -> int:
    """Run ``bpfdyno trainers``; returns the exit status."""
    target = _target(args)
    req = pb.ListTrainersRequest()
    if args.job_id is not None:
        req.job_id = args.job_id
    try:
        with channel(target) as ch:
            resp = pb_grpc.TracingStub(ch).ListTrainers(req, timeout=5)
    except grpc.RpcError as e:
        return report_rpc_error(e, target)
    if args.json:
        print_json(message_dict(resp))
        return EXIT_OK
    if not resp.trainers:
        print(_no_trainers_hint())
        return EXIT_OK
    print(format_trainers(resp.trainers))
    return EXIT_OK


def format_trainers(trainers: Any) -> str:
    """A table of registered trainers."""
    lines = [
        f"{'PID':>8} {'JOB':>10} {'STATE':<15}{'ROLE':<12}{'OWNER':<12}{'POLLS':>6}  "
        f"{'LAST POLL':<11}{'TRACE':<17}ANCESTORS"
    ]
    for t in trainers:
        state = _state(t.state, pb.TrainerState, "TRAINER_STATE_")
        role = _state(t.role, pb.TrainerRole, "TRAINER_ROLE_")
        owner = (user_name(t.uid) or str(t.uid)) if t.HasField("uid") else "?"
        lines.append(
            f"{t.pid:>8} {t.job_id:>10} {state:<15}{role:<12}{owner:<12}{t.polls:>6}  "
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
    if not cluster_requested(args) and not job_id.isdigit():
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
        duration_ms=args.duration_ms,
        iterations=args.iterations,
        profile_start_time_ms=args.profile_start_time,
        profile_start_iteration_roundup=args.profile_start_iteration_roundup,
        record_shapes=args.record_shapes,
        profile_memory=args.profile_memory,
        with_stacks=args.with_stacks,
        with_flops=args.with_flops,
        with_modules=args.with_modules,
        process_limit=args.process_limit,
        pids=() if pids == [0] else tuple(pids),
        job_id=int(job_id) if job_id.isdigit() else 0,
        timeout_seconds=wait_s if (args.wait or args.timeout is not None) else 0.0,
        kernel_tracks=args.kernel_tracks,
        pre_window_seconds=args.pre_window_s,
    )
    if cluster_requested(args):
        return run_job_trace(args, spec, wait_s)
    target = _target(args)
    try:
        with channel(target) as ch:
            stub = pb_grpc.TracingStub(ch)
            try:
                resp = stub.StartTrace(spec_to_pb(spec), timeout=10)
            except grpc.RpcError as e:
                if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.INVALID_ARGUMENT:
                    print(f"bpfdyno: trace request rejected: {e.details()}", file=sys.stderr)
                    return EXIT_USAGE
                raise
            if not args.json:
                print(format_start(resp), flush=True)
            final = None
            if args.wait and resp.triggered:
                final = _wait(stub, resp.trace_id, wait_s, quiet=args.json)
    except grpc.RpcError as e:
        return report_rpc_error(e, target)
    if args.json:
        out: dict[str, Any] = {"request": message_dict(resp)}
        if final is not None:
            out["trace"] = message_dict(final)
        print_json(out)
    elif final is not None:
        print(format_final(final))
    if not resp.processes_matched and args.fail_on_no_process:
        return EXIT_FAIL
    if final is not None and any(
        p.state != pb.PROCESS_TRACE_STATE_WRITTEN for p in final.processes
    ):
        return EXIT_FAIL
    return EXIT_OK


def _wait(stub: pb_grpc.TracingStub, trace_id: str, wait_s: float, quiet: bool) -> Any:
    """Follow the trace until done or ``wait_s`` (plus a little, for the agent's verdict)."""
    last: Any = None
    stream = stub.WatchTrace(pb.GetTraceRequest(trace_id=trace_id), timeout=wait_s + 5)
    try:
        for status in stream:
            if not quiet:
                _print_changes(last, status)
            last = status
            if status.done:
                break
    except grpc.RpcError as e:
        if not (isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED):
            raise
        last = stub.GetTrace(pb.GetTraceRequest(trace_id=trace_id), timeout=5)
    finally:
        stream.cancel()
    return last


def _print_changes(before: Any, now: Any) -> None:
    old = {p.pid: p.state for p in before.processes} if before is not None else {}
    for p in now.processes:
        if old.get(p.pid) != p.state:
            state = _state(p.state, pb.ProcessTraceState, "PROCESS_TRACE_STATE_")
            print(f"  {time.strftime('%H:%M:%S')} pid {p.pid}: {state} — {p.reason}", flush=True)


def format_start(resp: Any) -> str:
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


def format_final(status: Any) -> str:
    """Per process: state, size and path, once the trace is over (or the wait timed out)."""
    lines = [f"trace {status.trace_id}: {'done' if status.done else 'still open'}"]
    for p in status.processes:
        state = _state(p.state, pb.ProcessTraceState, "PROCESS_TRACE_STATE_")
        size = f"{p.size_bytes} bytes" if p.size_bytes >= 0 else "-"
        lines.append(f"  pid {p.pid:>8} {state:<10} {size:>14}  {p.output_path}")
        if p.state != pb.PROCESS_TRACE_STATE_WRITTEN:
            lines.append(f"  {'':>12} {p.reason}")
        tracks = describe_kernel_tracks(p.kernel_tracks)
        if tracks:
            lines.append(f"  {'':>12} {tracks}")
    return "\n".join(lines)


# -- dcgm -----------------------------------------------------------------------------------


def _dcgm(args: argparse.Namespace, call: Callable[[pb_grpc.TracingStub], Any]) -> int:
    target = _target(args)
    try:
        with channel(target) as ch:
            resp = call(pb_grpc.TracingStub(ch))
    except grpc.RpcError as e:
        return report_rpc_error(e, target)
    print(
        f"status: {'true' if resp.status else 'false'}"
        + (f" ({resp.reason})" if resp.reason else "")
    )
    return EXIT_OK if resp.status else EXIT_FAIL


def cmd_dcgm_pause(args: argparse.Namespace) -> int:
    """Run ``bpfdyno dcgm-pause``; returns the exit status."""
    try:
        pause_duration_s(args.duration_s)  # the agent's own rule: fail fast, same words
    except InvalidArgument as e:
        print(f"bpfdyno: {e}", file=sys.stderr)
        return EXIT_USAGE
    return _dcgm(
        args, lambda s: s.DcgmPause(pb.DcgmPauseRequest(duration_s=args.duration_s), timeout=5)
    )


def cmd_dcgm_resume(args: argparse.Namespace) -> int:
    """Run ``bpfdyno dcgm-resume``; returns the exit status."""
    return _dcgm(args, lambda s: s.DcgmResume(pb.DcgmResumeRequest(), timeout=5))
