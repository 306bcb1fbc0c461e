"""SelfCollector: the agent's own CPU, memory, threads and fds, measured on this process."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

import psutil

from bpfdyno.core.metrics import Sample
from bpfdyno.sources.host.self_stats import SelfCollector

MIB = 1 << 20


def as_dict(samples: Sequence[Sample]) -> dict[str, float]:
    return {s.spec.name: s.value for s in samples}


def test_cpu_ratio_is_cpu_seconds_over_wall_seconds() -> None:
    wall, cpu = [10.0], [1.0]
    collector = SelfCollector(clock=lambda: wall[0], cpu_clock=lambda: cpu[0])
    first = as_dict(collector.collect())
    assert set(first) == {"agent_rss_bytes", "agent_threads", "agent_open_fds"}
    wall[0], cpu[0] = 12.0, 1.5
    assert as_dict(collector.collect())["agent_cpu_ratio"] == 0.25
    wall[0], cpu[0] = 13.0, 3.0  # two threads busy for the whole second
    assert as_dict(collector.collect())["agent_cpu_ratio"] == 1.5
    assert "agent_cpu_ratio" not in as_dict(collector.collect())  # clock did not advance


def test_burning_half_the_interval_shows_in_cpu_ratio() -> None:
    collector = SelfCollector()
    outer_start = time.monotonic()
    collector.collect()
    inner_start, proc_start, thread_start = (
        time.monotonic(),
        time.process_time(),
        time.thread_time(),
    )
    # Burn 0.5 s of this thread's CPU (not of wall time: on a loaded machine the thread may get
    # only part of a core), then idle until the 1 s interval is over.
    while time.thread_time() - thread_start < 0.5:
        pass
    time.sleep(max(0.0, 1.0 - (time.monotonic() - inner_start)))
    burned = time.thread_time() - thread_start
    proc_cpu = time.process_time() - proc_start
    inner_wall = time.monotonic() - inner_start
    ratio = as_dict(collector.collect())["agent_cpu_ratio"]
    outer_wall = time.monotonic() - outer_start
    # The ratio covers at least this thread's burn over at most the outer wall time, and at
    # most the process's CPU time over at least the inner wall time (plus the collects' own).
    assert burned / outer_wall <= ratio <= (proc_cpu + 0.01) / inner_wall
    assert ratio <= 1.2  # one busy thread cannot use more than one core
    if inner_wall < 1.1:  # the burn got most of a core, as on an idle machine
        assert ratio >= 0.3


def test_rss_matches_psutil_and_grows_with_an_allocation() -> None:
    collector = SelfCollector()
    before = as_dict(collector.collect())["agent_rss_bytes"]
    assert abs(before - psutil.Process().memory_info().rss) <= 0.1 * before
    block = b"\x01" * (64 * MIB)  # written, so every page is resident
    after = as_dict(collector.collect())["agent_rss_bytes"]
    assert after - before >= 60 * MIB
    del block


def test_threads_and_fds_follow_what_the_process_opens() -> None:
    collector = SelfCollector()
    before = as_dict(collector.collect())
    release = threading.Event()
    threads = [threading.Thread(target=release.wait) for _ in range(3)]
    pipes = [os.pipe() for _ in range(25)]
    for t in threads:
        t.start()
    try:
        after = as_dict(collector.collect())
    finally:
        release.set()
        for t in threads:
            t.join()
        for r, w in pipes:
            os.close(r)
            os.close(w)
    assert after["agent_threads"] - before["agent_threads"] == 3
    assert after["agent_open_fds"] - before["agent_open_fds"] == 50
