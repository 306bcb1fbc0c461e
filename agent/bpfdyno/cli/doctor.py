"""``bpfdyno doctor``: what this machine supports, each missing part with its exact fix."""

from __future__ import annotations

import argparse

from bpfdyno.cli.serve import add_config_argument, config_or_say
from bpfdyno.client.connection import EXIT_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``doctor`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser("doctor", help="check what this machine supports, with fixes")
    add_config_argument(p)
    p.add_argument("--socket", help="gRPC Unix socket path to check")
    p.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run ``bpfdyno doctor``: 0 when nothing required is missing, 1 if something is."""
    from bpfdyno.app.doctor import exit_code, format_checks, run_checks

    cfg = config_or_say(args)
    if cfg is None:
        return EXIT_USAGE
    checks = run_checks(cfg)
    print(format_checks(checks))
    return exit_code(checks)
