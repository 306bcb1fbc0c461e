"""Reads are never answered from an idle table, and per-process ratios are exact over the
interval they name, checked against the kernel's own /proc/<pid>/task/*/schedstat.

A real `bpfdyno serve` at its defaults (only its sockets moved) for the first; the real sched
programs and process table, driven round by round, for the second: the walk's cadence
changes (readers come and go) and the budget's steps on the sched part are taken and
undone in between. Needs root (BPF).
"""

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


@pytest.fixture
def agent() -> Iterator[str]:
    """`bpfdyno serve` at its defaults; yields its socket once it answers."""
    tmp = tempfile.mkdtemp(prefix="bd-fresh-", dir="/tmp")
    sock = os.path.join(tmp, "agent.sock")
    proc = subprocess.Popen(
        [
            *BPFDYNO,
            "serve",
            "--socket",
            sock,
            "--set=legacy_rpc.enabled=false",
            f'--set=kineto.socket_dir="{tmp}"',
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        with grpc.insecure_channel(f"unix:{sock}") as ch:
            stub = pb_grpc.AgentStub(ch)
            while True:
                assert proc.poll() is None, f"agent exited {proc.returncode}"
                assert time.monotonic() < deadline, "agent not ready in time"
                try:
                    st = stub.GetStatus(pb.GetStatusRequest(), timeout=2)
                    procs = {c.name: c for c in st.collectors}.get("procs")
                    if procs is not None and procs.collections >= 1:
                        break
                except grpc.RpcError:
                    pass
                time.sleep(0.2)
        yield sock
    finally:
        proc.terminate()
        proc.wait(timeout=15)


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


def test_ps_shows_a_process_started_4_s_before(agent: str) -> None:
    # Nobody has read the table since the agent started: it idles (one update every 10 s).
    time.sleep(6)
    child = subprocess.Popen(["sleep", "600"])
    try:
        time.sleep(4)
        rows = _ps(agent, "--filter", f"pid={child.pid}")
        assert [r["pid"] for r in rows] == [child.pid]
        assert rows[0]["comm"] == "sleep"
    finally:
        child.kill()
        child.wait()


#: ``argv[1]`` threads, all asleep for ever (the main thread included).
SLEEPER = """
import sys, threading
for _ in range(int(sys.argv[1]) - 1):
    threading.Thread(target=threading.Event().wait).start()
print("ready", flush=True)
threading.Event().wait()
"""
#: One thread on the CPU all the time.
SPINNER = """
print("ready", flush=True)
while True:
    pass
"""


def _schedstat(pid: int) -> tuple[int, int]:
    """On-CPU and run-queue wait ns of every live thread of ``pid``, as /proc says."""
    oncpu = wait = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "schedstat").read_text().split()
        oncpu += int(fields[0])
        wait += int(fields[1])
    return oncpu, wait


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


def test_ratios_are_exact_over_their_interval_across_cadence_changes_and_budget_steps() -> None:
    from bpfdyno.sources.procs.table import ProcessTable
    from bpfdyno.sources.sched.collector import SchedCollector

    demand = [True]
    sched = SchedCollector(walk_demand=lambda: demand[0])
    one, four, spin = _start(SLEEPER, "1"), _start(SLEEPER, "4"), _start(SPINNER)
    subjects = {one.pid: 1, four.pid: 4, spin.pid: 1}
    sched.start()
    try:
        table = ProcessTable(top_n=1, sched=sched.fresh_per_process, pinned=lambda: set(subjects))
        steps = {s.name: s for s in sched.reductions()}

        def round_then_read_later() -> None:
            # The round walks; the table is read 0.45 s later (a walk that young is used
            # as it is): the walk's interval, not the table's, is the ratios'.
            time.sleep(0.6)
            sched.collect()
            time.sleep(0.45)
            table.refresh()

        def idle_rounds_then_read() -> None:
            # Nobody reads: the rounds stop walking; then a reader comes.
            demand[0] = False
            for _ in range(3):
                time.sleep(0.5)
                sched.collect()
            demand[0] = True
            table.refresh()

        def budget_step(name: str, take: bool) -> None:
            step = steps[name]
            step.apply() if take else step.undo()
            time.sleep(0.3)
            sched.collect()
            time.sleep(0.7)
            table.refresh()

        actions = [
            lambda: (time.sleep(1.0), table.refresh()),
            round_then_read_later,
            # Two updates 0.2 s apart share one walk: the second's ratios are still over
            # the time between two different walks.
            lambda: (time.sleep(1.0), table.refresh(), time.sleep(0.2), table.refresh()),
            idle_rounds_then_read,
            lambda: (time.sleep(0.6), table.refresh()),
            lambda: budget_step("sched.exits_detached", True),
            lambda: budget_step("sched.switch_sampled", True),
            lambda: budget_step("sched.switch_sampled", False),
            lambda: budget_step("sched.exits_detached", False),
            round_then_read_later,
        ]
        table.refresh()
        prev: dict[int, tuple[float, float, int, int, int]] = {}
        for pid in subjects:
            row = next(r for r in table.snapshot.rows if r.pid == pid)
            assert row.oncpu_ns is not None and row.offcpu_blocked_ns is not None
            assert row.runq_wait_ns is not None
            prev[pid] = (0.0, 0.0, row.oncpu_ns, row.runq_wait_ns, row.offcpu_blocked_ns)
        prev_before = prev_after = 0.0
        for i, action in enumerate(actions):
            before = {pid: _schedstat(pid) for pid in subjects}
            t0 = time.monotonic()
            action()
            t1 = time.monotonic()
            after = {pid: _schedstat(pid) for pid in subjects}
            rows = {r.pid: r for r in table.snapshot.rows}
            for pid, threads in subjects.items():
                r = rows[pid]
                what = f"step {i}, pid {pid} ({threads} threads)"
                assert r.oncpu_ns is not None and r.runq_wait_ns is not None, what
                assert r.offcpu_blocked_ns is not None, what
                # The totals were read within the step, from the kernel's own books. /proc
                # adds a running or queued thread's current slice or wait to its books only
                # when it ends (the walk adds it up to its run queue's clock): the spinner's
                # totals may be ahead of the second /proc reading by that slice.
                pending = 50_000_000 if pid == spin.pid else 0
                assert before[pid][0] <= r.oncpu_ns <= after[pid][0] + pending, what
                assert before[pid][1] <= r.runq_wait_ns <= after[pid][1] + pending, what
                ratios = (r.oncpu_ratio, r.runq_wait_ratio, r.offcpu_blocked_ratio)
                assert all(0 <= x <= threads for x in ratios), (what, ratios)
                # Every thread's time is on CPU, waiting or blocked: together its threads.
                # A running or queued thread's books are as of its run queue's clock, which
                # lags by up to a tick (4 ms at HZ=250) at either end of a ~1 s interval.
                assert sum(ratios) == pytest.approx(threads, rel=1e-2), (what, ratios)
                _, _, oncpu0, wait0, blocked0 = prev[pid]
                if i > 0:
                    # Each ratio is its total's growth over the time between the two walks,
                    # which lies between these steps' inner and outer bounds.
                    inner, outer = t0 - prev_after, t1 - prev_before
                    for ratio, grown in (
                        (r.oncpu_ratio, r.oncpu_ns - oncpu0),
                        (r.runq_wait_ratio, r.runq_wait_ns - wait0),
                    ):
                        assert grown / 1e9 / outer - 1e-6 <= ratio <= grown / 1e9 / inner + 1e-6, (
                            what,
                            grown,
                            ratio,
                            inner,
                            outer,
                        )
                    assert r.offcpu_blocked_ns - blocked0 <= threads * outer * 1e9, what
                if pid != spin.pid:
                    # Asleep throughout: blocked all the time, never on a CPU.
                    assert r.offcpu_blocked_ratio >= threads * 0.99, (what, ratios)
                    assert r.oncpu_ratio < 0.01, (what, ratios)
                prev[pid] = (t0, t1, r.oncpu_ns, r.runq_wait_ns, r.offcpu_blocked_ns)
            prev_before, prev_after = t0, t1
    finally:
        sched.close()
        for p in (one, four, spin):
            p.kill()
            p.wait()
