"""The straggler job's faults stay with the run that made them: a CPU hog or a storm left
behind by a run killed outright made other runs on the machine name a rank "waiting for a
CPU held by stress-hog" that they had not started (docs/tracing.md, the fault matrix).

Every process `straggler_job.spawn` starts dies with the process that started it, and
`straggler_job.foreign_faults` names the hogs on the machine that this process did not
start (the matrix waits for them to end and counts a run they overlapped as disturbed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from straggler_job import HOG_NAME, foreign_faults, spawn

HERE = Path(__file__).resolve().parent

#: A process that takes the hog's name and sleeps (no CPU time: only its name matters).
NAMED_SLEEPER = f"""
import ctypes, os, time
ctypes.CDLL(None).prctl(15, b"{HOG_NAME}", 0, 0, 0)  # PR_SET_NAME
print(os.getpid(), flush=True)
time.sleep(600)
"""

#: Starts a sleeper with `spawn` and prints its pid, then sleeps: killed outright, it leaves
#: the sleeper without the run that made it.
STARTER = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(HERE)!r})
from straggler_job import spawn
p = spawn([sys.executable, "-c", "import time; time.sleep(600)"], Path(sys.argv[1]))
print(p.pid, flush=True)
time.sleep(600)
"""


def gone(pid: int) -> bool:
    """Exited (reaped, or a zombie waiting for whoever inherited it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_until(pred: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def test_what_a_run_started_dies_when_the_run_is_killed(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "child.out")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert starter.stdout is not None
    child = int(starter.stdout.readline())
    try:
        assert not gone(child)
        starter.kill()  # SIGKILL: no finally, no cleanup of its own runs
        starter.wait(timeout=10)
        assert wait_until(lambda: gone(child), 10), f"pid {child} outlived the run that made it"
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_hog_another_run_left_is_foreign_and_ones_own_is_not(tmp_path: Path) -> None:
    own = spawn([sys.executable, "-c", NAMED_SLEEPER], tmp_path / "own.out")
    # Another run's: started by a process that exits at once, so it belongs to no process
    # of this one (reparented), as a hog of another session's run is.
    orphaner = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-c', sys.argv[1]],"
            " stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,"
            " start_new_session=True)\n"
            "print(p.stdout.readline().strip(), flush=True)\n",
            NAMED_SLEEPER,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    other = int(orphaner.stdout)
    try:
        assert wait_until(lambda: own.lines(), 10)
        found = foreign_faults()
        assert found.get(other) == HOG_NAME
        assert own.pid not in found
    finally:
        own.kill()
        os.kill(other, signal.SIGKILL)
    assert wait_until(lambda: other not in foreign_faults(), 10)
