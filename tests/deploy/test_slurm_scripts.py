"""deploy/slurm: the prolog starts one agent per node (also when two run at once), the
epilog stops it only once no other job is on the node. Real scripts, real agent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from bpfdyno.app.job_agent import agent_listening

pytestmark = [pytest.mark.slow]

SLURM = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
BPFDYNO = Path(sys.executable).with_name("bpfdyno")


def _env(run: Path, **extra: str) -> dict[str, str]:
    kineto = tempfile.mkdtemp(prefix="bd-", dir="/tmp")
    light = " ".join(
        f"--set=collectors.{c}.enabled=false"
        for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "irq")
    )
    return {
        **os.environ,
        "BPFDYNO_BIN": str(BPFDYNO),
        "BPFDYNO_RUN": str(run),
        "BPFDYNO_SERVE_ARGS": f"{light} --set=legacy_rpc.enabled=false "
        f'--set=kineto.socket_dir="{kineto}"',
        "SLURM_JOB_ID": "41",
        **extra,
    }


def _serve_pids(run: Path) -> list[int]:
    r = subprocess.run(["pgrep", "-f", f"serve --socket {run}/bpfdyno.sock"],
                       capture_output=True, text=True)  # fmt: skip
    return [int(p) for p in r.stdout.split()]


def test_prolog_starts_one_agent_and_epilog_stops_it_after_the_last_job(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env = _env(run)
    prologs = [
        subprocess.Popen(
            ["bash", str(SLURM / "prolog.sh")], env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        for p in prologs:
            assert p.wait(timeout=120) == 0, p.stderr.read() if p.stderr else ""
        assert agent_listening(run / "bpfdyno.sock")
        pids = _serve_pids(run)
        assert len(pids) == 1, pids  # two prologs at once, one agent
        assert int((run / "prolog.pid").read_text()) == pids[0]
        # Another job still on the node: the agent stays.
        r = subprocess.run(["bash", str(SLURM / "epilog.sh")], env={**env, "OTHER_JOBS": "1"},
                           timeout=60)  # fmt: skip
        assert r.returncode == 0 and agent_listening(run / "bpfdyno.sock")
        # The last job: the agent goes, and the pid file with it.
        r = subprocess.run(["bash", str(SLURM / "epilog.sh")], env={**env, "OTHER_JOBS": "0"},
                           timeout=60)  # fmt: skip
        assert r.returncode == 0
        deadline = time.monotonic() + 30
        while _serve_pids(run):
            assert time.monotonic() < deadline, "the agent outlived the epilog"
            time.sleep(0.1)
        assert not (run / "prolog.pid").exists()
        assert not agent_listening(run / "bpfdyno.sock")
    finally:
        for pid in _serve_pids(run):
            os.kill(pid, 9)


@pytest.mark.root
def test_prolog_gives_the_jobs_user_her_kineto_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    root = Path(tempfile.mkdtemp(prefix="bk-", dir="/tmp")) / "k"  # short: sockets go in it
    env = _env(run, SLURM_JOB_UID="4242")
    env["BPFDYNO_SERVE_ARGS"] += f' --set=kineto.user_socket_root="{root}"'
    try:
        p = subprocess.run(["bash", str(SLURM / "prolog.sh")], env=env, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert p.returncode == 0 and p.stderr == "", p.stderr
        st = os.lstat(root / "4242")
        assert (st.st_uid, st.st_mode & 0o7777) == (4242, 0o700)
        assert (root / "4242" / "dynolog").is_socket()  # the agent listens there
    finally:
        subprocess.run(["bash", str(SLURM / "epilog.sh")], env={**env, "OTHER_JOBS": "0"},
                       timeout=60)  # fmt: skip
        for pid in _serve_pids(run):
            os.kill(pid, 9)
        shutil.rmtree(root.parent, ignore_errors=True)


def test_the_scripts_are_valid_bash() -> None:
    for script in SLURM.glob("*.sh"):
        r = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, (script.name, r.stderr)
        assert os.access(script, os.X_OK), f"{script.name} is not executable"
