"""The idle agent, as a user meets it: a real `bpfdyno serve` at its defaults (only its
sockets moved). While nobody reads it collects every `[daemon] idle_interval_s`; a read is
answered from a round no older than one normal round; what the kernel fills between two slow
rounds loses nothing under a thread-churn storm. Needs root (BPF) and a C compiler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root"),
]

BPFDYNO = [sys.executable, "-m", "bpfdyno"]
#: The defaults: a round a second while someone reads, every 5 s while nobody does.
ROUND_S = 1.0
IDLE_S = 5.0


def _serve(*overrides: str) -> Iterator[str]:
    tmp = tempfile.mkdtemp(prefix="bd-idle-", dir="/tmp")
    sock = os.path.join(tmp, "agent.sock")
    proc = subprocess.Popen(
        [
            *BPFDYNO,
            "serve",
            "--socket",
            sock,
            "--set=legacy_rpc.enabled=false",
            f'--set=kineto.socket_dir="{tmp}"',
            *(f"--set={o}" for o in overrides),
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while _collections(sock).get("sched", 0) < 1:
            assert proc.poll() is None, f"agent exited {proc.returncode}"
            assert time.monotonic() < deadline, "agent not ready in time"
            time.sleep(0.2)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=15)


@pytest.fixture
def agent() -> Iterator[str]:
    """`bpfdyno serve` at its defaults; yields its socket once its collectors ran."""
    yield from _serve()


def _collections(sock: str) -> dict[str, int]:
    """Rounds of each collector so far (`GetStatus` is not a read of data: it moves no
    cadence)."""
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        try:
            st = pb_grpc.AgentStub(ch).GetStatus(pb.GetStatusRequest(), timeout=5)
        except grpc.RpcError:
            return {}
        return {c.name: c.collections for c in st.collectors}


def _metrics(sock: str, *names: str) -> pb.MetricsSnapshot:
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        return pb_grpc.AgentStub(ch).GetMetrics(pb.GetMetricsRequest(names=list(names)), timeout=30)


def _ps(sock: str, *args: str) -> list[dict[str, object]]:
    out = subprocess.run(
        [*BPFDYNO, "ps", "--json", "--limit", "0", "--socket", sock, *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    rows = json.loads(out.stdout)
    return list(rows["processes"] if isinstance(rows, dict) else rows)


def test_an_idle_agent_collects_slowly_and_a_read_gets_a_fresh_round(agent: str) -> None:
    # Nobody reads: over 11 s, at most 3 rounds (one every 5 s), where 11 would be normal.
    before = _collections(agent)
    time.sleep(11)
    idle = _collections(agent)
    for name in ("host", "sched", "net", "procs"):
        assert idle[name] - before[name] <= 3, (name, before[name], idle[name])

    # A process started just now is in `ps` at once, and metrics read now come from a
    # round no older than one normal round (made for this read when the last was older).
    child = subprocess.Popen(["sleep", "600"])
    try:
        rows = _ps(agent, "--filter", f"pid={child.pid}")
        assert [r["pid"] for r in rows] == [child.pid]
        assert rows[0]["comm"] == "sleep"
    finally:
        child.kill()
        child.wait()
    t_read = time.time()
    snap = _metrics(agent, "cpu_utilization_ratio", "sched_tracked_threads", "net_*")
    by_source: dict[str, float] = {}
    for s in snap.series:
        name = s.name.split("_", 1)[0]
        by_source[name] = max(by_source.get(name, 0.0), s.points[-1].unix_seconds)
    assert set(by_source) >= {"cpu", "sched", "net"}, by_source
    for name, newest in by_source.items():
        assert newest >= t_read - 1.5 * ROUND_S, (name, t_read - newest)

    # After the read, the normal cadence: a round a second.
    read = _collections(agent)
    time.sleep(5)
    after = _collections(agent)
    assert after["host"] - read["host"] >= 3, (read["host"], after["host"])


#: ``argv[1]`` threads started and joined 64 at a time, each spinning a little; then the
#: process's CPU time (every thread's, exited ones included: the kernel's own sum) in ns,
#: and a sleep until killed.
CHURN_C = r"""
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static void *work(void *arg) {
    volatile unsigned long x = 0;
    for (int i = 0; i < 20000; i++) x += i;
    return arg;
}
int main(int argc, char **argv) {
    int n = atoi(argv[1]);
    pthread_t t[64];
    for (int done = 0; done < n; done += 64) {
        for (int i = 0; i < 64; i++) pthread_create(&t[i], NULL, work, NULL);
        for (int i = 0; i < 64; i++) pthread_join(t[i], NULL);
    }
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    printf("%lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
    fflush(stdout);
    pause();
    return 0;
}
"""
#: More thread exits than the old map held between two rounds (16,384), within a slow round.
CHURN_THREADS = 40_000


@pytest.fixture(scope="module")
def churn_bin() -> Path:
    tmp = Path(tempfile.mkdtemp(prefix="bd-churn-", dir="/tmp"))
    (tmp / "churn.c").write_text(CHURN_C)
    subprocess.run(
        ["gcc", "-O2", "-pthread", "-o", str(tmp / "churn"), str(tmp / "churn.c")], check=True
    )
    return tmp / "churn"


def _dropped(sock: str, reason: str) -> float:
    snap = _metrics(sock, "sched_dropped_total")
    values = [
        s.points[-1].value
        for s in snap.series
        if any(lb.name == "reason" and lb.value == reason for lb in s.labels)
    ]
    assert len(values) == 1, snap
    return values[0]


def test_a_thread_churn_storm_at_idle_loses_no_exited_thread(agent: str, churn_bin: Path) -> None:
    time.sleep(IDLE_S + 1)  # at the slow cadence (nobody has read)
    start = _collections(agent)["sched"]
    churn = subprocess.Popen(
        [str(churn_bin), str(CHURN_THREADS)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert churn.stdout is not None
        cpu_ns = int(churn.stdout.readline())
        rounds = _collections(agent)["sched"] - start
        # Every exit was kept until a round read it: none found the map full.
        assert _dropped(agent, "exit_map_full") == 0, rounds
        # And every exited thread's books are in the process's total. The kernel's own sum
        # of its threads' CPU time (read by the process itself, which only sleeps after)
        # is more by what each thread ran after its exit was recorded (the rest of exit(),
        # a few µs each): at least 70 % of it is in, where a map full after 16,384 exits
        # would hold at most 41 % of the threads.
        rows = _ps(agent, "--filter", f"pid={churn.pid}")
        assert [r["pid"] for r in rows] == [churn.pid]
        oncpu = rows[0]["oncpu_ns"]
        assert isinstance(oncpu, int)
        assert 0.7 * cpu_ns <= oncpu <= cpu_ns, (cpu_ns, oncpu, rounds)
    finally:
        churn.kill()
        churn.wait()
