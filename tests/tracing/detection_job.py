"""What the real-job detection tests share: the 4-rank job (`straggler_job`) with an agent
whose detection (and any other collector a test names) is on at its defaults, the reader of
the agent's `WatchEvents` stream, and the measure of other work on the job's CPUs.

CPUs as in `test_straggler_verdict`: rank 2 alone on CPU 1 (a hog is pinned there), ranks 0,
1 and 3 share CPU 0.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import grpc
from straggler_job import JOB_ID, StragglerJob, short_base, wait_for

from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.v1 import detection_pb2, detection_pb2_grpc
from bpfdyno.rpc.wire import from_pb

RANKS = 4
CPUS = (0, 0, 1, 0)
#: The bound on the time from a hog's start to "confirmed": 3 outlier intervals of 5 s,
#: the part of an interval before the hog, and a loaded machine's slack.
CONFIRM_WITHIN_S = 45.0
#: ... and from the fault's end to "cleared" (the outlier intervals leave the window of 6).
CLEAR_WITHIN_S = 75.0
#: Other work on a rank's CPU, as a share of it, that makes a suspicion in a healthy run a
#: true one.
FOREIGN_SHARE = 0.2


@contextmanager
def detection_job(
    collectors: Sequence[str] = ("detection",),
    edit: Callable[[StragglerJob, str], str] | None = None,
) -> Iterator[StragglerJob]:
    """The started job whose agent runs ``collectors`` at their defaults (the harness's agent
    runs none); ``edit`` changes the agent's config text further before it starts."""
    base = short_base()
    j = StragglerJob(base, RANKS, CPUS)
    text = j.agent.config.read_text()
    for name in collectors:
        enabled = text.replace(
            f"[collectors.{name}]\nenabled = false", f"[collectors.{name}]\nenabled = true"
        )
        assert enabled != text, f"the harness's config has no disabled [collectors.{name}]"
        text = enabled
    if edit is not None:
        text = edit(j, text)
    j.agent.config.write_text(text)
    try:
        j.start()
        yield j
    finally:
        j.close()
        shutil.rmtree(base, ignore_errors=True)


def with_auto_trace(j: StragglerJob, text: str, extra: str) -> str:
    """``text`` (the agent's config) with its traces in the job's trace directory and the
    automatic trace on, ``extra`` (``key = value`` lines) added to its ``[detection]``."""
    enabled = text.replace(
        "[tracing]\n", f"[tracing]\ntrace_dir = {json.dumps(str(j.agent.trace_dir))}\n"
    )
    assert enabled.count("enabled = true") == 1 and "trace_dir" in enabled
    return enabled + f"[detection]\nauto_trace = true\n{extra}"


class Watcher:
    """Reads the agent's WatchEvents stream on a thread: (monotonic time, event) each."""

    def __init__(self, sock: str) -> None:
        self.events: list[tuple[float, DetectionEvent]] = []
        self._channel = grpc.insecure_channel(f"unix:{sock}")
        stub = detection_pb2_grpc.DetectionStub(self._channel)
        self._stream = stub.WatchEvents(detection_pb2.WatchEventsRequest(job_id=str(JOB_ID)))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for msg in self._stream:
                self.events.append((time.monotonic(), from_pb(DetectionEvent, msg)))
        except grpc.RpcError:
            pass  # cancelled by close()

    def since(self, t: float) -> list[tuple[float, DetectionEvent]]:
        return [(at, e) for at, e in self.events if at >= t]

    def wait(
        self,
        kind: DetectionKind,
        since: float,
        within: float,
        what: str,
        rank: int | None = None,
        step: float = 0.2,
    ) -> None:
        """Until an event of ``kind`` (for ``rank``, if given) came at or after ``since``."""

        def seen() -> bool:
            return any(
                e.kind is kind and (rank is None or e.rank == rank) for _, e in self.since(since)
            )

        wait_for(seen, within, what, step=step)

    def close(self) -> None:
        self._stream.cancel()
        self._thread.join(10)
        self._channel.close()


@contextmanager
def watching(job: StragglerJob) -> Iterator[Watcher]:
    w = Watcher(str(job.agent.sock))
    try:
        yield w
    finally:
        w.close()


def all_clear(watcher: Watcher) -> bool:
    """No rank is suspected or confirmed: each rank's last event (if any) cleared it."""
    last = {e.rank: e.kind for _, e in watcher.since(0.0) if e.kind is not DetectionKind.HANG}
    return all(kind is DetectionKind.CLEARED for kind in last.values())


def wait_all_clear(watcher: Watcher, within: float) -> None:
    """Until no rank is suspected: the job's start-up (a rank was seen held back then) or an
    earlier fault is over."""
    wait_for(lambda: all_clear(watcher), within, "no rank suspected", step=0.5)


def random_moment() -> None:
    """Sleep to a random moment within the detection's interval (5 s)."""
    time.sleep(random.uniform(0.0, 5.0))


def describe(events: list[tuple[float, DetectionEvent]], t0: float) -> str:
    return "\n".join(f"  +{at - t0:5.1f} s {e.summary}" for at, e in events) or "  (none)"


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def _cpu_ticks(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return int(fields[11]) + int(fields[12])  # utime + stime
    except (OSError, ValueError, IndexError):
        return 0


class ForeignLoad:
    """Each second, the share of each of the job's CPUs that other work used: the CPU's busy
    time (/proc/stat user + nice + system) less its pinned job processes' (the launcher, its
    torchrun and rank, every thread)."""

    def __init__(self, job: StragglerJob) -> None:
        self.pids: dict[int, list[int]] = {}
        for i, launcher in enumerate(job.launchers):
            tree, todo = [], [launcher.pid]
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo += _children(pid)
            self.pids.setdefault(CPUS[i], []).extend(tree)
        self.shares: list[tuple[float, dict[int, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _busy(self) -> dict[int, int]:
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in self.pids:
                    out[int(name[3:])] = int(fields[0]) + int(fields[1]) + int(fields[2])
        return out

    def _reading(self) -> dict[int, int]:
        busy = self._busy()
        return {c: busy[c] - sum(_cpu_ticks(p) for p in pids) for c, pids in self.pids.items()}

    def _run(self) -> None:
        hz = os.sysconf("SC_CLK_TCK")
        last, t_last = self._reading(), time.monotonic()
        while not self._stop.wait(1.0):
            now, t = self._reading(), time.monotonic()
            span = (t - t_last) * hz
            self.shares.append((t, {c: max(0, now[c] - last[c]) / span for c in now}))
            last, t_last = now, t

    def share(self, cpu: int, start: float, end: float) -> float:
        """Other work's mean share of ``cpu`` over the seconds in [start, end]."""
        got = [s[cpu] for t, s in self.shares if start <= t <= end]
        return sum(got) / len(got) if got else 0.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def __enter__(self) -> ForeignLoad:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
