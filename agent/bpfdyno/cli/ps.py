"""``bpfdyno ps``: the agent's process table, over gRPC (``Kernel.ListProcesses``).

``--json`` writes the ``ListProcessesResponse`` with the .proto field names; fields that hold
their default are written too, unknown values (an unset ``optional`` field) are left out.
"""

from __future__ import annotations

import argparse
import math
import sys

from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import EXIT_OK, EXIT_USAGE, add_target_argument, default_target
from bpfdyno.rpc.processes import (
    DEFAULT_SORT,
    FILTER_KEYS,
    SORT_KEYS,
    THREAD_COLUMNS,
    THREAD_COLUMNS_NOTE,
    ProcessList,
    QueryError,
    sort_key,
    threads_text,
)
from bpfdyno.rpc.wire import record_dict


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``ps`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser(
        "ps", help="the most active processes, with CPU, scheduler, network and job columns"
    )
    add_target_argument(p)
    p.add_argument(
        "--sort",
        default=DEFAULT_SORT,
        type=_sort_word,
        metavar="KEY",
        help=f"sort key, one of {', '.join(k.name for k in SORT_KEYS)}, or a short name "
        "(cpu, rss, net, retransmits, ...); default: activity = CPU plus network traffic",
    )
    p.add_argument("--limit", type=int, default=30, help="rows to show, 0 for all (default 30)")
    p.add_argument(
        "--filter",
        default="",
        help="terms that must all match: "
        + ", ".join(f"{k}=" for k in FILTER_KEYS)
        + ", or a word found in the command",
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_ps)


def _sort_word(word: str) -> str:
    """A ``--sort`` word the API knows, as given (the agent and the UI accept the same ones)."""
    try:
        sort_key(word)
    except QueryError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return word


def cmd_ps(args: argparse.Namespace) -> int:
    """Run ``bpfdyno ps``; returns the exit status."""
    if args.limit < 0:
        print("bpfdyno ps: --limit must be 0 (all) or positive", file=sys.stderr)
        return EXIT_USAGE
    # The word as given, not its canonical form: an older agent knows only the older words.

    async def show(agent: AgentClient) -> int:
        table = await agent.processes(args.sort, args.limit, args.filter)
        if args.json:
            print_json(record_dict(table, with_defaults=True))
        else:
            sys.stdout.write(format_table(table))
        return EXIT_OK

    return with_agent(args.target or default_target(), show, refused=EXIT_USAGE)


_COLUMNS = (
    ("PID", 8),
    ("USER", 10),
    ("CPU%", 7),
    ("RSS", 8),
    *((title, 6) for title, _ in THREAD_COLUMNS),
    ("TCP TX/s", 10),
    ("TCP RX/s", 10),
    ("RETX/s", 7),
    ("JOB", 8),
    ("CONTAINER", 13),
)


def format_table(table: ProcessList) -> str:
    """A fixed-width table of the agent's process table ("-" marks unknown values)."""
    header = "".join(
        f"{name:>{w}} " if i != 1 else f"{name:<{w}} " for i, (name, w) in enumerate(_COLUMNS)
    )
    lines = [header + "COMMAND"]
    for r in table.processes:
        retx = r.tcp_retransmits_per_second
        cells = (
            str(r.pid),
            r.user[:10],
            _pct(r.cpu_ratio),
            human_bytes(r.rss_bytes),
            *(threads_text(getattr(r, field)) for _, field in THREAD_COLUMNS),
            _rate(r.tcp_tx_bytes_per_second),
            _rate(r.tcp_rx_bytes_per_second),
            "-" if math.isnan(retx) else f"{retx:.1f}",
            r.slurm_job_id or "-",
            r.container_id[:12] or "-",
        )
        row = "".join(
            f"{c:>{w}} " if i != 1 else f"{c:<{w}} "
            for i, (c, (_, w)) in enumerate(zip(cells, _COLUMNS, strict=True))
        )
        lines.append(row + ("*" if r.pinned else "") + r.command[:120])
    footer = f"{len(table.processes)} of {table.total_processes} processes ({THREAD_COLUMNS_NOTE})"
    if table.unavailable:
        footer += "; unavailable: " + "; ".join(f"{k}: {v}" for k, v in table.unavailable.items())
    lines.append(footer)
    return "\n".join(lines) + "\n"


def _pct(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{100 * ratio:.1f}"


def _rate(bytes_per_second: float) -> str:
    return "-" if math.isnan(bytes_per_second) else human_bytes(bytes_per_second)


def human_bytes(n: float) -> str:
    """Bytes with a binary unit suffix: 999B, 1.5K, 12M, 3.0G."""
    value = float(n)
    for unit in ("B", "K", "M", "G", "T"):
        if abs(value) < 1024 or unit == "T":
            if unit == "B":
                return f"{value:.0f}B"
            return f"{value:.1f}{unit}" if abs(value) < 10 else f"{value:.0f}{unit}"
        value /= 1024
    return f"{value:.0f}T"
