"""``bpfdyno status``, ``version`` and ``metrics``: the agent itself, over gRPC (``Agent``).

``status --json`` writes the ``Status`` message with protobuf's JSON names
(``agentUptimeSeconds``, states as ``COLLECTOR_STATE_OK``); ``metrics --json`` writes one
object per collection round: ``{"ts", "collector", "series": [{"name", "labels", "value",
"unit"}]}``, values in the metric's own unit (ratios as ratios). For people, ``metrics``
shows ratios in percent, as top and nvidia-smi do, and a name that matches no metric is an
error that says how names and patterns work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time

from bpfdyno.cli.output import print_json, with_agent
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.connection import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_target_argument,
    default_target,
)
from bpfdyno.core.store import matches_any
from bpfdyno.rpc.agent import MetricSpec, MetricsSnapshot
from bpfdyno.rpc.wire import message_dict, to_pb
from bpfdyno.version import __version__


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``status``, ``version`` and ``metrics`` to the ``bpfdyno`` command line."""
    p = subparsers.add_parser("status", help="agent version, uptime and each collector's state")
    add_target_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_status)

    p = subparsers.add_parser("version", help="print the version")
    p.set_defaults(handler=cmd_version)

    p = subparsers.add_parser("metrics", help="latest metrics from the agent")
    add_target_argument(p)
    p.add_argument("names", nargs="*", help="metric names or prefixes ending in '*'")
    p.add_argument("--watch", action="store_true", help="print every new collection round")
    p.add_argument("--json", action="store_true", help="print JSON (one object per round)")
    p.set_defaults(handler=cmd_metrics)


def cmd_version(args: argparse.Namespace) -> int:
    """Run ``bpfdyno version``; returns the exit status."""
    print(f"bpfdyno {__version__}")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """Run ``bpfdyno status``; returns the exit status."""

    async def show(agent: AgentClient) -> int:
        st = await agent.status()
        if args.json:
            print_json(message_dict(to_pb(st), proto_names=False))
            return EXIT_OK
        print(f"bpfdyno {st.version} on {st.hostname} (kernel {st.kernel_release}), pid {st.pid}")
        print(
            f"agent up {_duration(st.agent_uptime_seconds)}, host up "
            f"{_duration(st.host_uptime_seconds)}, config {st.config_source}"
        )
        # As wide as the longest name and state, so no two columns ever run together.
        nw = max([len("COLLECTOR"), *(len(c.name) for c in st.collectors)]) + 2
        sw = max([len("STATE"), *(len(str(c.state)) for c in st.collectors)]) + 2
        print(
            f"{'COLLECTOR':<{nw}}{'STATE':<{sw}}{'INTERVAL':>9}{'ROUNDS':>9}{'ERRORS':>8}  REASON"
        )
        for c in st.collectors:
            interval = f"{c.interval_seconds:.2f}s" if c.interval_seconds else "-"
            rounds = str(c.collections) if c.interval_seconds else "-"
            print(
                f"{c.name:<{nw}}{c.state!s:<{sw}}{interval:>9}{rounds:>9}{c.errors:>8}  {c.reason}"
            )
        return EXIT_OK

    return with_agent(args.target or default_target(), show)


def _duration(s: float) -> str:
    if s != s:  # NaN
        return "?"
    s = int(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return f"{d}d{h:02d}h{m:02d}m" if d else f"{h}h{m:02d}m{sec:02d}s"


#: How long ``metrics`` waits for an agent's first round with values (one that just started).
FIRST_ROUND_WAIT_S = 5.0


def cmd_metrics(args: argparse.Namespace) -> int:
    """Run ``bpfdyno metrics``; returns the exit status."""

    async def show(agent: AgentClient) -> int:
        specs = await agent.metric_specs()
        units = {s.name: s.unit for s in specs}
        unmatched = [p for p in args.names if not any(matches_any(s.name, [p]) for s in specs)]
        if unmatched:
            print(no_match_message(unmatched, specs), file=sys.stderr)
            return EXIT_USAGE
        if args.watch:
            async for snap in agent.stream_metrics(args.names):
                _print_snapshot(snap, units, args.json)
            return EXIT_OK
        snap = await agent.metrics(args.names)
        if not any(s.points for s in snap.series):
            # An agent that just started has not collected yet (rates need two readings):
            # wait for its first round with values rather than answer "nothing".
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FIRST_ROUND_WAIT_S):
                    async for streamed in agent.stream_metrics(args.names):
                        if any(s.points for s in streamed.series):
                            snap = await agent.metrics(args.names)
                            break
        if not any(s.points for s in snap.series):
            what = " ".join(args.names) or "any metric"
            print(
                f"bpfdyno: no values yet for {what}: the collectors that report them are not "
                "running or have not collected yet (bpfdyno status says which and why)",
                file=sys.stderr,
            )
            return EXIT_FAIL
        _print_snapshot(snap, units, args.json)
        return EXIT_OK

    return with_agent(args.target or default_target(), show)


def _print_snapshot(snap: MetricsSnapshot, units: dict[str, str], as_json: bool) -> None:
    if as_json:
        print_json(
            {
                "ts": snap.unix_seconds,
                "collector": snap.collector,
                "series": [
                    {
                        "name": s.name,
                        "labels": dict(s.labels),
                        "value": s.points[-1].value if s.points else None,
                        "unit": units.get(s.name, ""),
                    }
                    for s in snap.series
                ],
            },
            indent=False,  # one line per round: a stream of rounds is JSON lines
        )
        return
    stamp = time.strftime("%H:%M:%S", time.localtime(snap.unix_seconds))
    header = f"# {stamp}" + (f" {snap.collector}" if snap.collector else "")
    print(header)
    for s in snap.series:
        if s.points:
            print(_format_series_line(s.name, dict(s.labels), s.value, units.get(s.name, "")))
    sys.stdout.flush()


def no_match_message(patterns: list[str], specs: list[MetricSpec]) -> str:
    """Why ``patterns`` matched no metric, how names work, and the nearest ones."""
    lines = [f"bpfdyno: no metric matches {' '.join(repr(p) for p in patterns)}."]
    lines.append(
        "Give full names (cpu_utilization_ratio) or prefixes ending in '*', quoted so the "
        "shell leaves the '*' alone: bpfdyno metrics 'cpu_*'. Without names: every metric."
    )
    for p in patterns:
        stem = p.rstrip("*")
        near = sorted({s.name for s in specs if stem and stem in s.name})
        if near:
            shown = ", ".join(near[:6]) + (f" and {len(near) - 6} more" if len(near) > 6 else "")
            lines.append(f"Names with {stem!r} in them: {shown}.")
    lines.append("Every metric, with its unit and source: docs/metrics.md.")
    return "\n".join(lines)


def _format_series_line(name: str, labels: dict[str, str], value: float, unit: str) -> str:
    lab = ",".join(f"{k}={v}" for k, v in labels.items())
    key = f"{name}{{{lab}}}" if lab else name
    if unit == "ratio":  # people read shares in percent; --json and exports keep the ratio
        return f"{key:<60} {percent(value):>18} %"
    return f"{key:<60} {format_value(value):>18} {unit}"


def percent(ratio: float) -> str:
    """A ratio in percent: one decimal (``1.0``), two significant digits below 0.1 %."""
    pct = ratio * 100
    return f"{pct:.1f}" if pct == 0 or abs(pct) >= 0.1 else f"{pct:.2g}"


def format_value(value: float) -> str:
    """Integers in full with thousands separators; other values to 6 significant digits."""
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.6g}"
