"""``bpfdyno doctor``: what this machine supports, each missing part with its exact fix."""

from __future__ import annotations

import argparse
import sys

from bpfdyno.cli.serve import add_config_argument, load_config
from bpfdyno.client.connection import EXIT_USAGE
from bpfdyno.core.config import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``doctor`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser("doctor", help="check what this machine supports, with fixes")
    add_config_argument(p)
    p.add_argument("--socket", help="gRPC Unix socket path to check")
    p.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run ``bpfdyno doctor``: 0 when nothing required is missing, 1 if something is."""
    from bpfdyno.app.doctor import exit_code, format_checks, run_checks

    try:
        cfg = load_config(args)
    except ConfigError as e:
        print(f"bpfdyno: config error: {e}", file=sys.stderr)
        return EXIT_USAGE
    checks = run_checks(cfg)
    print(format_checks(checks))
    return exit_code(checks)
