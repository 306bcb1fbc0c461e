"""``bpfdyno run -- CMD``: two tasks on one node share one agent, started once; the last task
to end stops it; a killed task orphans nothing; a running node agent is used as it is.

Real processes throughout: two concurrent ``bpfdyno run`` invocations (as two SLURM tasks of
one node would be), the real supervisor and ``bpfdyno serve``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.app.job_agent import _run_command, agent_listening

pytestmark = [pytest.mark.slow]

BPFDYNO = [sys.executable, "-m", "bpfdyno"]
LIGHT = [
    "--set=legacy_rpc.enabled=false",
    "--set=budget.enabled=false",  # a known budget: measures, never reduces
    *(
        f"--set=collectors.{c}.enabled=false"
        for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "irq")
    ),
]

# The task: asks the agent it was given for its pid, says what it saw, waits for the test's
# "go" file, exits with the status it was told.
TASK = textwrap.dedent(
    """
    import json, os, subprocess, sys, time
    target = os.environ.get("BPFDYNO_TARGET", "")
    st = subprocess.run([sys.executable, "-m", "bpfdyno", "status", "--json"],
                        capture_output=True, text=True)
    pid = json.loads(st.stdout)["pid"] if st.returncode == 0 else -1
    print(json.dumps({"agent_pid": pid, "target": target, "me": os.getpid(),
                      "kineto": os.environ.get("KINETO_USE_DAEMON")}), flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.05)
    sys.exit(int(sys.argv[2]))
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purpose (its parent has not reaped it yet).
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _wait_until(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


class Node:
    """A node without an agent: a socket path nobody listens on, a state dir."""

    def __init__(self, tmp: Path) -> None:
        self.node_socket = tmp / "node.sock"
        self.state = tmp / "state"
        self.go = tmp / "go"
        self.kineto = tempfile.mkdtemp(prefix="bd-", dir="/tmp")  # sun_path is short

    def task(self, status: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*BPFDYNO, "run", "--node-socket", str(self.node_socket), "--state-dir",
             str(self.state), *LIGHT, f'--set=kineto.socket_dir="{self.kineto}"', "--",
             sys.executable, "-c", TASK, str(self.go), str(status)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if k != "BPFDYNO_TARGET"},
        )  # fmt: skip


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    yield n
    n.go.touch()
    state = n.state / "state"
    if state.exists() and state.read_text().startswith("ready"):
        pid = int(state.read_text().split()[1])
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def _report(task: subprocess.Popen[str]) -> dict[str, object]:
    import json

    assert task.stdout is not None
    line = task.stdout.readline()
    assert line, task.stderr.read() if task.stderr else ""
    return dict(json.loads(line))


def test_two_tasks_share_one_agent_started_once_and_the_last_stops_it(node: Node) -> None:
    a, b = node.task(3), node.task(5)
    ra, rb = _report(a), _report(b)
    agent_pid = ra["agent_pid"]
    assert isinstance(agent_pid, int) and agent_pid > 0, ra
    assert rb["agent_pid"] == agent_pid  # the same agent for both tasks
    assert ra["target"] == rb["target"] == str(node.state / "bpfdyno.sock")
    assert ra["kineto"] == rb["kineto"] == "1"
    assert node.state.joinpath("state").read_text().split() == ["ready", str(agent_pid)]
    node.go.touch()
    assert (a.wait(timeout=60), b.wait(timeout=60)) == (3, 5)  # each task's own status
    started = [t for t in (a, b) if "started an agent" in (t.stderr.read() if t.stderr else "")]
    assert len(started) == 1  # started once, under the lock
    _wait_until("the agent to stop after the last task", lambda: not _alive(agent_pid))
    _wait_until("the supervisor to record it", lambda: (node.state / "state").read_text()
                == "stopped\n")  # fmt: skip
    assert not agent_listening(node.state / "bpfdyno.sock")

    def leftovers() -> str:
        return subprocess.run(
            ["pgrep", "-f", str(node.state)], capture_output=True, text=True
        ).stdout

    # The supervisor writes "stopped" just before it exits: give it the moment to.
    _wait_until("no supervisor, agent or task left", lambda: leftovers() == "", timeout=10)


def test_a_killed_task_orphans_nothing_and_the_agent_waits_for_the_other(node: Node) -> None:
    a, b = node.task(0), node.task(0)
    ra, rb = _report(a), _report(b)
    agent_pid = ra["agent_pid"]
    assert isinstance(agent_pid, int) and rb["agent_pid"] == agent_pid
    a_cmd = ra["me"]
    assert isinstance(a_cmd, int)
    a.kill()  # SIGKILL the wrapper of task A, as a node failure or `kill -9` would
    a.wait()
    _wait_until("task A's command to die with its wrapper", lambda: not _alive(a_cmd))
    time.sleep(1.5)  # the supervisor looks every 0.5 s: the agent must still be there
    assert _alive(agent_pid), "the agent stopped while task B still runs"
    node.go.touch()
    assert b.wait(timeout=60) == 0
    _wait_until("the agent to stop after task B", lambda: not _alive(agent_pid))


def test_a_new_task_after_the_last_one_starts_a_fresh_agent(node: Node) -> None:
    first = node.task(0)
    pid1 = _report(first)["agent_pid"]
    node.go.touch()
    assert first.wait(timeout=60) == 0
    assert isinstance(pid1, int)
    _wait_until("the first agent to stop", lambda: not _alive(pid1))
    node.go.unlink()
    second = node.task(0)
    pid2 = _report(second)["agent_pid"]
    assert isinstance(pid2, int) and pid2 > 0 and pid2 != pid1
    node.go.touch()
    assert second.wait(timeout=60) == 0


def test_the_nodes_agent_is_used_when_it_runs(node: Node, tmp_path: Path) -> None:
    agent = subprocess.Popen(
        [*BPFDYNO, "serve", "--socket", str(node.node_socket), *LIGHT,
         f'--set=kineto.socket_dir="{node.kineto}"'],
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _wait_until("the node's agent", lambda: agent_listening(node.node_socket))
        env = {**os.environ, "BPFDYNO_TARGET": str(node.node_socket)}
        task = subprocess.run(
            [*BPFDYNO, "run", "--node-socket", str(node.node_socket), "--state-dir",
             str(node.state), "--", sys.executable, "-c", TASK, str(tmp_path), "7"],
            capture_output=True, text=True, env=env, timeout=60,
        )  # fmt: skip
        assert task.returncode == 7
        import json

        report = json.loads(task.stdout)
        assert report["agent_pid"] == agent.pid
        assert task.stderr == ""  # nothing started, nothing to say
        assert not node.state.exists()
    finally:
        agent.terminate()
        agent.wait(timeout=30)


def test_without_a_command_it_says_how_to_call_it() -> None:
    r = subprocess.run([*BPFDYNO, "run"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert "usage: bpfdyno run [OPTIONS] -- CMD" in r.stderr


@pytest.fixture
def signal_handlers() -> Iterator[None]:
    """The test process's handlers back after `_run_command` set its forwarding ones."""
    sigs = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    saved = {s: signal.getsignal(s) for s in sigs}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_a_command_that_is_not_there_is_said_as_bpfdyno_run_s_own_error(
    capsys: pytest.CaptureFixture[str], signal_handlers: None
) -> None:
    env = {"PATH": "/usr/bin:/bin"}
    assert _run_command(["no-such-command-here", "--flag"], env) == 127
    assert capsys.readouterr().err == (
        "bpfdyno run: cannot run 'no-such-command-here': not found on PATH or not executable\n"
    )
    assert _run_command(["true"], env) == 0
    assert _run_command(["sh", "-c", "exit 3"], env) == 3
