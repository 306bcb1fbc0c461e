"""What ``bpfdyno top`` costs: share of one core at 1 Hz with a 500-process table.

Run as a script: ``python tests/bench/bench_tui.py [--processes 500] [--rounds 5]
[--window 10] [--size 200x50] [--mode pty|headless]``.

The UI replays a synthetic recording (the one the UI tests use: ``--processes`` rows in every
process table, 16 cores, 2 GPUs, kernel events, a new frame every second) so the numbers do
not depend on an agent. Two modes:

- ``pty`` (default): the real app (``python -m bpfdyno.tui --replay FILE``) in its own process
  on a pseudo-terminal of ``--size``, drained by a thread here like a terminal would; its CPU
  time is read from ``/proc/<pid>/stat``. The closest to a person running ``bpfdyno top``.
- ``headless``: the app in this process under Textual's headless driver (no terminal
  output at all); CPU from ``getrusage``.

Rounds interleave the tabs (Overview, Processes, Events; the order rotates each round), each
measured over ``--window`` seconds after a 2 s settle, so machine noise hits every tab alike.
Printed: per tab the median, min and max share of one core, and (pty) the bytes per second
written to the terminal. The product's budget is 10 % of one core at 1 Hz with 500 processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "top"))

from pty_app import PtyApp
from tui_synthetic import make_recording

from bpfdyno.tui.recorded import RecordedDataSource, Recording
from bpfdyno.tui.recorder import save_recording

TABS = (("1", "overview"), ("2", "processes"), ("4", "events"))
BUDGET = 0.10
SETTLE_S = 2.0


def _recording(processes: int) -> Recording:
    return make_recording(processes=processes, frames=30, cores=16, gpus=2)


def run_pty(
    rec_path: Path, rounds: int, window: float, cols: int, rows: int
) -> dict[str, list[float]]:
    """Run the app on a pseudo-terminal; per tab, the share of one core of each window."""
    argv = ["-m", "bpfdyno.tui", "--replay", str(rec_path), "--speed", "1"]
    results: dict[str, list[float]] = {name: [] for _, name in TABS}
    rates: dict[str, list[float]] = {name: [] for _, name in TABS}
    with PtyApp(argv, cols, rows, dict(os.environ)) as app:
        time.sleep(6.0)  # import, load the recording, first frames
        for r in range(rounds):
            order = TABS[r % len(TABS) :] + TABS[: r % len(TABS)]
            for key, name in order:
                app.type(key)
                time.sleep(SETTLE_S)
                w = app.measure(window)
                results[name].append(w.core_share)
                rates[name].append(w.bytes_per_s)
                print(f"round {r + 1} {name:<10} {results[name][-1] * 100:5.1f} % of a core")
    for name in rates:
        results[f"{name} bytes/s"] = rates[name]
    return results


def run_headless(
    rec: Recording, rounds: int, window: float, cols: int, rows: int
) -> dict[str, list[float]]:
    """Run the app in this process under the headless driver."""
    from bpfdyno.tui.app import TopApp

    results: dict[str, list[float]] = {name: [] for _, name in TABS}

    def cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    async def main() -> None:
        app = TopApp(RecordedDataSource(rec, speed=1.0, loop=True))
        async with app.run_test(size=(cols, rows)) as pilot:
            await asyncio.sleep(3.0)
            for r in range(rounds):
                order = TABS[r % len(TABS) :] + TABS[: r % len(TABS)]
                for key, name in order:
                    await pilot.press(key)
                    await asyncio.sleep(SETTLE_S)
                    t0, c0 = time.monotonic(), cpu()
                    await asyncio.sleep(window)
                    t1, c1 = time.monotonic(), cpu()
                    results[name].append((c1 - c0) / (t1 - t0))
                    print(f"round {r + 1} {name:<10} {results[name][-1] * 100:5.1f} % of a core")

    asyncio.run(main())
    return results


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--processes", type=int, default=500)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--window", type=float, default=10.0, help="seconds measured per tab and round")
    p.add_argument("--size", default="200x50", help="terminal COLSxROWS")
    p.add_argument("--mode", choices=["pty", "headless"], default="pty")
    args = p.parse_args()
    cols, rows = (int(x) for x in args.size.split("x"))
    rec = _recording(args.processes)
    print(
        f"{args.mode}: {args.processes} processes, {cols}x{rows}, "
        f"{args.rounds} rounds of {args.window:g} s"
    )
    if args.mode == "pty":
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "bench.json"
            save_recording(rec, path)
            results = run_pty(path, args.rounds, args.window, cols, rows)
    else:
        results = run_headless(rec, args.rounds, args.window, cols, rows)
    print(
        f"\n{'tab':<12}{'median':>9}{'min':>9}{'max':>9}   (share of one core; budget {BUDGET:.0%})"
    )
    for _, name in TABS:
        v = results[name]
        print(
            f"{name:<12}{statistics.median(v) * 100:8.1f}%{min(v) * 100:8.1f}%{max(v) * 100:8.1f}%"
        )
    for _, name in TABS:
        b = results.get(f"{name} bytes/s")
        if b:
            print(f"{name:<12} terminal output {statistics.median(b) / 1024:8.1f} KiB/s (median)")
    worst = max(statistics.median(results[name]) for _, name in TABS)
    verdict = "within" if worst <= BUDGET else "OVER"
    print(f"\nworst tab median {worst * 100:.1f}% of one core: {verdict} budget")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
