"""`bpfdyno events [--watch] [--json] [--job-id ID]`: straggling and hung ranks the agent
found by itself (docs/detection.md).

Without ``--watch`` it prints the events the agent holds and exits; with it, those and then
every new one as it happens, until interrupted. ``--json`` writes each event as one line with
the .proto field names.
"""

from __future__ import annotations

import argparse
import time

from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import EXIT_OK, EXIT_USAGE, add_target_argument, default_target
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.wire import record_dict


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``events`` to ``bpfdyno``."""
    p = subparsers.add_parser(
        "events", help="straggling and hung training ranks the agent noticed by itself"
    )
    add_target_argument(p)
    p.add_argument("--job-id", default="", help="only this job's events")
    p.add_argument("--watch", action="store_true", help="keep printing new events as they come")
    p.add_argument("--json", action="store_true", help="print each event as one JSON line")
    p.set_defaults(handler=cmd_events)


def cmd_events(args: argparse.Namespace) -> int:
    """Run ``bpfdyno events``; returns the exit status."""

    def show(e: DetectionEvent) -> None:
        if args.json:
            print_json(record_dict(e), indent=False)
        else:
            print(format_event(e), flush=True)

    async def run(agent: AgentClient) -> int:
        if args.watch:
            async for e in agent.watch_detection_events(args.job_id):
                show(e)
            return EXIT_OK
        events = await agent.detection_events(args.job_id)
        if not events and not args.json:
            print("No detection events: no rank stood out and no job hung.")
        for e in events:
            show(e)
        return EXIT_OK

    try:
        return with_agent(str(args.target or default_target()), run, refused=EXIT_USAGE)
    except KeyboardInterrupt:
        return EXIT_OK


def format_event(e: DetectionEvent) -> str:
    """When, where, what: one line, then a hung rank's threads and the evidence."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.unix_seconds))
    lines = [f"{when} {e.host} {e.kind.value.upper()}: {e.summary}"]
    for ev in e.evidence:
        lines.append(f"    {ev.name} {ev.value:.3f} (job median {ev.job_median:.3f})")
    if e.kind is DetectionKind.HANG:
        for t in e.threads:
            doing = t.syscall + (f" on a {t.waiting_on}" if t.waiting_on else "")
            lines.append(
                f"    tid {t.tid} {t.comm} {t.state} {doing or '-'} wchan {t.wchan or '-'}"
                f" off-CPU {t.offcpu_seconds:.0f} s, CPU share {t.oncpu_share:.2f}"
            )
    # The automatic trace's verdict, as gputrace prints it, and its files.
    lines += [f"    {line}" for line in e.verdict_text.splitlines()]
    lines += [f"    file: {path}" for path in e.trace_files]
    return "\n".join(lines)
