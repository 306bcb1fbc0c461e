"""The ``bpfdyno`` command line: the parser and the dispatch, nothing else.

Each command group lives in its own module with a ``register(subparsers)`` that adds its
subcommands and sets each one's ``handler`` (parsed args -> exit status) with
``set_defaults``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bpfdyno.cli import (
    agent,
    audit,
    doctor,
    events,
    ps,
    run,
    serve,
    timeline,
    top,
    trace_summary,
    tracing,
)
from bpfdyno.client.connection import EXIT_OK
from bpfdyno.version import __version__

#: The command groups, in the order ``bpfdyno --help`` lists them.
COMMAND_GROUPS = (
    serve, agent, doctor, ps, events, tracing, trace_summary, timeline, audit, top, run
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The ``bpfdyno`` parser with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="bpfdyno",
        description="eBPF monitoring and on-demand PyTorch tracing agent (dynolog-compatible).",
    )
    parser.add_argument("--version", action="version", version=f"bpfdyno {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``bpfdyno`` command; returns its exit status."""
    args = build_parser().parse_args(argv)
    try:
        status: int = args.handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `bpfdyno ps | head`: the reader has all it wanted
        return EXIT_OK
    return status


if __name__ == "__main__":
    raise SystemExit(main())
