"""``bpfdyno doctor``: can I use the running agent, and what this machine supports for one,
each missing part with the exact fix for where bpfdyno runs."""

from __future__ import annotations

import argparse
import os

from bpfdyno.cli.serve import add_config_argument, config_or_say
from bpfdyno.client.connection import EXIT_USAGE
from bpfdyno.client.errors import TARGET_ENV


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``doctor`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser("doctor", help="check what this machine supports, with fixes")
    add_config_argument(p)
    p.add_argument(
        "--socket", help=f"the agent's gRPC socket (default: ${TARGET_ENV} or the config's)"
    )
    p.add_argument(
        "--machine",
        action="store_true",
        help="also check what this machine supports for running an agent when one answers "
        "(root: always)",
    )
    p.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run ``bpfdyno doctor``: 0 when the agent answers (or, without one, when nothing an agent
    requires is missing here), 1 otherwise."""
    from bpfdyno.app.doctor import agent_checks, exit_code, format_checks, run_checks

    cfg = config_or_say(args)
    if cfg is None:
        return EXIT_USAGE
    target = args.socket or os.environ.get(TARGET_ENV) or cfg.grpc.socket
    report = agent_checks(target)
    if report is None:
        checks = run_checks(cfg)
    else:
        checks = list(report.checks)
        if args.machine or os.geteuid() == 0:
            checks += run_checks(cfg, agent_ports=report.held_ports)
    print(format_checks(checks))
    return exit_code(checks)
