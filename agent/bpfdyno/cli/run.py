"""``bpfdyno run -- CMD``: run a job step (a SLURM task) with an agent on its node."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bpfdyno.cli.serve import add_config_argument, add_overrides_argument
from bpfdyno.client.connection import EXIT_USAGE
from bpfdyno.core.config import DEFAULT_SOCKET


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``run`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser(
        "run",
        help="run a command (a SLURM task) with an agent on this node",
        description="Run CMD with KINETO_USE_DAEMON=1. If the node's agent is not running, "
        "the first task starts one for all of this user's tasks on the node (once, under a "
        "lock) and the last one to end stops it. Exits with CMD's status.",
    )
    add_config_argument(p)
    p.add_argument(
        "--node-socket",
        default=DEFAULT_SOCKET,
        help=f"where the node's agent listens, if it runs (default: {DEFAULT_SOCKET})",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="socket, locks and log of an agent started here, a directory only you can use "
        "(default: /run/bpfdyno/job for root, else $XDG_RUNTIME_DIR/bpfdyno or "
        "$TMPDIR/bpfdyno-UID, created mode 0700)",
    )
    add_overrides_argument(p, "config override for an agent started here (repeatable)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(handler=cmd_run)


def cmd_run(args: argparse.Namespace) -> int:
    """Run the command; returns its exit status."""
    from bpfdyno.app.job_agent import default_state_dir, run

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        print(
            "bpfdyno run: no command given; usage: bpfdyno run [OPTIONS] -- CMD [ARGS...]",
            file=sys.stderr,
        )
        return EXIT_USAGE
    serve_args: list[str] = []
    if args.config is not None:
        serve_args += ["--config", str(args.config)]
    for item in args.overrides:
        serve_args += ["--set", item]
    state_dir = args.state_dir or default_state_dir()
    return run(cmd, node_socket=args.node_socket, state_dir=state_dir, serve_args=serve_args)
