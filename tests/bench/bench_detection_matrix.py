"""Detection of every fault class of the verdict matrix on the real 4-rank job: each fault
injected at a random moment, on the class's ranks in turn, while the agent's detection runs
at its defaults (5 s interval, suspected at 2 of 6 outlier intervals, confirmed at 3,
cleared at 1 or fewer). Run as root, as one command:

    python tests/bench/bench_detection_matrix.py [--injections 2] [--classes hog,quota,...]
        [--out detection-matrix.jsonl] [--gap 20] [--background-load]

The job, the CPUs and the faults (with their weakest and strongest strengths and the ranks
each class goes round) are those of `bench_verdict_matrix.py`; every rank has one DataLoader
worker (for the ``slow-worker`` class). Per injection: wait until no rank is suspected,
watch ``--gap`` seconds of the healthy job (events then are false alarms, or other work's),
wait until no rank is suspected again, wait a random 0-5 s, inject the fault, wait up to
``--within`` seconds for the injected rank to be confirmed, remove the fault, and wait up to
``--clear-within`` seconds for every rank to be cleared.

Reported per class (``--report FILE`` prints the table of a results file again):

- time to detect: from the injection to "suspected" and to "confirmed" of the injected rank
  (median and range over the injections where it came);
- recall: injections whose rank was confirmed within ``--within`` seconds;
- precision: of the suspected/confirmed events during the injections, the share that named
  the injected rank;
- cleared: from the fault's removal to the injected rank's "cleared".

And the healthy gaps: minutes watched, suspicions in them (each with the load average).
``--background-load`` runs it all beside the verdict matrix's background work (a healthy
hour with background load: ``--classes latency --injections 1 --gap 3600``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tracing"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_verdict_matrix import CPUS, FAULTS, RANKS, FaultClass, background_load
from straggler_job import StragglerJob, short_base, wait_for
from test_detection_e2e import ForeignLoad, Watcher, all_clear

from bpfdyno.detection.detector import with_net_scores
from bpfdyno.detection.signals import from_record
from bpfdyno.rpc.detection import DetectionEvent, DetectionKind, GetRankSignalsResponse
from bpfdyno.rpc.v1 import detection_pb2, detection_pb2_grpc
from bpfdyno.rpc.wire import from_pb

#: The classes of the verdict matrix that inject one fault (not the healthy ones, not two)
#: into this bench's one job (`CPUS`): the interrupt storm as ``irq-own-cpu`` (rank 2 alone
#: on CPU 1; the verdict matrix's ``irq`` runs a job of its own layout).
CLASSES = (
    "hog", "quota", "latency", "bandwidth", "loss", "wire-loss", "slow-read", "slow-worker",
    "more-work", "evict", "disk", "irq-own-cpu",
)  # fmt: skip
ALARMS = (DetectionKind.SUSPECTED, DetectionKind.CONFIRMED)


#: Bytes of one batch (trainers/ddp.py's BATCH_BYTES): a feeder's writes over it are the
#: steps its rank took.
BATCH_BYTES = 4096


def _wchar(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class IntervalLog:
    """Each of the detection's intervals as the agent compared it (`GetRankSignals`, polled
    every ``poll`` seconds: each interval once), per rank the detector's scores and its
    active links (what its network scores were made of), and the
    job's steps per second over the same stretch (each rank's feeder writes one batch a
    step: its ``wchar`` over `BATCH_BYTES`; the ranks step together, so the median)."""

    def __init__(self, job: StragglerJob, poll: float = 2.0) -> None:
        self.rows: list[dict[str, Any]] = []
        self._job = job
        self._channel = job.agent.channel()
        self._stub = detection_pb2_grpc.DetectionStub(self._channel)
        self._stop = threading.Event()
        self._poll = poll
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_end = 0.0
        last_steps: tuple[float, list[int | None]] | None = None
        while not self._stop.wait(self._poll):
            try:
                resp = self._stub.GetRankSignals(detection_pb2.GetRankSignalsRequest(), timeout=5)
            except grpc.RpcError as e:  # a slow agent: the next poll
                print(f"GetRankSignals: {e}", flush=True)
                continue
            signals = list(from_pb(GetRankSignalsResponse, resp).signals)
            if not signals or signals[0].end_unix_seconds == last_end:
                continue
            last_end = signals[0].end_unix_seconds
            now = time.monotonic()
            written = [_wchar(p.pid) for p in self._job.feeders]
            steps = None
            if last_steps is not None:
                dt = now - last_steps[0]
                rates = [
                    (b - a) / BATCH_BYTES / dt
                    for a, b in zip(last_steps[1], written, strict=True)
                    if a is not None and b is not None
                ]
                steps = round(statistics.median(rates), 2) if rates else None
            last_steps = (now, written)
            ranks = with_net_scores({r.rank: from_record(r) for r in signals})
            self.rows.append(
                {
                    "t": now,
                    "steps_per_s": steps,
                    "ranks": {
                        r: [
                            round(s.cpu_wait_share, 3),
                            round(s.main_busy_share, 3),
                            round(s.peer_wait_share, 3),
                            round(s.net.rtt_s * 1000, 2),
                            round(s.net.retransmits_per_s, 2),
                        ]
                        for r, s in sorted(ranks.items())
                    },
                    # What the network scores were made of: each rank's links that moved
                    # bytes (local and remote address, smoothed RTT in ms, bytes, retransmits,
                    # bytes it sent).
                    "links": {
                        r.rank: [
                            [
                                link.local_address,
                                link.remote_address,
                                None
                                if link.srtt_seconds is None
                                else round(link.srtt_seconds * 1e3, 2),
                                link.moved_bytes,
                                link.retransmits,
                                link.sent_bytes,
                            ]
                            for link in r.net_links
                            if link.moved_bytes > 0 or link.retransmits > 0
                        ]
                        for r in sorted(signals, key=lambda r: r.rank)
                    },
                }
            )

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        """The intervals that ended in [start, end], their times from ``start``."""
        return [{**r, "t": round(r["t"] - start, 1)} for r in self.rows if start <= r["t"] <= end]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._channel.close()


#: The order of each rank's scores in an `IntervalLog` row.
SCORE_NAMES = ("cpu_wait_share", "main_busy_share", "peer_wait_share", "net_rtt_ms", "net_retx")


def event_row(at: float, t0: float, e: DetectionEvent) -> dict[str, Any]:
    return {
        "t": round(at - t0, 2),
        "kind": e.kind.value,
        "rank": e.rank,
        "evidence": [(v.name, round(v.value, 3), round(v.job_median, 3)) for v in e.evidence],
        "hang_state": e.hang_state,
    }


def foreign_shares(foreign: ForeignLoad, start: float, end: float) -> dict[int, float]:
    """Other work's mean share of each of the job's CPUs over [start, end]."""
    return {cpu: round(foreign.share(cpu, start, end), 3) for cpu in sorted(foreign.pids)}


def inject(
    job: StragglerJob,
    watcher: Watcher,
    foreign: ForeignLoad,
    intervals: IntervalLog,
    fault: FaultClass,
    rank: int,
    strength: int,
    within: float,
    clear_within: float,
) -> dict[str, Any]:
    """One injection of ``fault`` on ``rank``; its times and the events it caused."""
    t_wait = time.monotonic()
    time.sleep(random.uniform(0.0, 5.0))  # a random moment within the detection's interval
    load = os.getloadavg()[0]
    assert fault.inject is not None
    with fault.inject(job, rank, strength):
        t0 = time.monotonic()

        def confirmed() -> bool:
            return any(
                e.kind is DetectionKind.CONFIRMED and e.rank == rank for _, e in watcher.since(t0)
            )

        with contextlib.suppress(AssertionError):
            wait_for(confirmed, within, "confirmed", step=0.2)
        t1 = time.monotonic()
    during = watcher.since(t0)
    cleared_after = None
    if any(e.rank == rank and e.kind in ALARMS for _, e in during):

        def cleared() -> bool:
            return any(
                e.kind is DetectionKind.CLEARED and e.rank == rank for _, e in watcher.since(t1)
            )

        with contextlib.suppress(AssertionError):
            wait_for(cleared, clear_within, "cleared", step=0.2)
            cleared_after = (
                next(
                    at
                    for at, e in watcher.since(t1)
                    if e.kind is DetectionKind.CLEARED and e.rank == rank
                )
                - t1
            )

    def first(kind: DetectionKind) -> float | None:
        return next((at - t0 for at, e in during if e.kind is kind and e.rank == rank), None)

    return {
        "class": fault.name,
        "rank": rank,
        "strength": fault.strengths[strength],
        "load": round(load, 2),
        "suspected_s": first(DetectionKind.SUSPECTED),
        "confirmed_s": first(DetectionKind.CONFIRMED),
        "injected_s": round(t1 - t0, 2),
        "foreign": foreign_shares(foreign, t0, t1),
        "cleared_s": None if cleared_after is None else round(cleared_after, 2),
        "events": [event_row(at, t0, e) for at, e in during if at <= t1],
        # Before the fault, while this waited for its random moment: not counted.
        "before": [event_row(at, t0, e) for at, e in watcher.since(t_wait) if at < t0],
        # The detection's intervals that ended during the fault (`SCORE_NAMES` per rank).
        "intervals": intervals.between(t0, t1),
    }


def fmt_times(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} s ({min(values):.1f}-{max(values):.1f})"


def fmt_rate(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f}, n={len(values)})"


#: A fault slowed the job when its steps per second during the injection (median of the
#: detection's intervals) were under this share of the healthy gaps' median. One that did
#: not held nobody back: no straggler to find, counted apart from the recall.
SLOWED = 0.9


def steps_of(row: dict[str, Any]) -> list[float]:
    return [float(i["steps_per_s"]) for i in row.get("intervals", []) if i["steps_per_s"]]


def slowdown(row: dict[str, Any], healthy_steps: float) -> float | None:
    """The job's steps per second during the injection over the healthy gaps' (None: not
    measured)."""
    steps = steps_of(row)
    if not steps or not healthy_steps:
        return None
    return statistics.median(steps) / healthy_steps


def held_back(row: dict[str, Any]) -> float | None:
    """How much the faulted rank waited for its peers against the job's median rank (median
    over the injection's intervals): well under 1 when the fault held that rank back alone;
    about 1 or more when it slowed the others as much (None: no gloo waits measured)."""
    ratios = []
    for i in row.get("intervals", []):
        waits = [v[2] for v in i["ranks"].values() if v[2] == v[2]]
        mine = i["ranks"].get(str(row["rank"]))
        if len(waits) >= 3 and mine is not None and statistics.median(waits) > 0:
            ratios.append(mine[2] / statistics.median(waits))
    return statistics.median(ratios) if ratios else None


def report(rows: list[dict[str, Any]]) -> None:
    by_class: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    healthy = [r for r in rows if r.get("class") == "healthy-gap"]
    for r in rows:
        if r.get("class") != "healthy-gap":
            by_class[(str(r["class"]), str(r["strength"]))].append(r)
    gap_steps = [x for r in healthy for x in steps_of(r)]
    healthy_steps = statistics.median(gap_steps) if gap_steps else 0.0
    print(f"job steps/s in the healthy gaps: {fmt_rate(gap_steps)}; a fault slowed the job")
    print(f"when its median was under {SLOWED:.0%} of theirs\n")
    print(
        "| class | strength | injections (ranks) | job steps/s against healthy | slowed the job "
        "| the rank's peer wait against the median | suspected | confirmed "
        "| recall (of those that slowed it) | precision | cleared |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    total = found = 0
    for (name, strength), runs in by_class.items():
        sus = [float(r["suspected_s"]) for r in runs if r["suspected_s"] is not None]
        con = [float(r["confirmed_s"]) for r in runs if r["confirmed_s"] is not None]
        clr = [float(r["cleared_s"]) for r in runs if r["cleared_s"] is not None]
        alarms = [e for r in runs for e in r["events"] if e["kind"] in ("suspected", "confirmed")]
        right = sum(
            1 for r in runs for e in r["events"]
            if e["kind"] in ("suspected", "confirmed") and e["rank"] == r["rank"]
        )  # fmt: skip
        ratios = [slowdown(r, healthy_steps) for r in runs]
        slowed = [r for r, x in zip(runs, ratios, strict=True) if x is not None and x < SLOWED]
        slowed_found = sum(1 for r in slowed if r["confirmed_s"] is not None)
        total += len(slowed)
        found += slowed_found
        shown = ", ".join("-" if x is None else f"{x:.2f}" for x in ratios)
        held = ", ".join("-" if x is None else f"{x:.2f}" for x in map(held_back, runs))
        ranks = ", ".join(str(r["rank"]) for r in runs)
        precision = f"{right}/{len(alarms)}" if alarms else "no events"
        print(
            f"| {name} | {strength} | {len(runs)} ({ranks}) | {shown} | {len(slowed)}/{len(runs)} "
            f"| {held} | {fmt_times(sus)} | {fmt_times(con)} | {len(con)}/{len(runs)} "
            f"({slowed_found}/{len(slowed)}) | {precision} | {fmt_times(clr)} |"
        )
    print(f"\nrecall over the injections that slowed the job: {found}/{total}")
    minutes = sum(float(r["seconds"]) for r in healthy) / 60
    false = [e for r in healthy for e in r["events"] if e["kind"] in ("suspected", "confirmed")]
    print(f"healthy gaps: {minutes:.1f} min watched, {len(false)} suspected/confirmed events")
    for r in healthy:
        for e in r["events"]:
            print(f"  gap at load {r['load']}, other work {r.get('foreign')}: {e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--injections", type=int, default=2, help="per class")
    ap.add_argument("--classes", default=",".join(CLASSES), help="comma list")
    ap.add_argument("--out", default="detection-matrix.jsonl", help="one JSON line per row")
    ap.add_argument(
        "--strength", choices=("both", "strong", "weak"), default="both",
        help="the classes' strengths: both, alternating (strong first), or one",
    )  # fmt: skip
    ap.add_argument("--gap", type=float, default=20.0, help="healthy seconds before each")
    ap.add_argument("--within", type=float, default=45.0, help="seconds to wait for confirmed")
    ap.add_argument("--clear-within", type=float, default=90.0)
    ap.add_argument(
        "--background-load",
        action="store_true",
        help="the whole run beside the verdict matrix's background work (busy loops and a "
        "disk reader at the lowest CPU weight): healthy gaps with background load",
    )
    ap.add_argument(
        "--report", default="", metavar="JSONL[,JSONL]", help="only print the files' table"
    )
    args = ap.parse_args()
    if args.report:
        rows = []
        for path in args.report.split(","):
            with open(path) as f:
                rows += [json.loads(line) for line in f if line.strip()]
        report(rows)
        return 0
    by_name = {c.name: c for c in FAULTS}
    names = [n for n in args.classes.split(",") if n]
    unknown = [n for n in names if n not in by_name or n not in CLASSES]
    if unknown:
        ap.error(f"unknown classes {unknown}: choose from {', '.join(CLASSES)}")
    print(
        f"{time.strftime('%Y-%m-%d %H:%M')} on {os.uname().release} ({os.cpu_count()} CPUs), "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    base = short_base()
    # The ranks train for as long as the run can last (each injection: two waits of up to
    # 180 s for every rank to be cleared, the gap, the fault's wait and its clearing): a job
    # that ended under the last injection would read as a fault not found.
    most_s = args.injections * len(names) * (args.gap + args.within + args.clear_within + 420)
    job = StragglerJob(
        base, RANKS, CPUS, interrupts=True, loader_workers=1, train_seconds=600 + most_s
    )
    # The detection and the net collector its network scores read, at their defaults.
    text = job.agent.config.read_text()
    for name in ("detection", "net"):
        text = text.replace(
            f"[collectors.{name}]\nenabled = false", f"[collectors.{name}]\nenabled = true"
        )
    job.agent.config.write_text(text)
    rows: list[dict[str, Any]] = []
    out = open(args.out, "a")  # noqa: SIM115 (open for the whole run)
    stack = contextlib.ExitStack()  # the background work, when asked for

    def record(row: dict[str, Any]) -> None:
        rows.append(row)
        out.write(json.dumps(row) + "\n")
        out.flush()
        print(json.dumps(row), flush=True)

    try:
        job.start()
        if args.background_load:
            stack.enter_context(background_load(job))
        watcher = Watcher(str(job.agent.sock))
        foreign = ForeignLoad(job)
        intervals = IntervalLog(job)

        def strength_of(fault: FaultClass, i: int) -> int:
            """Strong first, then alternating; or the one asked for. Strong is the class's
            last (strongest) strength, weak its first: the CPU classes have three."""
            strong = len(fault.strengths) - 1
            return {"both": (strong, 0)[i % 2], "strong": strong, "weak": 0}[args.strength]

        plan = [
            (by_name[n], by_name[n].ranks[i % len(by_name[n].ranks)], strength_of(by_name[n], i))
            for i in range(args.injections)
            for n in names
        ]
        for fault, rank, strength in plan:
            try:
                wait_for(lambda: all_clear(watcher), 180, "every rank to be cleared", step=0.5)
            except AssertionError as e:
                print(f"going on although: {e}", flush=True)
            g0 = time.monotonic()
            load = os.getloadavg()[0]
            time.sleep(args.gap)
            record(
                {
                    "class": "healthy-gap",
                    "seconds": round(time.monotonic() - g0, 1),
                    "load": round(load, 2),
                    "foreign": foreign_shares(foreign, g0, time.monotonic()),
                    "events": [event_row(at, g0, e) for at, e in watcher.since(g0)],
                    "intervals": intervals.between(g0, time.monotonic()),
                }
            )
            # Never inject while a rank is suspected (something else held it back in the
            # gap): its confirmation would count against the fault.
            try:
                wait_for(lambda: all_clear(watcher), 180, "every rank to be cleared", step=0.5)
            except AssertionError as e:
                print(f"going on although: {e}", flush=True)
            record(
                inject(
                    job,
                    watcher,
                    foreign,
                    intervals,
                    fault,
                    rank,
                    strength,
                    args.within,
                    args.clear_within,
                )
            )
        intervals.close()
        watcher.close()
        foreign.close()
    finally:
        stack.close()
        job.close()
        shutil.rmtree(base, ignore_errors=True)
        out.close()
    report(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
