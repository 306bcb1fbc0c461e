"""Time to detect a straggler on the real 4-rank job: a CPU hog started at random moments.

Run as root, as one command: ``python tests/bench/bench_detection_time.py [--injections 5]
[--healthy 120] [--load 2]``.

It starts the job of `tests/tracing/straggler_job.py` (4 ranks on gloo, each in its own network
namespace; rank 2 alone on CPU 1, the others on CPU 0) with an agent running only the tracing
component, the detection collector and the net collector its network scores read, at their
defaults (5 s interval, suspected at 2 of 6
outlier intervals, confirmed at 3, cleared at 1 or fewer), watches ``--healthy`` seconds (once
the start-up's suspicions cleared) for events (each printed with other work's share of the
rank's CPU in the 15 s before it: see the e2e test; with ``--load N``, N busy processes at
nice 19, free to run on either CPU, as the verdict matrix's ``healthy-load`` has them; a
line every 5 minutes says how long it watched and what it saw; each suspicion is printed
with the faults other runs on the machine injected on its rank's CPU then: a CPU hog pinned
there is a true detection of a fault this run did not inject),
then ``--injections`` times: waits a random 0-5 s, starts the CPU hog on rank 2's CPU, records
when "suspected" and "confirmed" arrive (and for which rank), removes the hog, and records
when "cleared" arrives. Reported: each injection's times, and the median and range.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tracing"))

from straggler_job import HOG_NAME, StragglerJob, short_base, spawn, wait_for
from test_detection_e2e import CPUS, FOREIGN_SHARE, HOG_RANK, ForeignLoad, Watcher, all_clear

from bpfdyno.rpc.detection import DetectionKind

BUSY = "import os\nos.nice(19)\nwhile True:\n    pass\n"


class ForeignFaults:
    """Each second, the faults other runs on the machine inject (it is shared with other
    benchmarks of this kind): their CPU hogs (named `HOG_NAME`) by the CPUs they are pinned
    to, and whether an interrupt storm's sender (``udp_flood.py``) runs anywhere. Its own
    job's faults are none here: the healthy stretch injects nothing."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, set[int], bool]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _scan() -> tuple[set[int], bool]:
        hogged: set[int] = set()
        storm = False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                if comm == HOG_NAME:
                    hogged |= os.sched_getaffinity(int(pid))
                elif b"udp_flood.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    storm = True
            except OSError:
                continue  # gone meanwhile
        return hogged, storm

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            hogged, storm = self._scan()
            self.seen.append((time.monotonic(), hogged, storm))

    def on(self, cpu: int, start: float, end: float) -> list[str]:
        """What other runs injected on ``cpu`` (a storm: anywhere) in [start, end]."""
        got = [(h, st) for t, h, st in self.seen if start <= t <= end]
        out = ["hog"] if any(cpu in h for h, _ in got) else []
        return out + (["storm"] if any(st for _, st in got) else [])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--injections", type=int, default=5)
    p.add_argument("--healthy", type=float, default=120.0)
    p.add_argument("--load", type=int, default=0, help="busy processes during --healthy")
    args = p.parse_args()
    base = short_base()
    # The ranks train for as long as the run can last (the start-up's clearing, the healthy
    # stretch, each injection's waits of up to 120 s for suspected, confirmed and cleared).
    job = StragglerJob(base, 4, CPUS, train_seconds=600 + args.healthy + args.injections * 400)
    # The detection and the net collector its network scores read, at their defaults.
    text = job.agent.config.read_text()
    for name in ("detection", "net"):
        text = text.replace(
            f"[collectors.{name}]\nenabled = false", f"[collectors.{name}]\nenabled = true"
        )
    job.agent.config.write_text(text)
    rows = []
    try:
        job.start()
        watcher = Watcher(str(job.agent.sock))
        wait_for(lambda: all_clear(watcher), 120, "the start-up's suspicions to clear", step=0.5)
        foreign = ForeignLoad(job)
        faults = ForeignFaults()
        busy = [
            spawn([sys.executable, "-c", BUSY], base / f"busy-{i}.out") for i in range(args.load)
        ]
        t_h = time.monotonic()
        loads = []
        try:
            while (left := t_h + args.healthy - time.monotonic()) > 0:
                time.sleep(min(left, 300.0))
                loads.append(os.getloadavg()[0])
                alarms = [
                    (at, e) for at, e in watcher.since(t_h) if e.kind is not DetectionKind.CLEARED
                ]
                print(
                    f"watched {(time.monotonic() - t_h) / 60:.1f} min: {len(alarms)} suspicions, "
                    f"load average {loads[-1]:.2f}",
                    flush=True,
                )
        finally:
            for b in busy:
                b.kill()
            foreign.close()
            faults.close()
        alarms = [(at, e) for at, e in watcher.since(t_h) if e.kind is not DetectionKind.CLEARED]
        print(
            f"healthy {(time.monotonic() - t_h) / 60:.1f} min with {args.load} busy processes: "
            f"{len(alarms)} suspicions; load average median {statistics.median(loads):.2f} "
            f"(range {min(loads):.2f}-{max(loads):.2f})",
            flush=True,
        )
        unexplained = 0
        for at, e in alarms:
            other = foreign.share(CPUS[e.rank], at - 15.0, at)
            injected = faults.on(CPUS[e.rank], at - 15.0, at)
            unexplained += not injected and other < FOREIGN_SHARE
            print(
                f"  +{(at - t_h) / 60:.1f} min {e.summary} (other work: {other:.0%} of its CPU; "
                f"other runs' faults there: {', '.join(injected) or 'none'})",
                flush=True,
            )
        print(
            f"suspicions with neither another run's fault on the rank's CPU nor other work "
            f"taking {FOREIGN_SHARE:.0%} of it: {unexplained}",
            flush=True,
        )

        def wait_seen(kind: DetectionKind, since: float) -> None:
            def seen() -> bool:
                return any(e.kind is kind for _, e in watcher.since(since))

            wait_for(seen, 120, kind.value, step=0.2)

        for i in range(args.injections):
            wait_for(lambda: all_clear(watcher), 120, "every rank to be cleared", step=0.5)
            time.sleep(random.uniform(0.0, 5.0))
            with job.cpu_hog(HOG_RANK):
                t0 = time.monotonic()

                wait_seen(DetectionKind.CONFIRMED, t0)
                t1 = time.monotonic()
            wait_seen(DetectionKind.CLEARED, t1)
            got = {e.kind: (at, e.rank) for at, e in reversed(watcher.since(t0))}
            row = (
                got[DetectionKind.SUSPECTED][0] - t0,
                got[DetectionKind.CONFIRMED][0] - t0,
                got[DetectionKind.CLEARED][0] - t1,
                {r for _, r in got.values()},
            )
            rows.append(row)
            print(
                f"injection {i + 1}: suspected {row[0]:.1f} s, confirmed {row[1]:.1f} s, "
                f"cleared {row[2]:.1f} s after the hog ended; ranks named {sorted(row[3])}",
                flush=True,
            )
        watcher.close()
    finally:
        job.close()
        shutil.rmtree(base, ignore_errors=True)
    for name, k in (("suspected", 0), ("confirmed", 1), ("cleared", 2)):
        values = [r[k] for r in rows]
        if not values:
            continue
        print(
            f"{name}: median {statistics.median(values):.1f} s, range {min(values):.1f}-"
            f"{max(values):.1f} s over {len(values)} injections"
        )
    right = sum(r[3] == {HOG_RANK} for r in rows)
    print(f"right rank (and only it) in {right} of {len(rows)} injections")
    return 0


if __name__ == "__main__":
    sys.exit(main())
