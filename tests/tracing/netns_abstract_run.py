"""Run under ``unshare --net``: the abstract-name endpoint with a real trainer, end to end.

The abstract name @dynolog@ is global per network namespace, so this scenario runs in a
fresh one where no other daemon can hold it. It prints one JSON object of observations:
the socket as /proc/net/unix shows it, what a second bind says, a trace before and after a
daemon restart (the trainer keeps running and re-registers with the new daemon).

Usage: netns_abstract_run.py TRACE_DIR
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from tracing_harness import TRAINERS, TrainerProc, trainer_env

from bpfdyno.app.tracing import TracingComponent
from bpfdyno.core.config import load
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.ipc.endpoint import EndpointUnavailable, KinetoEndpoint


async def trace(comp: TracingComponent, trace_dir: Path, name: str) -> dict[str, object]:
    res = comp.service.start_trace(
        TraceRequest(options=TraceSpec(log_file=str(trace_dir / name), iterations=2))
    )
    view = comp.service.get_trace(res.trace_id)
    async with asyncio.timeout(60):
        async for latest in comp.service.watch_trace(res.trace_id):
            view = latest
    [p] = view.processes
    return {"trace_id": res.trace_id, "state": p.state.value, "path": p.output_path}


async def main(trace_dir: Path) -> dict[str, object]:
    import subprocess

    cfg = load(
        None,
        [
            ("kineto.socket_dir", '""'),
            ("tracing.allowed_dirs", json.dumps([str(trace_dir)])),
            ("legacy_rpc.enabled", "false"),
        ],
    )
    out: dict[str, object] = {}
    comp = TracingComponent(cfg)
    await comp.start()
    out["address"] = comp.endpoint.address
    out["proc_net_unix"] = [
        line.split()[-1]
        for line in Path("/proc/net/unix").read_text().splitlines()
        if line.rstrip().endswith("@dynolog@")
    ]
    try:
        KinetoEndpoint(comp.service, "").open(asyncio.get_running_loop())
        out["second_bind"] = "succeeded"
    except EndpointUnavailable as e:
        out["second_bind"] = str(e)
    popen = subprocess.Popen(
        [sys.executable, str(TRAINERS / "linear.py")],
        env=trainer_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    trainer = TrainerProc(popen)
    trainer.start_reader()
    try:
        await trainer.wait_ready()
        out["pid"] = trainer.pid
        async with asyncio.timeout(30):
            while not comp.service.list_trainers():
                await asyncio.sleep(0.05)
        out["endpoint"] = comp.service.list_trainers()[0].endpoint
        out["before"] = await trace(comp, trace_dir, "a.pt.trace.json")
        await comp.stop()
        await asyncio.sleep(1.5)  # the trainer's polls fail and back off meanwhile
        comp = TracingComponent(cfg)
        await comp.start()
        async with asyncio.timeout(30):
            while not comp.service.list_trainers():
                await asyncio.sleep(0.05)
        out["after"] = await trace(comp, trace_dir, "b.pt.trace.json")
    finally:
        trainer.kill()
        await comp.stop()
    return out


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
