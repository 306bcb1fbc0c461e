"""What the kernel telemetry (scheduler BPF programs, perf counters) costs the machine.

Run as root: ``python tests/bench/bench_sched_overhead.py [--rounds 10] [--idle-seconds 60]
[--write-doc docs/performance.md]``.

1. Context-switch microbenchmark: ``taskset -c 0 perf bench sched pipe -l 200000`` (two
   processes ping-pong over a pipe on one CPU, ~2 switches and ~2 wakeups per op), in
   interleaved rounds of three kinds: no collector, the sched collector as configured by
   default (programs attached, collecting every second, BPF stats duty-cycled as in
   production), and the same without the wakeup probes (``track_wakeups=False``). Reported:
   median ops/s of each kind and the slowdown of the medians. Each round rotates the order
   of the kinds so drift of the shared machine hits all of them alike.
2. ns per event of every program, from the kernel's BPF run statistics over one pipe run
   (the stats themselves add ~20 ns per run, included in the numbers).
3. A PyTorch CPU training loop (one thread, pinned to CPU 0, MLP 512-1024-10, batch 64):
   median step time per round, interleaved on/off like 1.
4. The agent's own footprint at idle: a child process runs the kernel collectors (sched,
   perf_sw, pmu where a PMU exists, net when it starts) collecting every second; after a
   warm-up, its CPU time over ``--idle-seconds`` and its RSS at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bpfdyno.ebpf.runstats import BpfRunStats
from bpfdyno.sources.sched.collector import SchedCollector

PIPE = ["taskset", "-c", "0", "perf", "bench", "sched", "pipe"]
SECTION = "## Kernel telemetry overhead"

TRAIN = """
import statistics, sys, time
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = torch.nn.CrossEntropyLoss()
x, y = torch.randn(64, 512), torch.randint(0, 10, (64,))
def step():
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
for _ in range(30):
    step()
times = []
for _ in range(int(sys.argv[1])):
    t0 = time.perf_counter()
    step()
    times.append(time.perf_counter() - t0)
print(statistics.median(times) * 1e3)
"""

IDLE_CHILD = """
import json, sys, time, resource
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.perf.collector import PerfSwCollector, PmuCollector
from bpfdyno.sources.sched.collector import SchedCollector
collectors, ran = [SchedCollector(), PerfSwCollector(), PmuCollector()], []
try:
    from bpfdyno.sources.net.collector import NetCollector
    collectors.append(NetCollector())
except ImportError:
    pass
for c in collectors:
    try:
        c.start()
        ran.append(c)
    except CollectorUnavailable as e:
        print(f"{c.name}: unavailable: {e}", file=sys.stderr)
# As `bpfdyno serve` does once every program is loaded.
from bpfdyno.ebpf.compiler import release_compiler_pages
release_compiler_pages()
def loop(seconds):
    deadline = time.monotonic()
    end = deadline + seconds
    while deadline < end:
        for c in ran:
            c.collect()
        deadline += 1.0
        time.sleep(max(deadline - time.monotonic(), 0))
loop(5.0)
cpu0, t0 = time.process_time(), time.monotonic()
loop(float(sys.argv[1]))
cpu1, t1 = time.process_time(), time.monotonic()
rss = int(open("/proc/self/statm").read().split()[1]) * 4096
print(json.dumps({"collectors": [c.name for c in ran], "cpu_ratio": (cpu1 - cpu0) / (t1 - t0),
                  "rss_bytes": rss}))
for c in ran:
    c.close()
"""


def pipe_ops_per_second(loops: int) -> float:
    out = subprocess.run(
        [*PIPE, "-l", str(loops)], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"(\d+) ops/sec", out)
    if m is None:
        raise RuntimeError(f"unexpected perf output: {out!r}")
    return float(m.group(1))


def train_step_ms(steps: int) -> float:
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", TRAIN, str(steps)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(out.strip())


@contextmanager
def agent(track_wakeups: bool = True) -> Iterator[SchedCollector]:
    """The sched collector as the daemon runs it: attached, collecting once a second."""
    collector = SchedCollector(track_wakeups=track_wakeups)
    collector.start()
    stop = threading.Event()

    def collect_loop() -> None:
        while not stop.wait(1.0):
            collector.collect()

    thread = threading.Thread(target=collect_loop, daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        stop.set()
        thread.join()
        collector.close()


#: Configurations compared: no collector, the default, and without the wakeup probes.
KINDS = ("off", "on", "on-no-wakeups")


def interleaved(
    rounds: int, measure_one: Callable[[], float], kinds: tuple[str, ...] = KINDS
) -> dict[str, list[float]]:
    """Measure every kind once per round, rotating the order so drift hits all alike."""
    results: dict[str, list[float]] = {k: [] for k in kinds}
    for i in range(rounds):
        order = kinds[i % len(kinds) :] + kinds[: i % len(kinds)]
        for kind in order:
            if kind == "off":
                results[kind].append(measure_one())
            else:
                with agent(track_wakeups=kind == "on"):
                    results[kind].append(measure_one())
        line = " ".join(f"{k}={v[-1]:.4g}" for k, v in results.items())
        print(f"  round {i + 1}/{rounds}: {line}", flush=True)
    return results


def ns_per_event(loops: int) -> dict[str, tuple[float, float]]:
    with agent() as collector:
        stats = BpfRunStats(collector._require().program_fds())
        bench = threading.Thread(target=pipe_ops_per_second, args=(loops,))
        bench.start()
        time.sleep(0.2)
        window = stats.measure(1.0)
        bench.join()
    return {name: (st.ns_per_event, st.runs_per_second) for name, st in window.items()}


def idle_footprint(seconds: float) -> tuple[list[str], float, int]:
    """(collectors that ran, CPU share of one core, RSS bytes) of an idle agent child."""
    out = subprocess.run(
        [sys.executable, "-c", IDLE_CHILD, str(seconds)], capture_output=True, text=True, check=True
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return list(result["collectors"]), float(result["cpu_ratio"]), int(result["rss_bytes"])


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f} %"


def pipe_fn(args: argparse.Namespace) -> Callable[[], float]:
    return lambda: pipe_ops_per_second(args.loops)


def torch_available() -> bool:
    return (
        subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
    )


def report(args: argparse.Namespace) -> str:
    lines: list[str] = []
    host = os.uname()
    lines.append(
        f"Measured {time.strftime('%Y-%m-%d')} on {host.release} ({os.cpu_count()} CPUs), "
        f"{args.rounds} interleaved rounds per comparison."
    )
    lines.append("")
    print("perf bench sched pipe:", flush=True)
    pipe = {k: statistics.median(v) for k, v in interleaved(args.rounds, pipe_fn(args)).items()}
    lines += [
        "| comparison | collector off | collector on | slowdown | on, no wakeup probes "
        "| slowdown | target |",
        "|---|---|---|---|---|---|---|",
        f"| `perf bench sched pipe -l {args.loops}` on CPU 0 (median ops/s) | "
        f"{pipe['off']:,.0f} | {pipe['on']:,.0f} | {_pct(pipe['off'] / pipe['on'])} | "
        f"{pipe['on-no-wakeups']:,.0f} | {_pct(pipe['off'] / pipe['on-no-wakeups'])} | <= 5 % |",
    ]
    if torch_available():
        print("PyTorch training loop:", flush=True)
        steps = interleaved(args.rounds, lambda: train_step_ms(args.steps), ("off", "on"))
        train = {k: statistics.median(v) for k, v in steps.items()}
        lines.append(
            f"| PyTorch CPU training step, MLP, 1 thread on CPU 0 (median ms) | "
            f"{train['off']:.3f} | {train['on']:.3f} | {_pct(train['on'] / train['off'])} "
            "| | | <= 1 % |"
        )
    else:
        lines.append("| PyTorch CPU training step | torch not installed | | | | | <= 1 % |")
    print("BPF run statistics:", flush=True)
    costs = ns_per_event(args.loops)
    lines += ["", "| program | ns/event | runs/s during the pipe run |", "|---|---|---|"]
    for name, (ns, rate) in sorted(costs.items()):
        lines.append(f"| `{name}` | {ns:.0f} | {rate:,.0f} |")
    print(f"idle footprint ({args.idle_seconds:.0f} s):", flush=True)
    names, cpu_ratio, rss = idle_footprint(args.idle_seconds)
    cpu_pct, rss_mb = cpu_ratio * 100, rss / 1e6
    lines += [
        "",
        f"Agent at idle, collectors {', '.join(names)} every 1 s for "
        f"{args.idle_seconds:.0f} s: **{cpu_pct:.2f} % of one core** (target <= 1 %), "
        f"**RSS {rss_mb:.0f} MB** (target <= 150 MB).",
    ]
    return "\n".join(lines)


def write_section(doc: Path, results: str) -> None:
    """Replace the results block of the section in ``doc`` (creating either if missing)."""
    start, end = "<!-- bench_sched_overhead:begin -->", "<!-- bench_sched_overhead:end -->"
    block = f"{start}\n{results}\n{end}"
    text = doc.read_text() if doc.exists() else "# Performance\n"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    elif SECTION in text:
        at = text.index(SECTION) + len(SECTION)
        text = text[:at] + "\n\n" + block + text[at:]
    else:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{block}\n"
    doc.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=textwrap.dedent(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each kind")
    parser.add_argument("--loops", type=int, default=200_000, help="perf bench pipe loops")
    parser.add_argument("--steps", type=int, default=300, help="training steps per round")
    parser.add_argument("--idle-seconds", type=float, default=60.0, help="idle measurement")
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark loads BPF programs")
    results = report(args)
    print(results)
    if args.write_doc:
        write_section(args.write_doc, results)


if __name__ == "__main__":
    main()
