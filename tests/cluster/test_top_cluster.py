"""``bpfdyno top --job-id``: the cluster view in a Textual pilot against the real agents of
the test cluster (TLS and token, as the CLI uses them): a row per node, drilling into a
node's full view and back, ``T`` tracing the whole job, and a node whose agent goes down.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from cluster_harness import NodeAgent, Pki, SlurmCluster, TrainerJob, wait_idle
from textual.widgets import Input, Static

from bpfdyno.client.cluster import JobRef, resolve_slurm_job
from bpfdyno.tui.cluster_app import ClusterApp
from bpfdyno.tui.cluster_model import node_cells
from bpfdyno.tui.cluster_source import ClusterDataSource
from bpfdyno.tui.screens.cluster import ClusterScreen
from bpfdyno.tui.screens.job_trace import JobTraceScreen

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "top"))
from tui_helpers import screen_text, wait_until, widget_text

pytestmark = pytest.mark.slow


def _mem_total_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


async def test_cluster_rows_drill_down_job_trace_and_a_node_going_down(
    slurm: SlurmCluster,
    agents: dict[str, NodeAgent],
    trainer_job: TrainerJob,
    pki: Pki,
    trace_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("BPFDYNO_TLS_CA", str(pki.ca))
    monkeypatch.setenv("BPFDYNO_TOKEN_FILE", str(pki.token))
    job_id = int(trainer_job.job)
    names = slurm.job_nodes(trainer_job.job)
    wait_idle(agents, names, job_id)
    job = resolve_slurm_job(JobRef.parse(trainer_job.job), agents["n1"].port)
    source = ClusterDataSource(
        job.nodes, job=trainer_job.job, job_id=job_id, origin="SLURM", poll_interval_s=1.0
    )
    app = ClusterApp(source, refresh_s=0.5, retry_s=(0.2, 0.5))
    async with app.run_test(size=(120, 40)) as pilot:
        state = app.cluster_state
        # -- a row per node, live ----------------------------------------------------------
        # The agents' capture programs may still be loading on a busy machine ("starting"):
        # wait for every part to be up, as the rows then say.
        await wait_until(
            pilot,
            lambda: (
                len(state.nodes) == 2
                and all(n.up and n.trainers == 1 and n.agent_state == "ok" for n in state.nodes)
            ),
            90,
            "both nodes' rows, each with its registered rank, every part of its agent ok",
        )
        await pilot.pause(0.6)
        text = screen_text(app)
        assert f"job {trainer_job.job} · 2 node(s) from SLURM · 2 answering" in text
        mem = _mem_total_bytes()
        for n, name in zip(state.nodes, names, strict=True):
            assert n.node.name == name and n.agent_state == "ok"
            assert n.memory_total_bytes == mem  # every "node" is this machine
            assert 0.0 <= n.cpu_ratio <= 1.0
            cells = node_cells(n)
            # No GPU, no BPF scheduler collector on these agents: unknown, never 0.
            assert cells[:2] == [name, "ok"] and cells[4:7] == ["-", "-", "-"]
            # No RDMA device here either: its columns are unknown too.
            assert cells[9:11] == ["-", "-"]
            assert cells[12:14] == ["-", "1"]
            assert any(line.startswith(f"{name} ") and " ok " in line for line in text.splitlines())
        # -- drill into the first node, see its trainer, come back -------------------------
        first = agents[names[0]]
        (trainer,) = first.trainers(job_id)
        await pilot.press("enter")
        await wait_until(pilot, lambda: app.state.connection.connected, 20, "the node's view")
        assert not isinstance(app.screen, ClusterScreen)
        assert app.state.job_id == str(job_id)
        await pilot.press("3")
        await wait_until(
            pilot, lambda: [t.pid for t in app.state.trainers] == [trainer.pid], 20, "trainers"
        )
        await pilot.pause(0.6)
        bar = widget_text(app.query_one("#status-bar", Static))
        assert bar.endswith(first.target) and f"job {job_id}" in bar
        assert str(trainer.pid) in screen_text(app)
        await pilot.press("c")
        await wait_until(pilot, lambda: isinstance(app.screen, ClusterScreen), 10, "cluster")
        assert not app.node_open
        # -- T: trace every rank through the fan-out ---------------------------------------
        await pilot.press("T")
        await wait_until(pilot, lambda: isinstance(app.screen, JobTraceScreen), 10, "the form")
        form = app.screen
        assert form.query_one("#trace-pids", Input).disabled
        assert form.query_one("#trace-job", Input).value == str(job_id)
        await pilot.click("#mode-iterations")
        form.query_one("#trace-amount", Input).value = "2"
        form.query_one("#trace-file", Input).value = str(trace_dir / "tui.json")
        await pilot.press("ctrl+s")
        await wait_until(
            pilot,
            lambda: state.trace is not None and state.trace_finished,
            120,
            "the job trace to finish",
        )
        assert state.trace is not None and state.trace.outcome == "all"
        for row, name in zip(state.trace.hosts, names, strict=True):
            (f,) = row.files()
            (rank,) = agents[name].trainers(job_id)
            assert (row.node.name, row.outcome, f.pid, f.state) == (name, "ok", rank.pid, "written")
            assert f.path == str(trace_dir / f"tui_{rank.pid}.json")
            assert f.size_bytes == os.path.getsize(f.path)
        await pilot.pause(0.3)
        progress = widget_text(form.query_one("#trace-progress", Static))
        assert progress.startswith("job trace: done, all")
        # ... and the ranks compared, as gputrace --wait prints it.
        assert state.trace.verdict is not None
        assert {r.host for r in state.trace.verdict.ranks} == set(names)
        assert "\nverdict: 2 processes, but fewer than two with collectives" in progress
        await pilot.press("escape")
        # -- a node whose agent goes down stays, in red, with why; and comes back ----------
        down = agents[names[1]]
        down.stop()
        await wait_until(
            pilot,
            lambda: any(not n.up and n.node.name == down.name for n in state.nodes),
            30,
            "the stopped node to show down",
        )
        (row,) = [n for n in state.nodes if n.node.name == down.name]
        assert row.error is not None
        assert row.error.message.startswith(f"cannot reach the agent at {down.target}")
        await pilot.pause(0.6)
        text = screen_text(app)
        assert "1 answering, 1 down" in text
        assert any(
            line.startswith(f"{down.name} ") and " down " in line and "cannot reach" in line
            for line in text.splitlines()
        ), text
        down.start()
        down.wait_ready()
        await wait_until(
            pilot, lambda: all(n.up for n in state.nodes), 30, "the node to answer again"
        )
