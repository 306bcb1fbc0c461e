"""The README's first commands, walked exactly as written, as root and as a new user.

The lines between ``<!-- walk:begin -->`` and ``<!-- walk:end -->`` of README.md run one by
one through ``bash -c`` — root first (who starts the daemon at its defaults), then a user made
for the test with useradd — with ``bpfdyno`` and ``python`` (with PyTorch) first on PATH, as
after vagrant/bootstrap.sh, and ``train.py`` a real PyTorch training script in the working
directory. Lines marked ``# as root:`` are root's only. ``top`` runs in a real terminal (a
pty, its screen read back by a terminal emulator) and is quit with ``q``. Any refusal,
traceback, warning, error message or empty answer fails the walk, naming the line.

A person reads each answer before typing the next line: after starting ``train.py`` the walk
waits until the job has registered (it imports torch first), as they would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracing"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "top"))
from local_user import LocalUser, local_user
from pty_screen import PtyScreen

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "tracing" / "trainers" / "linear.py"
SOCKET = "/run/bpfdyno/bpfdyno.sock"
#: What must never be in an answer a newcomer gets.
BAD = re.compile(
    r"Traceback|\bWARNING\b|\bERROR\b|(?i:rejected|refused|permission denied|no trainers)"
)


def walk_lines() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index("<!-- walk:begin -->") : text.index("<!-- walk:end -->")]
    lines = block.split("```sh\n", 1)[1].split("```", 1)[0].splitlines()
    return [line for line in lines if line.strip()]


@pytest.fixture(scope="module")
def torch_ready() -> None:  # the tracing tests' fixture, without its install
    r = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if r.returncode != 0:
        pytest.fail("PyTorch is needed for the README walk: run vagrant/bootstrap.sh test")


class Walker:
    """Runs README lines as one person (root, or ``user``) in its own working directory."""

    def __init__(self, home: Path, user: LocalUser | None) -> None:
        self.home = home
        self.user = user
        self.background: list[subprocess.Popen[bytes]] = []
        path = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
        base = user.env() if user else {**os.environ, "USER": "root", "HOME": str(home)}
        self.env = {**base, "PATH": path}
        for k in [k for k in self.env if k.startswith(("BPFDYNO_", "KINETO_", "SLURM_"))]:
            del self.env[k]
        self.name = user.name if user else "root"

    def argv(self, line: str) -> list[str]:
        argv = ["bash", "-c", line]  # as written: the comment is the shell's to ignore
        return self.user.wrap(argv) if self.user else argv

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(line), env=self.env, cwd=self.home, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip

    def start(self, line: str, log: Path) -> subprocess.Popen[bytes]:
        """A line ending in ``&``: run it (bash then waits for it, so it can be stopped)."""
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                self.argv(line.split("#")[0].rstrip().rstrip("&")), env=self.env, cwd=self.home,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.background.append(proc)
        return proc

    def stop(self) -> None:
        for proc in reversed(self.background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


def registered(walker: Walker, timeout: float = 120) -> None:
    """Wait (as the person would) until one of their trainers has registered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = walker.run("bpfdyno trainers --json")
        if r.returncode == 0 and json.loads(r.stdout)["trainers"]:
            return
        time.sleep(1)
    raise AssertionError(f"{walker.name}'s train.py did not register in {timeout:g} s")


def check_answer(walker: Walker, line: str, r: subprocess.CompletedProcess[str]) -> None:
    said = f"{walker.name}$ {line}\nexit {r.returncode}\nstdout: {r.stdout[-3000:]}\n" + (
        f"stderr: {r.stderr[-3000:]}"
    )
    assert r.returncode == 0, said
    assert r.stdout.strip(), "an empty answer: " + said
    assert r.stderr == "", said
    assert not BAD.search(r.stdout), said


def walk(walker: Walker, lines: list[str], serve_log: Path) -> None:
    for line in lines:
        if "# as root:" in line and walker.user is not None:
            continue
        cmd = line.split("#")[0].strip()
        if cmd.endswith("&"):
            if cmd.startswith("bpfdyno serve"):
                walker.start(line, serve_log)
                wait_ready(serve_log)
            else:
                walker.start(line, walker.home / "train.log")
                registered(walker)
            continue
        if cmd.startswith("bpfdyno top"):
            walk_top(walker, line)
            continue
        r = walker.run(line)
        check_answer(walker, line, r)
        if cmd.startswith("bpfdyno gputrace"):
            assert "written" in r.stdout, r.stdout
        if cmd.startswith("bpfdyno timeline"):
            assert (walker.home / "job.svg").read_text().startswith("<svg")


def wait_ready(log: Path) -> None:
    deadline = time.monotonic() + 120
    while "next: " not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.2)
    text = log.read_text()
    assert not re.search(r" (WARNING|ERROR) ", text), text


def walk_top(walker: Walker, line: str) -> None:
    demo = "--demo" in line
    with PtyScreen(walker.argv(line), 80, 24, walker.env) as term:
        host = os.uname().nodename
        screen = term.wait_for(
            lambda s: ("GPU0" in s and "recording" in s) if demo else f"● {host} " in s,
            timeout=90,
            why="the recording's GPU" if demo else f"connected to the agent on {host}",
        )
        assert "1 Overview" in screen, screen
        if not demo:
            term.wait_for(lambda s: re.search(r" CPU +\d+%", s) is not None, 30, "CPU load")
        term.type("2")
        term.wait_for("PID", timeout=30)
        term.type("q")
        status = term.wait_exit(15)
    assert status == 0, f"{walker.name}$ {line}: exit {status}\n{term.text()}"
    assert b"Traceback" not in term.raw(), term.raw()[-2000:]


@pytest.fixture
def daemon_free() -> Iterator[None]:
    """The walk starts the daemon at its defaults: nothing else may hold its socket."""
    if os.path.exists(SOCKET):
        r = subprocess.run([sys.executable, "-m", "bpfdyno", "status"], capture_output=True)
        if r.returncode == 0:
            pytest.fail(f"an agent already runs on {SOCKET}: stop it to walk the README")
    yield


@pytest.mark.usefixtures("daemon_free")
def test_the_readme_walk_as_root_then_as_a_new_user(tmp_path: Path) -> None:
    lines = walk_lines()
    assert any(line.startswith("bpfdyno serve &") for line in lines)
    os.chmod(tmp_path, 0o755)
    root_home = tmp_path / "root"
    root_home.mkdir()
    shutil.copy(TRAIN, root_home / "train.py")
    serve_log = tmp_path / "serve.log"
    root = Walker(root_home, None)
    try:
        walk(root, lines, serve_log)
        # root's job ends; the daemon stays for the user.
        for proc in root.background[1:]:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        with local_user() as user:
            shutil.copy(TRAIN, user.home / "train.py")
            os.chown(user.home / "train.py", user.uid, user.gid)
            person = Walker(user.home, user)
            try:
                walk(person, lines, serve_log)
            finally:
                person.stop()
            traces = list(Path(f"/tmp/bpfdyno/{user.name}").glob("trace_*.json"))
            assert traces and all(t.stat().st_uid == user.uid for t in traces)
    finally:
        root.stop()
