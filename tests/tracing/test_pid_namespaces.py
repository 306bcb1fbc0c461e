"""Trainers in pid namespaces of their own (every container, every Kubernetes pod): the
kernel tracks of their traces are their own.

A trainer started with ``unshare --pid --fork --mount-proc`` is pid 1 in its namespace and
says so in its polls; the agent must record the process the kernel names (its pid here,
from the credentials the kernel attaches to its datagrams), not whatever process has pid 1
here (init), and two such trainers, both pid 1, must each get only their own events.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from pathlib import Path

import psutil
import pytest
from kernel_tracks_helpers import echo_server, events, long_sleeps, of_cat, row_names
from tracing_harness import TRAINERS, Harness, TrainerProc

from bpfdyno.analysis.trace_facts import read_facts
from bpfdyno.cli.tracing import format_trainers
from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.services.tracing import TraceRequest
from bpfdyno.tracing.traces import KernelTrackState, ProcState

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.usefixtures("torch_ready")]

#: Bytes each trainer sends per step (different, so a file holding the other's is caught);
#: what it gets back; its sleep per step; steps traced.
SENDS = (100_000, 70_000)
RECV, SLEEP_MS, STEPS = 30_000, 40.0, 4


def _spawn_in_pid_namespace(h: Harness, port: int, send: int, job_id: int) -> TrainerProc:
    return h.spawn(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            str(TRAINERS / "net_sleep.py"),
            f"--port={port}",
            f"--send-bytes={send}",
            f"--recv-bytes={RECV}",
            f"--sleep-ms={SLEEP_MS}",
        ],
        job_id=job_id,
    )


def _host_pid(unshare: TrainerProc) -> int:
    """The trainer's pid here: the one child ``unshare --fork`` started."""
    [child] = psutil.Process(unshare.pid).children()
    return child.pid


async def test_two_trainers_that_are_both_pid_1_each_get_their_own_kernel_tracks(
    short_tmp: Path,
) -> None:
    h = Harness(short_tmp, capture=True)
    async with h:
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(echo_server(send, RECV)) for send in SENDS]
            trainers = [
                _spawn_in_pid_namespace(h, servers[i].port, send, job_id=101 + i)
                for i, send in enumerate(SENDS)
            ]
            ports = []
            for trainer in trainers:
                assert await trainer.wait_ready() == [1]  # pid 1 in its namespace
                ready = next(line for line in trainer.lines if line.startswith("ready "))
                ports.append(int(ready.split()[2]))
            host_pids = [_host_pid(t) for t in trainers]
            assert len(set(host_pids)) == 2 and 1 not in host_pids
            views = await h.wait_trainers(lambda ts: len(ts) == 2)
            # The agent shows each by the pid it reports and the one the kernel gave it here.
            assert sorted((v.job_id, v.pid, v.host_pid) for v in views) == [
                (101, 1, host_pids[0]),
                (102, 1, host_pids[1]),
            ]
            table = format_trainers(views)  # type: ignore[arg-type]  # TrainerView: same fields
            for host_pid, job_id in zip(host_pids, (101, 102), strict=True):
                assert re.search(rf"^ *{host_pid} +1 +{job_id} ", table, re.M), table
            # Both traced at once, so both captures are active together: the first by its
            # job, the second by its pid here (as ps shows it; pid 1 would match both).
            starts = [
                h.service.start_trace(
                    TraceRequest(
                        job_id=0 if i else 101,
                        pids=(host_pids[1],) if i else (),
                        options=TraceSpec(
                            log_file=str(h.trace_dir / f"t{i}.json"), iterations=STEPS
                        ),
                        kernel_tracks=("net", "sched"),
                    )
                )
                for i in range(2)
            ]
            done = await asyncio.gather(*(h.wait_done(s.trace_id, timeout=90) for s in starts))
    for i, view in enumerate(done):
        assert len(view.processes) == 1, (starts[i], view)
        [p] = view.processes
        assert p.state is ProcState.WRITTEN, p.reason
        assert p.output_path == str(h.trace_dir / f"t{i}_1.json")
        k = p.kernel_tracks
        assert (k.state, k.merged) == (KernelTrackState.MERGED, ("net", "sched")), k.reason
        evs = events(p.output_path)
        rows = row_names(evs, 1)  # the kernel tracks sit in the process's own rows: pid 1
        local, peer = f"127.0.0.1:{ports[i]}", f"127.0.0.1:{servers[i].port}"
        net = of_cat(evs, "bpfdyno.net")
        # Only this trainer's connection, with exactly the bytes it sent and received.
        assert {rows[e["tid"]] for e in net} == {
            f"kernel net: TCP {local} -> {peer} send",
            f"kernel net: TCP {local} -> {peer} recv",
        }
        # Kineto's annotations of the traced steps' calls (the window may cut into one more).
        talks = [
            (e["ts"], e["ts"] + e["dur"])
            for e in evs
            if e.get("name") == "bpfdyno_test:talk" and e.get("pid") == 1 and e["dur"] > 0
        ]
        assert len(talks) == STEPS
        inside = [e for e in net if any(lo <= e["ts"] <= hi for lo, hi in talks)]
        sent = sum(e["args"]["bytes"] for e in inside if e["name"] == "send")
        received = sum(e["args"]["bytes"] for e in inside if e["name"] == "recv")
        assert (sent, received) == (STEPS * SENDS[i], STEPS * RECV)
        assert all(e["pid"] == 1 for e in net)
        # Its off-CPU slices are its own main thread's (named by its thread id here).
        sched_rows = {rows[e["tid"]] for e in of_cat(evs, "bpfdyno.sched")}
        assert f"kernel sched: thread {host_pids[i]} (python)" in sched_rows
        other = host_pids[1 - i]
        assert not any(str(other) in row for row in sched_rows), sched_rows
        long_sleeps(evs, 1, f"kernel sched: thread {host_pids[i]} (python)", SLEEP_MS, STEPS)
        # The reader matches the main thread by the host's pid the info slice gives.
        with open(p.output_path, "rb") as f:
            facts = read_facts(f, p.output_path)
        assert (facts.main_pid, facts.info["host_pid"], facts.main_tid) == (1, *[host_pids[i]] * 2)
