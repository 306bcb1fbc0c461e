"""The idle agent's cost model: what one round costs per CPU, per GPU, per thread.

Run as root, as a script: ``python tests/bench/bench_agent_scaling.py [--rounds 40]
[--write-doc docs/performance.md]``.

What grows with the node, each measured here on its own (thread CPU time per round, median
of ``--rounds``), with the node's size emulated where this machine has less:

* **per CPU**: the host collector against a fixture ``/proc`` of N CPUs (its counters move
  every round, as a busy node's do); the scheduler's per-CPU counters decoded for N CPUs
  (`totals_from_words` and the interval's samples); ``perf_sw`` with N per-CPU counters
  (real software counters, N of them on this machine's CPUs); every per-CPU sample appended
  to the store (the event loop's share); the interrupt collector: its per-CPU array of N CPUs
  (bcc's map stood in for by a buffer of the same layout) and a ``/proc/interrupts`` of N
  CPUs and 2 x N device IRQs (two multi-queue devices, a queue per CPU: the file grows as
  N squared, so the projection uses its cost measured at the node's size, not a fit);
* **per GPU**: the GPU collector against the fake NVML library with G GPUs (H100s with GPM
  and two processes each), with per-process queries every round and every 10 s;
* **per thread** (walked every 10 s while nobody reads the process table): the task
  iterator's run in the kernel over this machine's threads, and its decoding for T threads.

Then the model — µs per second = a + b x CPUs / k + c x GPUs + d x threads, where per-CPU
series come every k = ceil(CPUs / 16) rounds — fitted from these points, and its projection
for this machine, a 16-CPU / 1-GPU node and a 224-CPU / 8-GPU node. What a real driver's
NVML calls cost is not in the fake's numbers: ``bench_agent_idle.py --gpu-node`` measures that
on a GPU node.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sources" / "gpu"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sources" / "irq"))

from bench_gpu_collect import control_values
from doc_blocks import write_results
from gpu_fake_nvml import build_fake_nvml
from large_interrupts import big_interrupts

from bpfdyno.core.config import DaemonSection
from bpfdyno.core.metrics import sample
from bpfdyno.core.store import MetricStore
from bpfdyno.sources.host.collector import HostCollector
from bpfdyno.sources.irq import collector as irq_mod
from bpfdyno.sources.percpu import rounds_between
from bpfdyno.sources.perf.collector import PerfSwCollector
from bpfdyno.sources.perf.perf_event import perf_event_open
from bpfdyno.sources.sched import collector as sched_mod
from bpfdyno.sources.sched.metrics import SWITCHES

SECTION = "## The idle agent's cost model"
CPUS = (2, 16, 64, 224)
GPUS = (1, 2, 4, 8)
THREADS = (100, 1000, 10_000)
#: While nobody reads the process table, threads are walked this often.
IDLE_REFRESH_S = 10.0
PER_CPU_MAX = DaemonSection.per_cpu_series_max


def per_round_us(collect: Callable[[], object], rounds: int, between: Callable[[], None]) -> float:
    """Median thread CPU µs of ``collect`` over ``rounds`` (``between`` runs untimed)."""
    times = []
    for _ in range(rounds):
        between()
        t0 = time.thread_time_ns()
        collect()
        times.append((time.thread_time_ns() - t0) / 1e3)
    return statistics.median(times)


# --- per CPU ----------------------------------------------------------------------------------


class FakeRoot:
    """A copy of this machine's /proc files the host collector reads, with N CPUs in stat."""

    def __init__(self, base: Path, cpus: int) -> None:
        self.root = base / f"root{cpus}"
        proc = self.root / "proc"
        (proc / "net").mkdir(parents=True)
        for name in ("meminfo", "loadavg", "uptime", "diskstats"):
            shutil.copy(f"/proc/{name}", proc / name)
        shutil.copy("/proc/net/dev", proc / "net" / "dev")
        shutil.copytree("/sys/block", self.root / "sys" / "block", symlinks=True)
        for pid in range(1, 301):  # the process count is a listing of numeric names
            (proc / str(pid)).mkdir()
        self.cpus = cpus
        self.tick = 0

    def advance(self) -> None:
        """Every CPU's counters move by 100 ticks (25 user, 5 system, 70 idle)."""
        self.tick += 1
        t = self.tick
        line = f"{25 * t} 0 {5 * t} {70 * t} 0 0 0 0 0 0"
        cpus = "".join(f"cpu{i} {line}\n" for i in range(self.cpus))
        total = " ".join(str(int(v) * self.cpus) for v in line.split())
        (self.root / "proc" / "stat").write_text(
            f"cpu  {total}\n{cpus}intr 0\nctxt {1000 * t}\nbtime 1700000000\nprocesses {t}\n"
            "procs_running 1\nprocs_blocked 0\n"
        )


def host_us(tmp: Path, cpus: int, rounds: int) -> float:
    fake = FakeRoot(tmp, cpus)
    fake.advance()
    host = HostCollector(fake.root)
    host.collect()
    return per_round_us(host.collect, rounds, fake.advance)


def sched_cpu_us(cpus: int, rounds: int) -> float:
    """The scheduler's per-CPU part of a round: decode every CPU's counters, make the
    interval's samples (the walk and events are measured apart)."""
    per_cpu = sched_mod.CPU_WORDS
    online = frozenset(range(cpus))
    state = {"t": 0.0, "n": 0}

    def words() -> array[int]:
        state["n"] += 1
        return array("Q", [state["n"] * 1000 + i % per_cpu for i in range(cpus * per_cpu)])

    prev = sched_mod.totals_from_words(words(), per_cpu, 0.0)
    raw = [words()]

    def between() -> None:
        raw[0] = words()

    def collect() -> object:
        nonlocal prev
        state["t"] += 1.0
        cur = sched_mod.totals_from_words(raw[0], per_cpu, state["t"])
        out = sched_mod._interval_samples(prev, cur, [])
        out += sched_mod._per_cpu_samples(prev, cur, online)
        prev = cur
        return out

    return per_round_us(collect, rounds, between)


def perf_sw_us(cpus: int, rounds: int) -> float:
    """perf_sw with ``cpus`` per-CPU counter sets (opened on this machine's CPUs in turn)."""
    real = os.cpu_count() or 1

    def opener(attr: object, pid: int, cpu: int, group: int, flags: int) -> int:
        return perf_event_open(attr, pid, cpu % real, group, flags)  # type: ignore[arg-type]

    counts = {c: 0 for c in range(cpus)}

    def switches() -> dict[int, int]:
        for c in counts:
            counts[c] += 100
        return counts

    sw = PerfSwCollector(opener, cpus=list(range(cpus)), switch_counts=switches)  # type: ignore[arg-type]
    sw.start()
    try:
        sw.collect()
        return per_round_us(sw.collect, rounds, lambda: None)
    finally:
        sw.close()


class _IrqArray:
    """Stands in for bcc's per-CPU array of the interrupt program: one slot, ``cpus`` values
    of `irq_mod.CPU_WORDS` 64-bit words, every word moving each round."""

    def __init__(self, cpus: int) -> None:
        self.values = (ctypes.c_uint64 * irq_mod.CPU_WORDS * cpus)()
        self.n = 0

    def advance(self) -> None:
        self.n += 1
        flat = ctypes.cast(self.values, ctypes.POINTER(ctypes.c_uint64))
        for i in range(len(self.values) * irq_mod.CPU_WORDS):
            flat[i] = self.n * 1000 + i

    @staticmethod
    def Key(index: int) -> int:  # bcc's name
        return index

    def getvalue(self, key: int) -> ctypes.Array[ctypes.Array[ctypes.c_uint64]]:
        return self.values


class _IrqProgram:
    """The loaded program as the collector uses it: its array; run statistics come apart."""

    def __init__(self, array: _IrqArray) -> None:
        self.array = array

    def table(self, name: str) -> _IrqArray:
        return self.array

    def run_stats_samples(self) -> list[object]:
        return []


def irq_us(tmp: Path, cpus: int, rounds: int) -> tuple[float, int]:
    """One interrupt-collector read on N CPUs: the per-CPU array and /proc/interrupts, every
    device IRQ and the local timer having fired (a busy node's round); and its samples."""
    root = tmp / f"irq{cpus}"
    (root / "proc").mkdir(parents=True)
    online = root / "sys/devices/system/cpu/online"
    online.parent.mkdir(parents=True)
    online.write_text(f"0-{cpus - 1}\n")
    texts = [big_interrupts(cpus, 2 * cpus, step) for step in range(rounds + 2)]
    (root / "proc/interrupts").write_text(texts[0])
    array = _IrqArray(cpus)
    c = irq_mod.IrqCollector(root=root, load_bpf=False)
    c.start()
    c._program = _IrqProgram(array)  # type: ignore[assignment]
    c._prev_bpf = c._read_bpf()
    step = [0]

    def between() -> None:
        step[0] += 1
        (root / "proc/interrupts").write_text(texts[step[0]])
        array.advance()

    samples = len(c.collect())
    return per_round_us(c.collect, rounds, between), samples


def store_us_per_series(rounds: int) -> float:
    """The event loop's share: appending one sample of a per-CPU series to the store."""
    store = MetricStore(900.0, 1.0)
    batch = [sample(SWITCHES, float(i), {"cpu": str(i)}) for i in range(1000)]
    t = [0.0]

    def append() -> None:
        t[0] += 1.0
        store.append(t[0], batch)

    return per_round_us(append, rounds, lambda: None) / len(batch)


# --- per GPU ----------------------------------------------------------------------------------


@contextlib.contextmanager
def fake_nvml(tmp: Path) -> Iterator[tuple[str, Path]]:
    lib = build_fake_nvml(tmp / "nvml")
    ctypes.CDLL(str(lib), mode=os.RTLD_GLOBAL)
    control = tmp / "nvml.ctl"
    os.environ["FAKE_NVML_CONTROL"] = str(control)
    yield str(lib), control


def gpu_us(lib: str, control: Path, gpus: int, rounds: int, churn: bool) -> float:
    from bpfdyno.sources.gpu.collector import GpuCollector

    tmp = control.with_suffix(".tmp")
    tmp.write_text("".join(f"{k}={v}\n" for k, v in control_values(gpus).items()))
    os.replace(tmp, control)
    now = [0.0]
    c = GpuCollector(
        lib,
        events_enabled=False,
        clock=lambda: now[0],
        process_churn=(lambda: 0) if churn else None,
    )
    c.start()
    try:

        def between() -> None:
            now[0] += 1.0

        c.collect()
        return per_round_us(c.collect, rounds, between)
    finally:
        c.close()


# --- per thread -------------------------------------------------------------------------------


def kernel_walk_us_per_thread(rounds: int) -> tuple[float, int]:
    """The task iterator's own run (in the kernel) per thread of this machine, and threads."""
    c = sched_mod.SchedCollector()
    c.start()
    try:
        assert c._tasks is not None
        tasks = c._tasks
        walk = tasks.read()
        threads = len(walk) // sched_mod.TASK_RECORD.size
        return per_round_us(tasks.read, rounds, lambda: None) / threads, threads
    finally:
        c.close()


def walk_us_per_thread(threads: int, rounds: int) -> float:
    """Decoding one walk of ``threads`` threads (50 per process) into process totals."""
    c = sched_mod.SchedCollector()
    rec = sched_mod.TASK_RECORD
    walk = b"".join(
        rec.pack(tid, 1000 + tid // 50, tid * 10, tid, tid * 3, 5, 1, tid * 7, b"proc")
        for tid in range(threads)
    )
    return (
        per_round_us(lambda: c._refresh_processes(walk, b"", [], 1.0), rounds, lambda: None)
        / threads
    )


def fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope)."""
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - slope * mx, slope


def report(rounds: int) -> str:
    with tempfile.TemporaryDirectory(prefix="bd-scaling-") as tmp_s:
        tmp = Path(tmp_s)
        host = [host_us(tmp, n, rounds) for n in CPUS]
        sched = [sched_cpu_us(n, rounds) for n in CPUS]
        perf = [perf_sw_us(n, rounds) for n in CPUS]
        irq_runs = [irq_us(tmp, n, rounds) for n in CPUS]
        store = store_us_per_series(rounds)
        with fake_nvml(tmp) as (lib, control):
            gpu_each = [gpu_us(lib, control, g, rounds, churn=False) for g in GPUS]
            gpu_quiet = [gpu_us(lib, control, g, rounds, churn=True) for g in GPUS]
        walk = [walk_us_per_thread(t, max(5, rounds // 4)) for t in THREADS]
        kernel_walk, threads_here = kernel_walk_us_per_thread(max(5, rounds // 4))

    # Per-CPU series a round makes: host 9 (8 states + utilization), sched 2, perf_sw 5.
    series_per_cpu = 16
    a_host, b_host = fit(list(CPUS), host)
    a_sched, b_sched = fit(list(CPUS), sched)
    a_perf, b_perf = fit(list(CPUS), perf)
    a_gpu, c_gpu = fit(list(GPUS), gpu_quiet)
    _, c_gpu_each = fit(list(GPUS), gpu_each)
    per_thread = statistics.median(walk) + kernel_walk
    per_cpu = b_host + b_sched + b_perf + series_per_cpu * store
    irq = [us for us, _ in irq_runs]
    irq_stored = [us + n * store for us, n in irq_runs]

    lines = [
        f"Measured {time.strftime('%Y-%m-%d')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"median of {rounds} rounds each, load average {os.getloadavg()[0]:.2f}; CPU time of "
        "the thread doing the work, µs per round (one round a second at the defaults).",
        "",
        "| part | " + " | ".join(f"{n} CPUs" for n in CPUS) + " | per CPU (fit) |",
        "|---|" + "---|" * (len(CPUS) + 1),
        "| host (`/proc` of N CPUs) | "
        + " | ".join(f"{v:.0f}" for v in host)
        + f" | {b_host:.2f} |",
        "| sched per-CPU counters and samples | "
        + " | ".join(f"{v:.0f}" for v in sched)
        + f" | {b_sched:.2f} |",
        "| perf_sw (N counter sets) | "
        + " | ".join(f"{v:.0f}" for v in perf)
        + f" | {b_perf:.2f} |",
        "| irq (per-CPU array, /proc/interrupts of N CPUs x 2N IRQs) | "
        + " | ".join(f"{v:.0f}" for v in irq)
        + " | (measured at the size) |",
        "| irq: its samples stored | "
        + " | ".join(f"{n * store:.0f}" for _, n in irq_runs)
        + " | (its series: "
        + ", ".join(f"{n:,}" for _, n in irq_runs)
        + ") |",
        f"| store, per per-CPU series | | | | | {store:.2f} x {series_per_cpu} series |",
        "",
        "| GPU collector (fake NVML) | "
        + " | ".join(f"{g} GPU" for g in GPUS)
        + " | per GPU (fit) |",
        "|---|" + "---|" * (len(GPUS) + 1),
        "| processes asked every round | "
        + " | ".join(f"{v:.0f}" for v in gpu_each)
        + f" | {c_gpu_each:.0f} |",
        "| processes asked on exec/exit (every 10 s at idle) | "
        + " | ".join(f"{v:.0f}" for v in gpu_quiet)
        + f" | {c_gpu:.0f} |",
        "",
        f"Thread walk: {kernel_walk:.2f} µs per thread in the kernel (the iterator over this "
        f"machine's {threads_here} threads) + {per_thread - kernel_walk:.2f} µs decoding "
        "(median over "
        + ", ".join(f"{t:,}" for t in THREADS)
        + f" threads), every {IDLE_REFRESH_S:.0f} s while nobody reads the process table.",
        "",
        "Model, µs per second on the collectors' threads (the fake's NVML calls, not a "
        f"driver's): {a_host + a_sched + a_perf:.0f} + {per_cpu:.2f} x CPUs / k + "
        f"{c_gpu:.0f} x GPUs + {per_thread / IDLE_REFRESH_S:.3f} x threads + irq(CPUs) / k, "
        "where k = "
        f"ceil(CPUs / {PER_CPU_MAX}) is the rounds between two per-CPU reports "
        "(`[daemon] per_cpu_series_max`). The rest of the agent (event loop, run statistics, "
        "gRPC) does not grow with the node: bench_agent_idle.py measures the whole.",
        "",
        "| node | CPUs | GPUs | threads | k | per-CPU part | irq | per-GPU part | walk "
        "| sum, % of a core |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, cpus, gpus, threads in (
        ("this machine", os.cpu_count() or 2, 0, 400),
        ("GPU node", 16, 1, 2000),
        ("large GPU node", 224, 8, 20_000),
    ):
        k = rounds_between(cpus, PER_CPU_MAX)
        cpu_part = per_cpu * cpus / k
        irq_part = irq_stored[CPUS.index(cpus)] / k
        gpu_part = (a_gpu + c_gpu * gpus) if gpus else 0.0
        walk_part = per_thread * threads / IDLE_REFRESH_S
        total = a_host + a_sched + a_perf + cpu_part + irq_part + gpu_part + walk_part
        lines.append(
            f"| {name} | {cpus} | {gpus} | {threads:,} | {k} | {cpu_part:.0f} µs | "
            f"{irq_part:.0f} µs | "
            f"{gpu_part:.0f} µs | {walk_part:.0f} µs | {total / 1e4:.3f} % |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: perf counters on every CPU")
    results = report(args.rounds)
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_agent_scaling", results)


if __name__ == "__main__":
    main()
