"""How much memory a traced PyTorch process gains per traced second (stacks and shapes on).

Usage (as root): ``python tests/bench/bench_trace_memory.py [--durations 5,10,20]
[--step-sleep 0.001]``.

Why: a trace request decides how long another process's profiler records, and the profiler
keeps every event in memory until the trace is written. dynolog accepted any
``ACTIVITIES_DURATION_MSECS`` (up to 2^31 ms, 24 days), so one request could grow a trainer
until the kernel killed it. bpfdyno bounds duration, iterations and start time
(``[tracing] max_duration_ms``, ``max_iterations``, ``max_start_delay_s``); this measures what
a traced second costs the traced process, so the defaults can be set below what would hurt.

Method: the tracing component of the daemon runs in this process (its Kineto endpoint on a
socket directory); one real trainer (``tests/tracing/trainers/linear.py``: an nn.Linear with
SGD, one optimizer step every ``--step-sleep`` seconds) registers. For each duration, one
duration-mode trace with ``PROFILE_WITH_STACK`` and ``PROFILE_REPORT_INPUT_SHAPES`` is
requested; the trainer's VmRSS is sampled every 0.2 s from ``/proc``. Reported per
duration: RSS before the request, the peak while tracing, the growth per traced second,
and RSS 5 s after the file was written (what stays).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bpfdyno.app.tracing import TracingComponent
from bpfdyno.core.config import load
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.traces import ProcState

TRAINERS = Path(__file__).resolve().parents[1] / "tracing" / "trainers"
SAMPLE_S = 0.2


def rss_mb(pid: int) -> float:
    """VmRSS of ``pid`` in MiB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


async def measure(args: argparse.Namespace) -> list[dict[str, float]]:
    base = Path(tempfile.mkdtemp(prefix="bdm-", dir="/tmp"))
    sock, traces = base / "sock", base / "traces"
    sock.mkdir()
    traces.mkdir()
    longest = int(max(args.durations) * 1000)
    cfg = load(
        None,
        [
            ("kineto.socket_dir", json.dumps(str(sock))),
            ("tracing.allowed_dirs", json.dumps([str(traces)])),
            ("tracing.max_duration_ms", str(longest)),
            ("legacy_rpc.enabled", "false"),
        ],
    )
    comp = TracingComponent(cfg)
    await comp.start()
    env = dict(os.environ, KINETO_USE_DAEMON="1", KINETO_IPC_SOCKET_DIR=str(sock))
    env.update(KINETO_CONFIG=str(TRAINERS / "kineto.conf"), OMP_NUM_THREADS="1")
    trainer = subprocess.Popen(
        [
            sys.executable,
            str(TRAINERS / "linear.py"),
            "--seconds",
            "3600",
            "--step-sleep",
            str(args.step_sleep),
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    results: list[dict[str, float]] = []
    try:
        assert trainer.stdout is not None
        line = await asyncio.to_thread(trainer.stdout.readline)
        pid = int(line.split()[1])
        while not comp.service.list_trainers():
            await asyncio.sleep(0.1)
        for seconds in args.durations:
            await asyncio.sleep(3)  # settle
            before = rss_mb(pid)
            res = comp.service.start_trace(
                TraceRequest(
                    options=TraceSpec(
                        log_file=str(traces / f"m{seconds}.json"),
                        duration_ms=int(seconds * 1000),
                        with_stacks=True,
                        record_shapes=True,
                    )
                )
            )
            peak, written_at = before, 0.0
            deadline = time.monotonic() + seconds + 60
            while time.monotonic() < deadline:
                peak = max(peak, rss_mb(pid))
                state = comp.service.get_trace(res.trace_id).processes[0].state
                if state is ProcState.WRITTEN and not written_at:
                    written_at = time.monotonic()
                if state.terminal and state is not ProcState.WRITTEN:
                    raise RuntimeError(f"trace ended {state.value}")
                if written_at and time.monotonic() - written_at > 5:
                    break
                await asyncio.sleep(SAMPLE_S)
            after = rss_mb(pid)
            size = os.path.getsize(traces / f"m{seconds}_{pid}.json") / 2**20
            results.append(
                {
                    "seconds": seconds,
                    "before_mb": before,
                    "peak_mb": peak,
                    "per_s_mb": (peak - before) / seconds,
                    "after_mb": after,
                    "file_mb": size,
                }
            )
            print(json.dumps(results[-1]), file=sys.stderr)
    finally:
        trainer.kill()
        trainer.wait()
        await comp.stop()
        shutil.rmtree(base, ignore_errors=True)
    return results


def report(results: list[dict[str, float]], args: argparse.Namespace) -> str:
    load1 = os.getloadavg()[0]
    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs, "
        f"load average {load1:.1f}); trainer: nn.Linear + SGD, a step every "
        f"{args.step_sleep * 1000:g} ms, with_stacks + record_shapes.",
        "",
        "| traced seconds | RSS before | peak RSS | growth per traced second | RSS 5 s after "
        "| trace file |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['seconds']:g} | {r['before_mb']:.0f} MiB | {r['peak_mb']:.0f} MiB "
            f"| {r['per_s_mb']:.1f} MiB/s | {r['after_mb']:.0f} MiB | {r['file_mb']:.1f} MiB |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--durations", type=lambda v: [float(x) for x in v.split(",")], default=[5.0, 10.0, 20.0]
    )
    parser.add_argument("--step-sleep", type=float, default=0.001)
    args = parser.parse_args()
    print(report(asyncio.run(measure(args)), args))


if __name__ == "__main__":
    main()
