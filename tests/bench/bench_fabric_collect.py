"""What one collection of the fabric and interrupt collectors costs on a large node, and one
tick of the fabric track.

Run as a script: ``python tests/bench/bench_fabric_collect.py [--write-doc docs/performance.md]``
(root for the last part: it reads a real process's threads and the interrupt program).

There is no large machine here, so the inputs are built to size, in the kernel's formats:

* the interrupt collector's ``/proc/interrupts`` part on a 224-CPU, 400-IRQ file (1 MB): a
  round where every line changed (every IRQ fired: the worst case) and one where none did;
* the fabric collector on a sysfs tree of 8 mlx5 InfiniBand adapters (tests/sources/fabric),
  every counter and hw_counter of each port (a tree on disk: the real sysfs adds each
  adapter's firmware query to every counter file read);
* one tick of the fabric track's sampler for a traced process with 64 threads using 2 of
  those adapters, with the interrupt program loaded.

Each is the CPU time (``time.process_time``) of one call: the best and the median of 30.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

# The inputs are built by the tests' fixtures.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "irq"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sources" / "fabric"))
from doc_blocks import write_results
from large_interrupts import big_interrupts
from mlx5_sysfs import SysfsTree

from bpfdyno.sources.fabric.collector import FabricCollector
from bpfdyno.sources.irq.collector import IrqCollector
from bpfdyno.tracing.capture.fabric import FabricSampler

SECTION = "## Interrupt telemetry overhead"
CPUS, IRQS, HCAS, THREADS = 224, 400, 8, 64
ROUNDS = 30


def cpu_ms(
    call: Callable[[], object], before: Callable[[], object] = lambda: None
) -> tuple[float, float]:
    """(best, median) CPU ms of ``call()`` over `ROUNDS` calls, ``before()`` untimed."""
    times = []
    for _ in range(ROUNDS):
        before()
        t0 = time.process_time()
        call()
        times.append((time.process_time() - t0) * 1e3)
    return min(times), statistics.median(times)


def irq_procfs(tmp: Path) -> tuple[tuple[float, float], tuple[float, float], int]:
    (tmp / "proc").mkdir()
    online = tmp / "sys/devices/system/cpu/online"
    online.parent.mkdir(parents=True)
    online.write_text(f"0-{CPUS - 1}\n")
    texts = [big_interrupts(CPUS, IRQS, step) for step in range(ROUNDS + 2)]
    path = tmp / "proc/interrupts"
    path.write_text(texts[0])
    clock = iter(range(1, 10 * ROUNDS)).__next__
    c = IrqCollector(root=tmp, load_bpf=False, clock=lambda: float(clock()))
    c.start()
    steps = iter(texts[1:])
    changed = cpu_ms(c.collect, lambda: path.write_text(next(steps)))
    same = cpu_ms(c.collect)
    return changed, same, len(list(c.collect()))


def adapters(root: Path) -> SysfsTree:
    tree = SysfsTree(root)
    for n in range(HCAS):
        bus = n * 16
        sw = (f"pci0000:{bus:02x}", f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0")
        tree.gpu((*sw, f"0000:{bus + 2:02x}:08.0", f"0000:{bus + 3:02x}:00.0"), n // 4)
        tree.hca(
            f"mlx5_{n}",
            (*sw, f"0000:{bus + 2:02x}:10.0", f"0000:{bus + 4:02x}:00.0"),
            n // 4,
            link_layer="InfiniBand",
            netdev=f"ib{n}",
        )
    return tree


def fabric(tmp: Path) -> tuple[tuple[float, float], int]:
    tree = adapters(tmp)
    c = FabricCollector(root=tree.root, ethtool=False)
    c.start()
    return cpu_ms(c.collect), len(list(c.collect()))


def sampler_tick(tmp: Path) -> tuple[float, float] | None:
    if os.geteuid() != 0:
        return None
    tree = adapters(tmp)
    code = textwrap.dedent(f"""
        import threading, time
        for _ in range({THREADS - 1}):
            threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
        print("ready", flush=True)
        time.sleep(3600)
    """)
    env = {**os.environ, "NCCL_IB_HCA": "mlx5_0,mlx5_1"}
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    irq = IrqCollector()
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        irq.start()
        s = FabricSampler(irq, 10.0, 100_000, root=tree.root)
        s.add("bench", p.pid)
        return cpu_ms(s.read_now)
    finally:
        irq.close()
        p.kill()
        p.wait()


def report() -> str:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        (changed, same, irq_samples) = irq_procfs(Path(a))
        fab, fab_samples = fabric(Path(b))
    with tempfile.TemporaryDirectory() as c:
        tick = sampler_tick(Path(c))
    load = os.getloadavg()[0]
    rows = [
        f"Collection costs, measured {time.strftime('%Y-%m-%d')} on {os.uname().release} "
        f"(load average {load:.2f}); CPU ms per call, best and median of {ROUNDS}:",
        "",
        "| what | best | median | samples |",
        "|---|---|---|---|",
        f"| `irq` /proc/interrupts, {CPUS} CPUs x {IRQS} IRQs, every line changed | "
        f"{changed[0]:.1f} | {changed[1]:.1f} | {irq_samples} |",
        f"| the same, no line changed | {same[0]:.1f} | {same[1]:.1f} | {irq_samples} |",
        f"| `fabric`, {HCAS} InfiniBand adapters (sysfs tree on disk) | {fab[0]:.1f} | "
        f"{fab[1]:.1f} | {fab_samples} |",
    ]
    if tick is not None:
        rows.append(
            f"| fabric track, one tick: 2 adapters, a process of {THREADS} threads | "
            f"{tick[0]:.1f} | {tick[1]:.1f} | |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write-doc", type=Path, help="update this markdown file's section")
    args = parser.parse_args()
    results = report()
    print(results)
    if args.write_doc:
        write_results(args.write_doc, SECTION, "bench_fabric_collect", results)


if __name__ == "__main__":
    main()
