"""``bpfdyno gputrace --job-id`` across a real SLURM cluster with an agent per node.

Each test runs the real CLI as a user would, with TLS and the token in its environment, and
checks what it printed against what SLURM, the agents and the trace files say.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cluster_harness import (
    NODES,
    NodeAgent,
    Pki,
    SlurmCluster,
    TrainerJob,
    client_env,
    submit_trainers,
    wait_idle,
    wait_registered,
)

from bpfdyno.client.cluster import JobRef, NodeResolutionError, resolve_slurm_job

pytestmark = pytest.mark.slow

#: What Kineto logs when it drops a config; when a stalled rank is stopped, in seconds before
#: its trace's start, and for how long. Kineto takes up a timed config at a tick about 6 s
#: before the start (seen: its profiler turns busy then) and drops it when that tick comes
#: less than its 5 s warm-up ahead: stopped from 8.5 s to 4 s before, it does.
DROPPED, STALL_FROM_S, STALL_FOR_S = "Not starting tracing", 8.5, 4.5


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bpfdyno", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def first_event_ms(path: str) -> float:
    """Wall-clock epoch ms of a Kineto trace's first complete event."""
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    base_us = data["baseTimeNanoseconds"] / 1e3
    starts = [e["ts"] for e in data["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    return float((base_us + min(starts)) / 1e3)


def trace_id_of(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return str(data["trace_id"])


# -- resolving a job's nodes -------------------------------------------------------------------


def test_slurm_jobs_resolve_to_their_nodes_and_job_ids(
    slurm: SlurmCluster, agents: dict[str, NodeAgent], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    port = agents["n1"].port
    plain = slurm.sbatch("--nodes=2", "--wrap", "sleep 300")
    array = slurm.sbatch("--nodes=1", "--array=0-1", "--wrap", "sleep 300")
    het = slurm.sbatch("--nodes=1", "--wrap", "sleep 300", ":", "--nodes=1", "--wrap", "sleep 300")
    try:
        slurm.wait_running(plain)
        slurm.wait_running(array, parts=2)
        slurm.wait_running(het, parts=2)
        # A plain job: its nodes, in SLURM's order, each at its NodeAddr, its id on each.
        job = resolve_slurm_job(JobRef.parse(plain), port)
        assert [n.name for n in job.nodes] == slurm.job_nodes(plain)
        assert [n.target for n in job.nodes] == [
            f"127.0.0.{10 + int(n.name[1])}:{port}" for n in job.nodes
        ]
        assert {n.job_ids for n in job.nodes} == {(int(plain),)}
        # An array task: only its node, with the task's own job id (what its processes carry).
        task_node, task_raw = slurm.squeue(f"{array}_1", "%N|%A")[0].split("|")
        assert slurm.squeue(f"{array}_0", "%A") != [task_raw]  # each task has its own id
        job = resolve_slurm_job(JobRef.parse(f"{array}_1"), port)
        assert [(n.name, n.job_ids) for n in job.nodes] == [(task_node, (int(task_raw),))]
        # The whole array: every task's node, with the ids of the tasks it runs.
        ids: dict[str, set[int]] = {}
        for line in slurm.squeue(array, "%A|%N"):
            raw, node = line.split("|")
            ids.setdefault(node, set()).add(int(raw))
        job = resolve_slurm_job(JobRef.parse(array), port)
        assert {n.name: n.job_ids for n in job.nodes} == {
            node: tuple(sorted(v)) for node, v in ids.items()
        }
        # A heterogeneous job: one component, or all; the leader's id everywhere (srun gives
        # every component's steps the leader's SLURM_JOB_ID).
        comp1 = slurm.squeue(f"{het}+1", "%i|%N")
        (node1,) = [line.split("|")[1] for line in comp1 if line.startswith(f"{het}+1|")]
        job = resolve_slurm_job(JobRef.parse(f"{het}+1"), port)
        assert [(n.name, n.job_ids) for n in job.nodes] == [(node1, (int(het),))]
        job = resolve_slurm_job(JobRef.parse(het), port)
        assert len(job.nodes) == 2 and {n.job_ids for n in job.nodes} == {(int(het),)}
        # Unknown and malformed ids say so.
        with pytest.raises(NodeResolutionError, match="SLURM does not know job 999999"):
            resolve_slurm_job(JobRef.parse("999999"), port)
        with pytest.raises(NodeResolutionError, match="not a SLURM job id"):
            JobRef.parse("12-3")
    finally:
        for j in (plain, array, het):
            slurm.scancel(j)


def test_without_slurm_or_hosts_the_cli_says_what_to_do(pki: Pki, tmp_path: Path) -> None:
    env = client_env(pki)
    env["PATH"] = str(tmp_path)  # no squeue on it
    env.pop("BPFDYNO_TARGET", None)
    # A plain job id means this node's trainers of the job (dyno's meaning), said in one line;
    # this node has no agent at the default socket, which is said next.
    r = run_cli("gputrace", "--job-id", "1234", "--log-file", "/tmp/x.json", env=env)
    assert r.returncode == 1, r.stderr
    note, *rest = r.stderr.splitlines()
    assert note == (
        "bpfdyno gputrace: no scheduler answers here (SLURM's squeue is not installed): job "
        "1234 on this node's agent only; for every node of the job run it where SLURM "
        "answers, or name the nodes with --hosts h1,h2"
    )
    assert rest and "sudo bpfdyno serve" in rest[0], r.stderr
    # An array task has no meaning without SLURM: the job-wide error, with what to do.
    r = run_cli("gputrace", "--job-id", "1234_5", "--log-file", "/tmp/x.json", env=env)
    assert r.returncode == 2
    assert "squeue is not installed here" in r.stderr
    assert "--hosts h1,h2,... or --hosts-file FILE" in r.stderr


# -- tracing a job -------------------------------------------------------------------------------


def test_iteration_trace_of_every_rank_waits_for_every_file(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    trainer_job: TrainerJob,
    pki: Pki,
    trace_dir: Path,
) -> None:
    nodes = slurm.job_nodes(trainer_job.job)
    wait_idle(agents, nodes, int(trainer_job.job))
    log_file = str(trace_dir / "iter.json")
    r = run_cli(
        "gputrace", "--job-id", trainer_job.job, "--iterations", "3", "--wait",
        "--log-file", log_file, "--port", str(agents["n1"].port),
        env=client_env(pki, slurm.conf),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"job {trainer_job.job}: 2 node(s) from SLURM: {', '.join(nodes)}" in out
    assert "all 2 host(s) traced" in out
    # Every rank's file, on its node, written — and printed with its size.
    for node in nodes:
        (trainer,) = agents[node].trainers(int(trainer_job.job))
        path = f"{trace_dir}/iter_{trainer.pid}.json"
        size = os.path.getsize(path)
        assert re.search(
            rf"^  {node} pid +{trainer.pid} written +{size} bytes  {re.escape(path)}$", out, re.M
        ), out
        # The trace id in the file is the one its agent reported for that host.
        assert re.search(rf"^{node} .* {trace_id_of(path)}$", out, re.M), out
    # The other nodes were not asked.
    for other in set(NODES) - set(nodes):
        assert f"\n{other} " not in out
    # Each agent summarised its rank's file and the ranks were compared here: one process per
    # node, no collectives between them (the trainer runs no distributed job).
    assert "\nverdict: 2 processes, but fewer than two with collectives: nothing to compare" in out


def test_duration_trace_starts_every_host_at_one_time(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    trainer_job: TrainerJob,
    pki: Pki,
    trace_dir: Path,
) -> None:
    nodes = slurm.job_nodes(trainer_job.job)
    wait_idle(agents, nodes, int(trainer_job.job))
    r = run_cli(
        "gputrace", "--job-id", trainer_job.job, "--duration-ms", "300", "--wait", "--json",
        "--log-file", str(trace_dir / "dur.json"), "--port", str(agents["n1"].port),
        env=client_env(pki, slurm.conf),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "all"
    start = doc["request"]["profile_start_time_ms"]
    assert [h["host"] for h in doc["hosts"]] == nodes
    for h in doc["hosts"]:
        # Each agent handed out the same start time, and its clock offset is reported.
        (req,) = h["requests"]
        assert f"PROFILE_START_TIME={start}\n" in req["response"]["config_text"]
        assert abs(h["clock_offset_seconds"]) < 0.5
        assert h["round_trip_seconds"] >= 0
        (f,) = h["files"]
        assert f["state"] == "written" and f["size_bytes"] == os.path.getsize(f["path"])
        # ...and traced from then on: the ranks' traces begin together (a few ms apart
        # here; a second allows for a busy machine).
        assert -50 <= first_event_ms(f["path"]) - start <= 1000
    # The verdict names every host's rank, summarised by its own agent.
    verdict = doc["verdict"]
    assert {r["host"] for r in verdict["ranks"]} == set(nodes)
    assert {r["path"] for r in verdict["ranks"]} == {h["files"][0]["path"] for h in doc["hosts"]}
    # Each trainer received that same start time (Kineto logs the config it got).
    received = trainer_job.received_configs()
    for h in doc["hosts"]:
        config = received[h["requests"][0]["response"]["trace_id"]]
        assert f"PROFILE_START_TIME={start}\n" in config
        assert "ACTIVITIES_DURATION_MSECS=300\n" in config


def test_array_task_is_traced_on_its_own_node_only(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    cluster_base: Path,
    torch_python: str,
    pki: Pki,
    trace_dir: Path,
) -> None:
    job = submit_trainers(slurm, cluster_base, "array", ["--nodes=1", "--array=0-1"])
    try:
        slurm.wait_running(job.job, parts=2)
        tasks = {}
        for line in slurm.squeue(job.job, "%i|%A|%N"):
            display, raw, node = line.split("|")
            tasks[display] = (int(raw), node)
        for raw, node in tasks.values():
            wait_registered(agents, job, [node], raw)
        raw1, node1 = tasks[f"{job.job}_1"]
        raw0, node0 = tasks[f"{job.job}_0"]
        r = run_cli(
            "gputrace", "--job-id", f"{job.job}_1", "--iterations", "2", "--wait",
            "--log-file", str(trace_dir / "task.json"), "--port", str(agents["n1"].port),
            env=client_env(pki, slurm.conf),
        )  # fmt: skip
        assert r.returncode == 0, r.stdout + r.stderr
        assert f"job {job.job}_1: 1 node(s) from SLURM: {node1}" in r.stdout
        (task1,) = agents[node1].trainers(raw1)
        (task0,) = agents[node0].trainers(raw0)
        written = sorted(p.name for p in trace_dir.glob("task_*.json"))
        assert written == [f"task_{task1.pid}.json"]  # task 0's process was left alone
        assert f"pid {task1.pid:>8} written" in r.stdout
        assert str(task0.pid) not in r.stdout
    finally:
        slurm.scancel(job.job)


def test_a_node_whose_agent_is_down_is_reported_and_the_rest_succeed(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    trainer_job: TrainerJob,
    pki: Pki,
    trace_dir: Path,
) -> None:
    nodes = slurm.job_nodes(trainer_job.job)
    wait_idle(agents, nodes, int(trainer_job.job))
    down, up = agents[nodes[0]], agents[nodes[1]]
    down.stop()
    r = run_cli(
        "gputrace", "--job-id", trainer_job.job, "--iterations", "2", "--wait",
        "--log-file", str(trace_dir / "partial.json"), "--port", str(down.port),
        env=client_env(pki, slurm.conf),
    )  # fmt: skip
    assert r.returncode == 3, r.stdout + r.stderr  # some hosts failed
    out = r.stdout
    assert re.search(rf"^{down.name} +- +- +- +- +failed +-$", out, re.M), out
    assert (
        f"  {down.name} ({down.target}): cannot reach the agent at {down.target} (Failed to "
        "connect to remote host: Connection refused): is `bpfdyno serve` running there with "
        "[grpc] tcp on this port?"
    ) in out, out
    (trainer,) = up.trainers(int(trainer_job.job))
    assert f"  {up.name} pid {trainer.pid:>8} written" in out
    assert "1 of 2 host(s) traced; 1 failed (exit 3)" in out
    assert os.path.exists(trace_dir / f"partial_{trainer.pid}.json")


def test_a_wrong_token_is_refused_by_every_host_and_said_once(
    slurm: SlurmCluster, agents: dict[str, NodeAgent], pki: Pki, trace_dir: Path
) -> None:
    hosts = ",".join(a.target for a in agents.values())
    r = run_cli(
        "gputrace", "--hosts", hosts, "--log-file", str(trace_dir / "denied.json"),
        env=client_env(pki, token=pki.wrong_token),
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr  # no host traced
    assert (
        "every host: refused the credentials: the bearer token does not match the agent's "
        "grpc.token_file: check BPFDYNO_TOKEN_FILE"
    ) in r.stdout
    for a in agents.values():
        assert re.search(rf"^{re.escape(a.address)} +- +- +- +- +failed +-$", r.stdout, re.M)
    assert "no host traced: 4 failed (exit 1)" in r.stdout
    r = run_cli(
        "gputrace", "--hosts", hosts, "--log-file", str(trace_dir / "denied.json"), "--json",
        env=client_env(pki, token=pki.wrong_token),
    )  # fmt: skip
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "none"
    assert {h["error"]["kind"] for h in doc["hosts"]} == {"unauthenticated"}
    # An agent certificate the client's CA did not sign: no connection at all, said per host.
    env = client_env(pki)
    env["BPFDYNO_TLS_CA"] = str(pki.other_ca)
    r = run_cli("gputrace", "--hosts", hosts, "--log-file", "/tmp/x.json", env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    for a in agents.values():
        assert (
            f"  {a.address} ({a.target}): the TLS handshake with the agent at {a.target} failed "
            "(CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate): is "
            "$BPFDYNO_TLS_CA the CA that signed its certificate"
        ) in r.stdout, r.stdout
    assert not list(trace_dir.glob("denied*"))


def test_hosts_file_names_the_nodes_and_their_ports(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    trainer_job: TrainerJob,
    pki: Pki,
    trace_dir: Path,
    tmp_path: Path,
) -> None:
    nodes = slurm.job_nodes(trainer_job.job)
    wait_idle(agents, nodes, int(trainer_job.job))
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(
        "# the job's nodes\n" + "\n".join(f"{agents[n].target}  # {n}" for n in nodes) + "\n"
    )
    r = run_cli(
        "gputrace", "--hosts-file", str(hosts_file), "--job-id", trainer_job.job,
        "--iterations", "2", "--log-file", str(trace_dir / "listed.json"), "--json",
        env=client_env(pki),
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["nodes_from"] == "--hosts-file"
    assert [h["target"] for h in doc["hosts"]] == [agents[n].target for n in nodes]
    for h, n in zip(doc["hosts"], nodes, strict=True):
        (trainer,) = agents[n].trainers(int(trainer_job.job))
        assert [f["pid"] for f in h["files"]] == [trainer.pid]
        assert h["files"][0]["path"] == str(trace_dir / f"listed_{trainer.pid}.json")


def test_a_rank_whose_kineto_dropped_the_config_has_the_whole_job_traced_again(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    trainer_job: TrainerJob,
    pki: Pki,
    trace_dir: Path,
) -> None:
    """A rank stalled across its warm-up tick never starts its part (Kineto drops the config,
    and only its log says so): the job has no shared window. The CLI traces the whole job
    again with a new common start, into files of their own, and keeps the first try's."""
    nodes = slurm.job_nodes(trainer_job.job)
    job = int(trainer_job.job)
    wait_idle(agents, nodes, job)
    pids = {n: agents[n].trainers(job)[0].pid for n in nodes}
    stalled = nodes[1]
    drops_before = sum(
        p.read_text(errors="replace").count(DROPPED) for p in trainer_job.rank_logs()
    )
    cli = subprocess.Popen(
        [
            sys.executable, "-m", "bpfdyno", "gputrace", "--job-id", trainer_job.job,
            "--duration-ms", "300", "--wait", "--log-file", str(trace_dir / "drop.json"),
            "--port", str(agents["n1"].port),
        ],
        env=client_env(pki, slurm.conf), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    lines: list[str] = []
    try:
        assert cli.stdout is not None
        for line in cli.stdout:
            lines.append(line)
            m = re.search(r"\(PROFILE_START_TIME=(\d+)\)$", line.rstrip())
            if m:
                first_start_ms = int(m.group(1))
                break
        else:
            raise AssertionError("".join(lines) + cli.communicate()[1])
        # Stopped across the tick that would begin its warm-up: it comes too late, and
        # Kineto drops the config.
        stop_at = first_start_ms / 1000 - STALL_FROM_S
        assert time.time() < stop_at, "".join(lines)  # the plan leaves 12 s: time enough
        time.sleep(stop_at - time.time())
        os.kill(pids[stalled], signal.SIGSTOP)
        try:
            time.sleep(STALL_FOR_S)
        finally:
            os.kill(pids[stalled], signal.SIGCONT)
        out, err = cli.communicate(timeout=240)
    finally:
        cli.kill()
    out = "".join(lines) + out
    assert cli.returncode == 0, out + err
    drops = sum(p.read_text(errors="replace").count(DROPPED) for p in trainer_job.rank_logs())
    assert drops - drops_before == 1, out  # the stalled rank's, once
    assert re.search(
        rf"^try 1: Kineto dropped the config of {stalled} pid {pids[stalled]} \(it never started "
        r"tracing: stalled or too busy at its warm-up tick\), so the ranks share no window; "
        r"tracing the whole job again \(try 2 of at most 2\) with a new common start$",
        out,
        re.M,
    ), out
    starts = [int(s) for s in re.findall(r"\(PROFILE_START_TIME=(\d+)\)$", out, re.M)]
    assert starts[0] == first_start_ms and len(starts) == 2 and starts[1] > first_start_ms
    # The first try's files are listed (and kept): the healthy rank's written, the stalled
    # rank's failed; then the second try's, both written, under names of their own.
    first, second = out.split("Trace files (try 1):\n")[1].split("Trace files (try 2):\n")
    for node in nodes:
        path = f"{trace_dir}/drop_{pids[node]}.json"
        state = "failed" if node == stalled else "written"
        assert re.search(
            rf"^  {node} pid +{pids[node]} {state} .*  {re.escape(path)}$", first, re.M
        )
        again = f"{trace_dir}/drop-try2_{pids[node]}.json"
        size = os.path.getsize(again)
        assert re.search(
            rf"^  {node} pid +{pids[node]} written +{size} bytes  {re.escape(again)}$", second, re.M
        ), out
        # Both ranks traced from the second start: one shared window.
        assert -50 <= first_event_ms(again) - starts[1] <= 1000
    assert os.path.exists(f"{trace_dir}/drop_{pids[nodes[0]]}.json")
    assert "all 2 host(s) traced" in out
