"""``python -m bpfdyno.tui``: run the UI without the full CLI (development and demos)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bpfdyno.tui.app import run_top


def main() -> int:
    """Parse the few options of the UI and run it."""
    p = argparse.ArgumentParser(prog="python -m bpfdyno.tui", description="bpfdyno top")
    p.add_argument("--socket", "--host", dest="target", help="agent socket path or HOST:PORT")
    p.add_argument("--job-id", help="show only this SLURM job's processes and trainers")
    p.add_argument("--replay", type=Path, help="replay a recording instead of connecting")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed (default 1)")
    args = p.parse_args()
    return run_top(args.target, args.job_id, replay=args.replay, speed=args.speed)


if __name__ == "__main__":
    raise SystemExit(main())
