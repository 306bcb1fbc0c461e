"""``bpfdyno top``: the terminal UI (`bpfdyno.tui`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bpfdyno.client.connection import add_target_argument


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``top`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser(
        "top", help="live terminal UI of this machine, its GPUs and processes"
    )
    add_target_argument(p)
    p.add_argument("--job-id", default=None, help="show only this job's processes and trainers")
    p.add_argument("--replay", type=Path, default=None, help="replay a recording (demos)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed")
    p.set_defaults(handler=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    """Run ``bpfdyno top`` until the user quits; returns the exit status."""
    # Imported here: Textual takes a while to load, and only this command needs it.
    from bpfdyno.tui.app import run_top

    return run_top(args.target, args.job_id, replay=args.replay, speed=args.speed)
