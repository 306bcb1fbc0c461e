"""The `bpfdyno` command line: serve, status, version, metrics, doctor (and more)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import grpc

from bpfdyno.cli.output import message_dict, print_json, report_rpc_error
from bpfdyno.cli.ps import add_ps_parser, cmd_ps
from bpfdyno.cli.tracing import add_subcommands as add_tracing_subcommands
from bpfdyno.client.connection import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    add_target_argument,
    channel,
    default_target,
)
from bpfdyno.core.config import DEFAULT_CONFIG_PATH, Config, ConfigError, load
from bpfdyno.version import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bpfdyno",
        description="eBPF monitoring and on-demand PyTorch tracing agent (dynolog-compatible).",
    )
    parser.add_argument("--version", action="version", version=f"bpfdyno {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("serve", help="run the daemon (as root)")
    p.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"TOML config file (default: {DEFAULT_CONFIG_PATH} if it exists)",
    )
    p.add_argument("--socket", help="gRPC Unix socket path (grpc.socket)")
    p.add_argument("--tcp", help="also serve gRPC on HOST:PORT (grpc.tcp)")
    p.add_argument("--interval", type=float, help="collection interval in seconds")
    p.add_argument(
        "--jsonl", metavar="PATH", help="write metrics as JSON lines to PATH ('-' = stdout)"
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config value (repeatable), e.g. --set collectors.gpu.enabled=false",
    )

    p = sub.add_parser("status", help="agent version, uptime and each collector's state")
    add_target_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")

    sub.add_parser("version", help="print the version")

    p = sub.add_parser("metrics", help="latest metrics from the agent")
    add_target_argument(p)
    p.add_argument("names", nargs="*", help="metric names or prefixes ending in '*'")
    p.add_argument("--watch", action="store_true", help="print every new collection round")
    p.add_argument("--json", action="store_true", help="print JSON (one object per round)")

    p = sub.add_parser("doctor", help="check what this machine supports, with fixes")
    p.add_argument("--config", type=Path, default=None)
    p.add_argument("--socket", help="gRPC Unix socket path to check")

    add_ps_parser(sub)
    handlers = add_tracing_subcommands(sub)

    p = sub.add_parser("top", help="live terminal UI of this machine, its GPUs and processes")
    add_target_argument(p)
    p.add_argument("--job-id", default=None, help="show only this job's processes and trainers")
    p.add_argument("--replay", type=Path, default=None, help="replay a recording (demos)")
    p.add_argument("--speed", type=float, default=1.0, help="replay speed")

    parser.set_defaults(handlers=handlers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {
        "serve": cmd_serve,
        "status": cmd_status,
        "version": cmd_version,
        "metrics": cmd_metrics,
        "doctor": cmd_doctor,
        "ps": cmd_ps,
        "top": cmd_top,
        **args.handlers,
    }
    handler = handlers[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


def cmd_version(args: argparse.Namespace) -> int:
    print(f"bpfdyno {__version__}")
    return EXIT_OK


def _load_config(args: argparse.Namespace) -> Config:
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
    from bpfdyno.app.serve import AddressInUse, run

    try:
        cfg = _load_config(args)
    except ConfigError as e:
        print(f"bpfdyno: config error: {e}", file=sys.stderr)
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


def cmd_status(args: argparse.Namespace) -> int:
    from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc

    target = args.target or default_target()
    try:
        with channel(target) as ch:
            st = agent_pb2_grpc.AgentStub(ch).GetStatus(agent_pb2.GetStatusRequest(), timeout=5)
    except grpc.RpcError as e:
        return report_rpc_error(e, target)
    if args.json:
        print_json(message_dict(st, proto_names=False))
        return EXIT_OK
    print(f"bpfdyno {st.version} on {st.hostname} (kernel {st.kernel_release}), pid {st.pid}")
    print(
        f"agent up {_duration(st.agent_uptime_seconds)}, host up "
        f"{_duration(st.host_uptime_seconds)}, config {st.config_source}"
    )
    print(f"{'COLLECTOR':<14}{'STATE':<13}{'INTERVAL':>9}{'ROUNDS':>9}{'ERRORS':>8}  REASON")
    for c in st.collectors:
        state = agent_pb2.CollectorState.Name(c.state).removeprefix("COLLECTOR_STATE_").lower()
        interval = f"{c.interval_seconds:.2f}s" if c.interval_seconds else "-"
        rounds = str(c.collections) if c.interval_seconds else "-"
        print(f"{c.name:<14}{state:<13}{interval:>9}{rounds:>9}{c.errors:>8}  {c.reason}")
    return EXIT_OK


def _duration(s: float) -> str:
    if s != s:  # NaN
        return "?"
    s = int(s)
    d, rem = divmod(s, 86400)
    h, rem = divmod(rem, 3600)
    m, sec = divmod(rem, 60)
    return f"{d}d{h:02d}h{m:02d}m" if d else f"{h}h{m:02d}m{sec:02d}s"


def _format_series_line(name: str, labels: dict[str, str], value: float, unit: str) -> str:
    lab = ",".join(f"{k}={v}" for k, v in labels.items())
    key = f"{name}{{{lab}}}" if lab else name
    return f"{key:<60} {format_value(value):>18} {unit}"


def format_value(value: float) -> str:
    """Integers in full with thousands separators; other values to 6 significant digits."""
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.6g}"


def cmd_metrics(args: argparse.Namespace) -> int:
    from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc

    target = args.target or default_target()
    try:
        with channel(target) as ch:
            stub = agent_pb2_grpc.AgentStub(ch)
            units = {
                s.name: s.unit
                for s in stub.ListMetricSpecs(agent_pb2.ListMetricSpecsRequest(), timeout=5).specs
            }
            if args.watch:
                stream = stub.StreamMetrics(agent_pb2.StreamMetricsRequest(names=args.names))
                for snap in stream:
                    _print_snapshot(snap, units, args.json)
                return EXIT_OK
            snap = stub.GetMetrics(agent_pb2.GetMetricsRequest(names=args.names), timeout=5)
    except grpc.RpcError as e:
        return report_rpc_error(e, target)
    _print_snapshot(snap, units, args.json)
    return EXIT_OK


def _print_snapshot(snap: object, units: dict[str, str], as_json: bool) -> None:
    from bpfdyno.rpc.v1 import agent_pb2

    assert isinstance(snap, agent_pb2.MetricsSnapshot)
    if as_json:
        print_json(
            {
                "ts": snap.unix_seconds,
                "collector": snap.collector,
                "series": [
                    {
                        "name": s.name,
                        "labels": {lab.name: lab.value for lab in s.labels},
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
            labels = {lab.name: lab.value for lab in s.labels}
            print(_format_series_line(s.name, labels, s.points[-1].value, units.get(s.name, "")))
    sys.stdout.flush()


def cmd_top(args: argparse.Namespace) -> int:
    from bpfdyno.tui.app import run_top

    return run_top(args.target, args.job_id, replay=args.replay, speed=args.speed)


def cmd_doctor(args: argparse.Namespace) -> int:
    from bpfdyno.app.doctor import format_checks, run_checks

    try:
        cfg = _load_config(args)
    except ConfigError as e:
        print(f"bpfdyno: config error: {e}", file=sys.stderr)
        return EXIT_USAGE
    checks = run_checks(cfg)
    print(format_checks(checks))
    return EXIT_OK if all(c.ok is not False or not c.required for c in checks) else EXIT_FAIL


if __name__ == "__main__":
    raise SystemExit(main())
