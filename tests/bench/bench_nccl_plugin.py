"""What the NCCL profiler plugin costs per event, on the CPU of the thread NCCL calls it from.

Run as one command: ``python tests/bench/bench_nccl_plugin.py [--rounds 9] [--n 1000000]
[--write-doc docs/nccl.md]``.

A small C driver (nccl_plugin_driver.c) dlopens the built plugin and calls its ncclProfiler_v5
entry points as NCCL does, N times per run, timing itself with its thread's CPU clock (so the
time other processes take the CPU from it on a shared machine is not counted). Three kinds of
unit: ``coll`` (a collective's startEvent + stopEvent), ``step`` (a proxy step: startEvent,
three recordEventState, stopEvent) and ``full`` (one AllReduce on two channels as NCCL reports
it: the collective, two kernel channels with their stop state, two proxy operations with one
step each: 20 calls). Each kind runs ``off`` (the same calls into empty functions) and ``on``
(the plugin) in interleaved rounds, the order alternating each round; reported: the median ns
per unit of each, and on - off, the plugin's own cost.

Then the agent's side: 8 processes (the two-thread stress driver of the plugin's tests, each
having run 1,000 collectives with their parts, waiting) publish their files; reported: the
CPU time of the receiver's first poll (reading 8 rings of about 2,000 records) and the median
CPU time of a poll with nothing new (what each round costs at rest), over 200 polls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from doc_blocks import write_results

from bpfdyno.sources.nccl_profiler.build import build_plugin, source_dir
from bpfdyno.sources.nccl_profiler.receiver import NcclProfilerReceiver

HERE = Path(__file__).resolve().parent
STRESS = HERE.parent / "sources" / "nccl_profiler" / "stress_driver.c"
TRAINERS = 8
SECTION = "## What it costs"
KINDS = ("coll", "step", "full")


def run(driver: Path, library: str, kind: str, n: int, shm: Path) -> float:
    env = {**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(shm)}
    out = subprocess.run(
        [str(driver), library, kind, str(n)], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout)


def receiver_costs(work: Path, library: Path) -> tuple[float, float]:
    """(first poll, median idle poll) CPU seconds of the receiver over TRAINERS files."""
    stress = work / "stress"
    subprocess.run(
        ["cc", "-O2", "-pthread", f"-I{source_dir()}", "-o", str(stress), str(STRESS), "-ldl"],
        check=True,
    )
    shm = work / "shm"
    shm.mkdir()
    env = {**os.environ, "BPFDYNO_NCCL_SHM_DIR": str(shm)}
    procs = [
        subprocess.Popen(
            [str(stress), str(library), "1000"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(TRAINERS)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "done\n"
        receiver = NcclProfilerReceiver(shm_dir=shm)
        t0 = time.thread_time()
        receiver.poll()
        first = time.thread_time() - t0
        assert len(receiver.snapshot()) == TRAINERS
        idle = []
        for _ in range(200):
            t0 = time.thread_time()
            receiver.poll()
            idle.append(time.thread_time() - t0)
        return first, statistics.median(idle)
    finally:
        for p in procs:
            p.communicate("\n", timeout=30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        library = build_plugin(work / "lib")
        driver = work / "driver"
        subprocess.run(
            ["cc", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{source_dir()}", "-o", str(driver),
             str(HERE / "nccl_plugin_driver.c"), "-ldl"],
            check=True,
        )  # fmt: skip
        times: dict[tuple[str, str], list[float]] = {
            (k, m): [] for k in KINDS for m in ("off", "on")
        }
        for r in range(args.rounds):
            for kind in KINDS:
                modes = ("off", "on") if r % 2 == 0 else ("on", "off")
                for mode in modes:
                    lib = "off" if mode == "off" else str(library)
                    times[kind, mode].append(run(driver, lib, kind, args.n, work))
        first, idle = receiver_costs(work, library)
    cpu = Path("/proc/cpuinfo").read_text().split("model name")[1].split("\n")[0].strip(": \t")
    lines = [
        f"{args.rounds} interleaved rounds of {args.n:,} units per run; median ns per unit of "
        f"the calling thread's CPU time ({cpu}, {os.cpu_count()} CPUs; "
        f"load average {os.getloadavg()[0]:.1f} at the end).",
        "",
        "| unit | calls | empty plugin (ns) | bpfdyno plugin (ns) | plugin's own cost (ns) |",
        "|---|---|---|---|---|",
    ]
    calls = {"coll": 2, "step": 5, "full": 20}
    for kind in KINDS:
        off = statistics.median(times[kind, "off"])
        on = statistics.median(times[kind, "on"])
        lines.append(f"| {kind} | {calls[kind]} | {off:.1f} | {on:.1f} | {on - off:.1f} |")
    lines += [
        "",
        f"The agent's receiver with {TRAINERS} trainer files: first poll (their whole rings) "
        f"{first * 1e3:.1f} ms of CPU; a poll with nothing new {idle * 1e6:.0f} µs of CPU "
        f"(median of 200): {idle * 100:.3f} % of a core at one poll a second.",
    ]
    result = "\n".join(lines)
    print(result)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_nccl_plugin", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
