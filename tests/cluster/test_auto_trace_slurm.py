"""The automatic trace across a job's nodes, on the real SLURM test cluster.

Agents of their own (the shared ones run without the automatic trace), one per node, with
``[detection] auto_trace`` on and nothing configured as peers: each finds its ranks' SLURM job
and pulls the job's other nodes' rank signals. A three-node job of real PyTorch trainers, one
rank per node, rank 0 computing 60 ms more per step than its peers. The agent of rank 0's
node confirms it against the ranks pulled from the other two, traces the job on all three
nodes (here, and through the peers' agents over TLS with the token of its environment) with
one start time, and posts one ``traced`` event whose files and verdict cover every node.
"""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from cluster_harness import (
    NODES,
    NodeAgent,
    Pki,
    SlurmCluster,
    cleanup,
    node_agents,
    submit_trainers,
    wait_registered,
)

from bpfdyno.rpc.detection import DetectionEvent, DetectionKind
from bpfdyno.rpc.v1 import detection_pb2, detection_pb2_grpc
from bpfdyno.rpc.wire import from_pb

pytestmark = pytest.mark.slow

#: One rank per task (RANK is SLURM's task id); rank 0 spins 60 ms of CPU time each step.
WRAPPER = """#!/bin/sh
export KINETO_IPC_SOCKET_DIR="{sockets}/$SLURMD_NODENAME"
export RANK="$SLURM_PROCID"
busy=0
[ "$SLURM_PROCID" = 0 ] && busy=60
exec "{python}" "{trainer}" --seconds "$1" --step-sleep 0.05 --busy-ms "$busy"
"""
#: The trace: 2 s from one start time (the trainers' next poll and Kineto's warm-up ahead).
AUTO_TRACE = ("[detection]", "auto_trace = true", "auto_trace_seconds = 2")


@pytest.fixture
def auto_agents(
    cluster_base: Path, pki: Pki, trace_dir: Path, slurm: SlurmCluster
) -> Iterator[dict[str, NodeAgent]]:
    with node_agents(cluster_base / "auto", pki, trace_dir, slurm, AUTO_TRACE) as nodes:
        yield nodes


def events(agent: NodeAgent, job: str) -> list[DetectionEvent]:
    with grpc.insecure_channel(f"unix:{agent.sock}") as ch:
        listed = detection_pb2_grpc.DetectionStub(ch).ListEvents(
            detection_pb2.ListEventsRequest(job_id=job), timeout=10
        )
    return [from_pb(DetectionEvent, m) for m in listed.events]


def test_a_confirmed_straggler_s_agent_traces_the_job_on_every_node(
    slurm: SlurmCluster,
    auto_agents: dict[str, NodeAgent],
    cluster_base: Path,
    torch_python: str,
) -> None:
    trainer = Path(__file__).resolve().parents[1] / "tracing" / "trainers" / "linear.py"
    ranked = cluster_base / "auto-ranked"
    ranked.mkdir(exist_ok=True)
    sockets = auto_agents[NODES[0]].socket_dir.parent
    (ranked / "rank.sh").write_text(
        WRAPPER.format(sockets=sockets, python=torch_python, trainer=trainer)
    )
    (ranked / "rank.sh").chmod(0o755)
    job = submit_trainers(slurm, ranked, "auto3", ["--nodes=3"])
    try:
        slurm.wait_running(job.job)
        names = slurm.job_nodes(job.job)
        assert len(names) == 3
        wait_registered(auto_agents, job, names, int(job.job))
        # Rank 0 runs on the job's first node (SLURM's task 0).
        home, *others = names

        deadline = time.monotonic() + 240
        traced: list[DetectionEvent] = []
        while time.monotonic() < deadline and not traced:
            traced = [
                e for e in events(auto_agents[home], job.job) if e.kind is DetectionKind.TRACED
            ]
            time.sleep(1.0)
        held = events(auto_agents[home], job.job)
        assert traced, f"no traced event on {home} in 240 s; its events: {held}"
        (e,) = traced
        confirmed = [x for x in held if x.kind is DetectionKind.CONFIRMED]
        assert confirmed and confirmed[0].rank == 0, held
        assert e.rank == 0

        # One file per rank: this node's by its path, each peer's as node:path.
        assert len(e.trace_files) == 3, e.summary
        local = [f for f in e.trace_files if f.startswith("/")]
        remote = sorted(f.split(":", 1)[0] for f in e.trace_files if not f.startswith("/"))
        assert len(local) == 1 and remote == sorted(others), e.trace_files
        for f in e.trace_files:
            assert Path(f.split(":", 1)[-1]).is_file(), f
        assert e.summary.startswith(
            f"job {job.job} rank 0: automatic trace {e.trace_id} of 3 rank(s) on 3 node(s): "
            "verdict: "
        ), e.summary

        # The verdict covers every node's rank, each named by its node, with its file (the
        # trainers run no collectives: it compares nothing, it says where the time went).
        v = e.verdict
        assert v is not None, e.summary
        assert {t.host for t in v.ranks} == {socket.gethostname(), *others}, e.verdict_text
        assert {t.path for t in v.ranks} == {f.split(":", 1)[-1] for f in e.trace_files}
        assert v.headline.startswith("3 processes, but fewer than two with collectives"), v
        assert e.verdict_text.startswith(f"verdict: {v.headline}\n")

        # Every rank got a config with the same start time: one window for the job.
        starts = {}
        for trace_id, config in job.received_configs().items():
            m = re.search(r"^PROFILE_START_TIME=(\d+)$", config, re.M)
            assert m, config
            starts[trace_id] = int(m.group(1))
        assert len(starts) == 3 and len(set(starts.values())) == 1, starts
        assert e.trace_id in starts

        # The other nodes' agents traced for it, and none traced again: one event.
        for n in others:
            assert not [
                x for x in events(auto_agents[n], job.job) if x.kind is DetectionKind.TRACED
            ]
    finally:
        slurm.scancel(job.job)
        cleanup(ranked / "jobs")
