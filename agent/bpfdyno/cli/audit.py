"""`bpfdyno audit`: the agent's audit trail of trace requests (root sees all, others their own).

``--json`` writes the ``ListAuditRecordsResponse`` with the .proto field names.
"""

from __future__ import annotations

import argparse
import time

from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import EXIT_OK, add_target_argument, default_target
from bpfdyno.rpc.audit import AuditRecord
from bpfdyno.rpc.wire import record_dict


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``audit`` to ``bpfdyno``."""
    p = subparsers.add_parser(
        "audit", help="who asked the agent for which traces, and what it decided"
    )
    add_target_argument(p)
    p.add_argument("--since", type=int, default=0, help="only records after this sequence number")
    p.add_argument("--limit", type=int, default=100, help="most records shown (newest)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_audit)


def cmd_audit(args: argparse.Namespace) -> int:
    """Run ``bpfdyno audit``; returns the exit status."""

    async def show(agent: AgentClient) -> int:
        records = await agent.audit(max(0, args.since), max(0, args.limit))
        if args.json:
            print_json({"records": [record_dict(r) for r in records]} if records else {})
        elif not records:
            print("No audit records visible to you (root sees every user's; others their own).")
        else:
            print("\n".join(format_record(r) for r in records))
        return EXIT_OK

    return with_agent(str(args.target or default_target()), show)


def format_record(r: AuditRecord) -> str:
    """One record: when, who, from where, what was decided, and on which processes."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.ts_unix_seconds))
    who = f"uid {r.uid}" if r.uid is not None else "unattributed"
    if r.user:
        who += f" ({r.user})"
    decision = r.decision if not r.rule else f"{r.decision} [{r.rule}]"
    line = f"#{r.seq} {when} {r.action} by {who} via {r.transport} {r.peer}: {decision}"
    if r.trace_id:
        line += f" trace {r.trace_id}"
    details = [f"    {r.message}"] if r.message else []
    for p in r.processes:
        owner = f"uid {p.uid}" if p.uid is not None else "unknown owner"
        details.append(f"    pid {p.pid} ({owner}) -> {p.output_path}")
    return "\n".join([line, *details])
