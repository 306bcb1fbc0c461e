"""SIGKILL of the agent in the middle of a trace, then a restart: the PyTorch trainer is
unharmed (it keeps training and writes the trace it was given), registers with the new
agent on its own, and the next trace is delivered and written.

Real processes: `bpfdyno serve`, an unmodified PyTorch 2.13 trainer (KINETO_USE_DAEMON=1),
the `bpfdyno` CLI.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

pytestmark = [pytest.mark.slow]

TRAINERS = Path(__file__).resolve().parents[1] / "tracing" / "trainers"
BPFDYNO = [sys.executable, "-m", "bpfdyno"]
T = TypeVar("T")


def _wait(what: str, check: Callable[[], T | None], timeout: float = 90.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Node:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.sock = str(base / "agent.sock")
        self.kineto_dir = tempfile.mkdtemp(prefix="bd-", dir="/tmp")  # sun_path is short
        self.traces = base / "traces"
        self.traces.mkdir()
        self.agent: subprocess.Popen[str] | None = None
        self.trainer: subprocess.Popen[str] | None = None

    def start_agent(self) -> subprocess.Popen[str]:
        self.agent = subprocess.Popen(
            [*BPFDYNO, "serve", "--socket", self.sock, "--set=legacy_rpc.enabled=false",
             f'--set=kineto.socket_dir="{self.kineto_dir}"',
             f'--set=tracing.allowed_dirs=["{self.traces}"]',
             *(f"--set=collectors.{c}.enabled=false"
               for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "irq"))],
            stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        _wait("the agent", lambda: self.cli("status").returncode == 0 or None)
        return self.agent

    def start_trainer(self) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))}
        env.update(KINETO_USE_DAEMON="1", KINETO_IPC_SOCKET_DIR=self.kineto_dir,
                   KINETO_CONFIG=str(TRAINERS / "kineto.conf"), OMP_NUM_THREADS="1",
                   PYTHONUNBUFFERED="1")  # fmt: skip
        self.trainer = subprocess.Popen(
            [sys.executable, str(TRAINERS / "linear.py"), "--seconds", "600"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            cwd=self.base, start_new_session=True,
        )  # fmt: skip
        assert self.trainer.stdout is not None
        assert self.trainer.stdout.readline().startswith("ready ")
        return self.trainer

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*BPFDYNO, *args, "--socket", self.sock], capture_output=True,
                              text=True, timeout=120)  # fmt: skip

    def trainer_state(self, pid: int) -> str | None:
        r = self.cli("trainers", "--json")
        if r.returncode != 0:
            return None
        trainers: list[dict[str, Any]] = json.loads(r.stdout).get("trainers", [])
        return next((str(t.get("state", "")) for t in trainers if t["pid"] == pid), None)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    for p in (n.trainer, n.agent):
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


def _trace_file(directory: Path, stem: str, pid: int) -> Path | None:
    found = sorted(directory.glob(f"{stem}*{pid}*.json"))
    return found[0] if found and found[0].stat().st_size > 0 else None


def test_sigkill_during_a_trace_leaves_the_trainer_unharmed_and_the_next_trace_works(
    node: Node,
) -> None:
    agent = node.start_agent()
    trainer = node.start_trainer()
    pid = trainer.pid
    _wait("the trainer to register", lambda: node.trainer_state(pid))
    r = node.cli("gputrace", "--pids", str(pid), "--duration-ms", "2000", "--log-file",
                 str(node.traces / "first.json"))  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    _wait("the trainer to take the trace",
          lambda: node.trainer_state(pid) in ("TRAINER_STATE_TRACING",) or None)  # fmt: skip

    agent.send_signal(signal.SIGKILL)  # in the middle of the trace
    agent.wait()
    # The trainer keeps training and writes the trace it was given without the agent.
    first = _wait("the first trace file", lambda: _trace_file(node.traces, "first", pid))
    events = json.loads(first.read_text())["traceEvents"]
    assert any(e.get("name", "").startswith("aten::") for e in events)
    assert trainer.poll() is None, "the trainer died with the agent"

    node.start_agent()  # same Kineto socket directory: a stale socket file is replaced
    _wait("the trainer to register with the new agent", lambda: node.trainer_state(pid))
    r = node.cli("gputrace", "--pids", str(pid), "--duration-ms", "1000", "--log-file",
                 str(node.traces / "second.json"), "--wait", "--timeout", "90")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    second = _trace_file(node.traces, "second", pid)
    assert second is not None, r.stdout
    assert str(second) in r.stdout  # the agent reports the file the trainer wrote
    assert json.loads(second.read_text())["traceEvents"]
    assert trainer.poll() is None
