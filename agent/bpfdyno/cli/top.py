"""``bpfdyno top``: the terminal UI (`bpfdyno.tui`).

One agent (the local one, ``--socket`` or ``--host``), or every node of a job: a job id
without ``--host``, or ``--hosts``/``--hosts-file``, shows one row per node
(`bpfdyno.tui.cluster_app`), any of which opens into the one-agent view.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bpfdyno.cli.cluster import (
    Cluster,
    ClusterUsageError,
    add_cluster_arguments,
    cluster_requested,
    job_cluster,
)
from bpfdyno.client.connection import EXIT_USAGE, add_target_argument
from bpfdyno.client.errors import ClientSetupError
from bpfdyno.client.pods import add_pod_argument


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``top`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser(
        "top", help="live terminal UI of this machine (or of every node of a job)"
    )
    add_target_argument(p)
    p.add_argument(
        "--job-id",
        default=None,
        help="every node of this SLURM job, one row each (with --host: only this job's "
        "processes and trainers on that agent)",
    )
    add_pod_argument(p, "only the processes and trainers of this Kubernetes pod")
    p.add_argument("--replay", type=Path, default=None, help="replay a recording (demos)")
    p.add_argument(
        "--demo",
        action="store_true",
        help="replay the recording shipped with bpfdyno: a real node with one NVIDIA H200 "
        "under a training load (no agent needed)",
    )
    p.add_argument("--speed", type=float, default=1.0, help="replay speed")
    add_cluster_arguments(p)
    p.set_defaults(handler=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    """Run ``bpfdyno top`` until the user quits; returns the exit status."""
    if args.demo:
        from bpfdyno.tui.recorded import demo_recording

        args.replay = demo_recording()
    if args.pod and (args.replay is not None or cluster_requested(args)):
        print(
            "bpfdyno top: --pod shows one pod on one agent: leave out --replay, --demo and "
            "--hosts, and give --host (the pod's node's agent) with --job-id",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.replay is None and cluster_requested(args):
        try:
            cluster = job_cluster(args, "top")
        except ClusterUsageError as e:
            print(f"bpfdyno top: {e}", file=sys.stderr)
            return EXIT_USAGE
        if cluster is not None:
            return _cluster_top(cluster)
    # Imported here: Textual takes a while to load, and only this command needs it.
    from bpfdyno.tui.app import run_top

    return run_top(
        args.target, args.job_id, replay=args.replay, speed=args.speed, pod=args.pod or ""
    )


def _cluster_top(cluster: Cluster) -> int:
    from bpfdyno.tui.cluster_app import run_cluster_top
    from bpfdyno.tui.cluster_source import ClusterDataSource

    try:
        source = ClusterDataSource(
            cluster.nodes,
            job=cluster.job,
            job_id=cluster.job_id,
            origin=cluster.source,
            timeout_s=cluster.timeout_s,
            concurrency=cluster.concurrency,
        )
    except ClientSetupError as e:
        print(f"bpfdyno top: {e}", file=sys.stderr)
        return EXIT_USAGE
    return run_cluster_top(source)
