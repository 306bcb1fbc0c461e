"""``bpfdyno serve``: run the daemon; and the ``--config`` / ``--set`` options it shares."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from bpfdyno.client.connection import EXIT_FAIL, EXIT_USAGE
from bpfdyno.core.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``serve`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser("serve", help="run the daemon (as root)")
    add_config_argument(p)
    p.add_argument("--socket", help="gRPC Unix socket path (grpc.socket)")
    p.add_argument("--tcp", help="also serve gRPC on HOST:PORT (grpc.tcp)")
    p.add_argument("--interval", type=float, help="collection interval in seconds")
    p.add_argument(
        "--jsonl", metavar="PATH", help="write metrics as JSON lines to PATH ('-' = stdout)"
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    add_overrides_argument(
        p, "override any config value (repeatable), e.g. --set collectors.gpu.enabled=false"
    )
    p.set_defaults(handler=cmd_serve)


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--config FILE`` option (dest ``config``) of the commands that read the config."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML config file (default: {DEFAULT_CONFIG_PATH} if it exists)",
    )


def add_overrides_argument(parser: argparse.ArgumentParser, help: str) -> None:
    """The repeatable ``--set SECTION.KEY=VALUE`` option (dest ``overrides``)."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help=help,
    )


def config_or_say(args: argparse.Namespace) -> Config | None:
    """`load_config`, or None after saying on stderr what is wrong with the config."""
    try:
        return load_config(args)
    except ConfigError as e:
        print(f"bpfdyno: config error: {e}", file=sys.stderr)
        return None


def load_config(args: argparse.Namespace) -> Config:
    """The config a command's options name: its file, then ``--set`` and the option overrides.

    Raises:
        ConfigError: an unreadable file, an unknown key or a bad value (the message says which).
    """
    path = args.config
    if path is None and DEFAULT_CONFIG_PATH.exists():
        path = DEFAULT_CONFIG_PATH
    overrides: list[tuple[str, str]] = []
    for item in getattr(args, "overrides", []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE", "command line")
        overrides.append((key.strip(), value.strip()))
    for attr, key in (
        ("socket", "grpc.socket"),
        ("tcp", "grpc.tcp"),
        ("interval", "daemon.interval_s"),
        ("log_level", "daemon.log_level"),
    ):
        value = getattr(args, attr, None)
        if value is not None:
            overrides.append((key, repr(value) if not isinstance(value, str) else f'"{value}"'))
    jsonl = getattr(args, "jsonl", None)
    if jsonl is not None:
        overrides += [("export.jsonl.enabled", "true"), ("export.jsonl.path", f'"{jsonl}"')]
    return load(path, overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run ``bpfdyno serve`` until SIGTERM/SIGINT; returns the exit status."""
    from bpfdyno.app.serve import AddressInUse, run

    cfg = config_or_say(args)
    if cfg is None:
        return EXIT_USAGE
    logging.basicConfig(
        level=cfg.daemon.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return asyncio.run(run(cfg))
    except AddressInUse as e:
        print(f"bpfdyno: {e}", file=sys.stderr)
        return EXIT_FAIL
    except ConfigError as e:  # a TLS/token file that became unreadable after validation
        print(f"bpfdyno: config error: {e}", file=sys.stderr)
        return EXIT_USAGE
