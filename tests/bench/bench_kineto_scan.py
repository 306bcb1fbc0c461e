"""What reading a trainer's libkineto in bounded chunks costs against mapping it.

Run as any user: ``python tests/bench/bench_kineto_scan.py [--rounds 9] [--library PATH]``.
The search `bpfdyno.tracing.kineto_build` makes once per library file (the result is
cached): this PyTorch's ``libtorch_cpu.so`` searched for Kineto's on-demand marker,
(a) mapped and searched with ``mmap.find`` (what the agent did: a user truncating the file
under the search killed it with SIGBUS), (b) read with ``pread`` in 4 MiB chunks with a
marker-length overlap (`kineto_build.holds`, what it does now). Both read from the page
cache (one warm-up pass first); rounds alternate a/b, and the medians and their ratio are
printed, with the CPU time of each.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import time
from pathlib import Path

import torch

from bpfdyno.tracing.kineto_build import RULE_MARKER, holds


def mapped(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        with mmap.mmap(fd, 0, prot=mmap.PROT_READ) as m:
            return m.find(RULE_MARKER) >= 0
    finally:
        os.close(fd)


def chunked(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return holds(fd, os.fstat(fd).st_size, RULE_MARKER)
    finally:
        os.close(fd)


def timed(fn: object, path: Path) -> tuple[float, float]:
    w0, c0 = time.perf_counter(), time.process_time()
    fn(path)  # type: ignore[operator]
    return time.perf_counter() - w0, time.process_time() - c0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    default = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    ap.add_argument("--library", type=Path, default=default)
    args = ap.parse_args()
    path = args.library
    assert mapped(path) == chunked(path)  # the same answer (and the file in the page cache)
    rows: dict[str, list[tuple[float, float]]] = {"mmap": [], "pread": []}
    for i in range(args.rounds):
        order = [("mmap", mapped), ("pread", chunked)]
        for name, fn in order if i % 2 == 0 else reversed(order):
            rows[name].append(timed(fn, path))
    size = path.stat().st_size
    print(f"{path} ({size / 2**20:.0f} MiB), {args.rounds} rounds, medians:")
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
           for k, v in rows.items()}  # fmt: skip
    for name, (wall, cpu) in med.items():
        print(f"  {name:5}: {wall * 1e3:7.1f} ms wall, {cpu * 1e3:7.1f} ms CPU, "
              f"{size / wall / 2**30:5.2f} GiB/s")  # fmt: skip
    print(f"  pread / mmap: {med['pread'][0] / med['mmap'][0]:.2f} (wall), "
          f"{med['pread'][1] / med['mmap'][1]:.2f} (CPU)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
