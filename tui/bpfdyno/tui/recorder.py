"""Record what an agent says for a while, for replay with `RecordedDataSource`.

``python -m bpfdyno.tui.recorder --socket PATH --seconds 30 node.json`` writes a recording a
demo or a bug report can replay later (``bpfdyno top --replay node.json``) on any machine,
without root, BPF or a GPU. Parts the agent does not serve are recorded as unavailable, with
its reason, so the replay degrades the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
from pathlib import Path

from bpfdyno.client.errors import AgentError
from bpfdyno.rpc.agent import MetricsSnapshot
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import ProcessList
from bpfdyno.rpc.traces import Trainer
from bpfdyno.tui.codec import encode
from bpfdyno.tui.datasource import AgentDataSource, DataSource
from bpfdyno.tui.recorded import FORMAT, VERSION, Frame, Recording

#: Seconds of metric history stored with the recording (the sparklines' start).
HISTORY_S = 60.0


async def record(
    source: DataSource, seconds: float, interval_s: float = 1.0, process_limit: int = 500
) -> Recording:
    """Record ``seconds`` of ``source``: ``round(seconds / interval_s)`` frames (at least 1).

    Raises:
        AgentError: the agent cannot be reached (at the start or while recording).
    """
    status = await source.status()
    specs = await source.metric_specs()
    history = await source.metrics_window([], HISTORY_S)
    rounds: list[MetricsSnapshot] = []
    events: list[KernelEvent] = []
    unavailable: dict[str, str] = {}

    async def pump_metrics() -> None:
        async for rnd in source.stream_metrics():
            rounds.append(rnd)

    async def pump_events() -> None:
        try:
            async for ev in source.stream_events():
                events.append(ev)
        except AgentError as e:
            if e.kind.disconnected:
                raise
            unavailable["events"] = str(e)

    metrics_task = asyncio.create_task(pump_metrics())
    events_task = asyncio.create_task(pump_events())
    frames: list[Frame] = []
    try:
        for _ in range(max(1, round(seconds / interval_s))):
            await asyncio.sleep(interval_s)
            if metrics_task.done():
                metrics_task.result()  # raises why the stream ended
            table: ProcessList | None = None
            trainers: tuple[Trainer, ...] | None = None
            try:
                table = await source.processes(process_limit)
            except AgentError as e:
                if e.kind.disconnected:
                    raise
                unavailable["processes"] = str(e)
            try:
                trainers = tuple(await source.trainers())
            except AgentError as e:
                if e.kind.disconnected:
                    raise
                unavailable["trainers"] = str(e)
            last = frames[-1].ts + interval_s if frames else 0.0
            ts = max((r.unix_seconds for r in rounds), default=last)
            frames.append(
                Frame(
                    ts=ts or status.now_unix_seconds,
                    rounds=tuple(rounds),
                    status=await source.status(),
                    processes=table,
                    trainers=trainers,
                    events=tuple(events),
                )
            )
            rounds.clear()
            events.clear()
    finally:
        for task in (metrics_task, events_task):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AgentError):
                await task
    return Recording(
        status=status,
        specs=tuple(specs),
        frames=tuple(frames),
        history=tuple(history),
        interval_s=interval_s,
        unavailable=dict(sorted(unavailable.items())),
    )


def save_recording(rec: Recording, path: Path) -> None:
    """Write ``rec`` as strict JSON (unknown values as null), atomically."""
    obj = {"format": FORMAT, "version": VERSION, **encode(rec)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, allow_nan=False, indent=1), encoding="utf-8")
    tmp.replace(path)


def main() -> int:
    """Record an agent into a file."""
    p = argparse.ArgumentParser(prog="python -m bpfdyno.tui.recorder", description=__doc__)
    p.add_argument("out", type=Path, help="recording file to write (JSON)")
    p.add_argument("--socket", "--host", dest="target", help="agent socket path or HOST:PORT")
    p.add_argument("--seconds", type=float, default=30.0, help="how long to record (30)")
    p.add_argument("--interval", type=float, default=1.0, help="seconds per frame (1)")
    args = p.parse_args()
    from bpfdyno.client.connection import default_target

    source = AgentDataSource(args.target or default_target())

    async def run() -> Recording:
        try:
            return await record(source, args.seconds, args.interval)
        finally:
            await source.close()

    try:
        rec = asyncio.run(run())
    except AgentError as e:
        print(f"bpfdyno recorder: {e}", file=sys.stderr)
        return 1
    save_recording(rec, args.out)
    print(f"recorded {len(rec.frames)} frames to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
