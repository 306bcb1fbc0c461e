"""``bpfdyno ps``: the agent's process table, over gRPC (``Kernel.ListProcesses``).

``--json`` writes the ``ListProcessesResponse`` with the .proto field names; fields that hold
their default are written too, unknown values (an unset ``optional`` field) are left out.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import textwrap

from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_target_argument,
    default_target,
)
from bpfdyno.client.pods import PodNotFound, add_pod_argument, pod_processes
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
    add_pod_argument(p, "only the processes of this Kubernetes pod")
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

    flt = " ".join(t for t in (args.filter, f"pod={args.pod}" if args.pod else "") if t)

    async def show(agent: AgentClient) -> int:
        table = await agent.processes(args.sort, args.limit, flt)
        if args.pod and not table.processes:
            try:  # why none: the pod is not here, or its name is not known here
                await pod_processes(agent, args.pod)
            except PodNotFound as e:
                print(f"bpfdyno ps: {e}", file=sys.stderr)
                return EXIT_FAIL
        if args.json:
            print_json(record_dict(table, with_defaults=True))
        else:
            sys.stdout.write(format_table(table))
        return EXIT_OK

    return with_agent(args.target or default_target(), show, refused=EXIT_USAGE)


#: (title, width, whether shown only when some row has a value). Narrow enough that the
#: table and some of each command fit 80 columns; the command gets the rest of the line.
_COLUMNS = (
    ("PID", 7, False),
    # A container's processes: the pid they know themselves by in their own namespace.
    ("NS PID", 7, True),
    ("USER", 8, False),
    ("CPU%", 6, False),
    ("RSS", 6, False),
    *((title, 5, False) for title, _ in THREAD_COLUMNS),
    ("TX/s", 6, False),
    ("RX/s", 6, False),
    ("RETX/s", 6, True),
    ("JOB", 8, True),
    ("CONTAINER", 12, True),
)
#: The command gets at least this many characters, however narrow the terminal.
MIN_COMMAND = 12


def format_table(table: ProcessList, width: int | None = None) -> str:
    """A fixed-width table of the agent's process table ("-" marks unknown values), each line
    at most ``width`` characters (default: the terminal's, 80 when there is none): the
    namespace pid, retransmit, job and container columns only when some row has a value
    there, then as much of the command as fits."""
    width = width or shutil.get_terminal_size().columns
    rows = []
    for r in table.processes:
        retx = r.tcp_retransmits_per_second
        rows.append(
            (
                str(r.pid),
                str(r.ns_pid) if r.ns_pid else "-",
                r.user[:8],
                _pct(r.cpu_ratio),
                human_bytes(r.rss_bytes),
                *(threads_text(getattr(r, field)) for _, field in THREAD_COLUMNS),
                _rate(r.tcp_tx_bytes_per_second),
                _rate(r.tcp_rx_bytes_per_second),
                "-" if math.isnan(retx) else f"{retx:.1f}",
                r.slurm_job_id or "-",
                r.container_id[:12] or "-",
            )
        )
    shown = [
        i
        for i, (_, _, optional) in enumerate(_COLUMNS)
        if not optional or any(row[i] not in ("-", "0.0") for row in rows)
    ]

    def line(cells: tuple[str, ...]) -> str:
        return "".join(
            f"{cells[i]:<{_COLUMNS[i][1]}} "
            if _COLUMNS[i][0] == "USER"  # the one column of words, left-aligned
            else f"{cells[i]:>{_COLUMNS[i][1]}} "
            for i in shown
        )

    titles = tuple(title for title, _, _ in _COLUMNS)
    hidden: list[str] = []
    # On a narrow terminal the optional columns go, last first (NS PID, the first of them,
    # last of all), before the command shrinks below MIN_COMMAND characters; the footer says
    # which (--json has every field).
    optional = [i for i in shown if _COLUMNS[i][2]]
    while width - len(line(titles)) < MIN_COMMAND and optional:
        gone = optional.pop()
        shown.remove(gone)
        hidden.insert(0, titles[gone])
    header = line(titles)
    room = max(MIN_COMMAND, width - len(header))
    lines = [header + "COMMAND"]
    for r, cells in zip(table.processes, rows, strict=True):
        lines.append(line(cells) + (("*" if r.pinned else "") + r.command)[:room])
    footer = f"{len(table.processes)} of {table.total_processes} processes ({THREAD_COLUMNS_NOTE})"
    if hidden:
        footer += f"; not shown on {width} columns: {', '.join(hidden)} (--json has them)"
    if table.unavailable:
        footer += "; unavailable: " + "; ".join(f"{k}: {v}" for k, v in table.unavailable.items())
    lines += textwrap.wrap(footer, width)
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
