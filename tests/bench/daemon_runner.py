"""The whole agent as a benchmark subject: ``bpfdyno serve`` at its defaults, in a child.

Shared by the benchmark scripts in this directory (they put this directory first on
``sys.path`` by being run as scripts). The daemon runs with every default collector; only
where it listens moves (its own gRPC socket, a free port for the legacy RPC, a private Kineto
socket directory), so it can run beside another agent and costs exactly what the default
configuration costs. `baseline_tree` extracts another version of the agent (a git ref) so a
benchmark can run it in the same interleaved rounds: before and after from one machine and
one run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import grpc

from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc

#: Collector states that mean "start() has finished" (ok, degraded, unavailable, disabled).
#: Parts that finish starting in the background after the agent serves (the kernel-track
#: capture compiles its programs while metrics and tracing already work).
BACKGROUND = frozenset({"capture"})
_SETTLED = {
    pb.COLLECTOR_STATE_OK,
    pb.COLLECTOR_STATE_DEGRADED,
    pb.COLLECTOR_STATE_UNAVAILABLE,
    pb.COLLECTOR_STATE_DISABLED,
}


class Daemon:
    """``bpfdyno serve`` at its defaults plus ``overrides`` (``section.key=value`` strings).

    Use as a context manager: entering starts it and waits until every collector has
    finished starting, then ``settle_s`` more seconds (first rounds, compiler pages
    released); leaving stops it with SIGTERM.
    """

    def __init__(
        self,
        overrides: Sequence[str] = (),
        *,
        settle_s: float = 2.0,
        ready_timeout_s: float = 120.0,
        tree: Path | None = None,
        named_threads: bool = False,
        log_level: str = "warning",
    ) -> None:
        self.overrides = list(overrides)
        #: ``serve --log-level``: "info" to read what the agent logs at INFO (budget steps).
        self.log_level = log_level
        self.tree = tree
        #: Run it through ``named_threads.py``: its Python threads named in /proc.
        self.named_threads = named_threads
        self.settle_s = settle_s
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.ready_after_s = 0.0
        self.serving_after_s = 0.0
        self.collectors: dict[str, str] = {}
        #: The agent's log lines so far, each with the wall-clock time it was read.
        self.log: list[tuple[float, str]] = []
        self._tmp = ""
        self._log_reader: threading.Thread | None = None

    @property
    def kineto_dir(self) -> str:
        """The directory of its Kineto socket (trainers' ``KINETO_IPC_SOCKET_DIR``)."""
        return self._tmp

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        assert self.proc is not None
        return self.proc.pid

    def __enter__(self) -> Daemon:
        # sun_path is short: a short private directory for both sockets.
        self._tmp = tempfile.mkdtemp(prefix="bd-bench-", dir="/tmp")
        sock = os.path.join(self._tmp, "agent.sock")
        launcher = (
            [str(Path(__file__).with_name("named_threads.py"))]
            if self.named_threads
            else ["-m", "bpfdyno"]
        )
        args = [
            sys.executable,
            *launcher,
            "serve",
            "--socket",
            sock,
            "--log-level",
            self.log_level,
            '--set=legacy_rpc.listen=["127.0.0.1:0"]',
            f'--set=kineto.socket_dir="{self._tmp}"',
            *(f"--set={o}" for o in self.overrides),
        ]
        env = dict(os.environ)
        if self.tree is not None:  # that version's package first (bpfdyno is a namespace)
            env["PYTHONPATH"] = str(self.tree / "agent")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
        # Read the log as it comes: a full pipe would stop the agent at its next log line.
        self._log_reader = threading.Thread(target=self._read_log, daemon=True)
        self._log_reader.start()
        self.sock = sock
        self._wait_ready(sock, t0)
        self.ready_after_s = time.monotonic() - t0
        time.sleep(self.settle_s)
        return self

    def _wait_ready(self, sock: str, t0: float) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._log_reader is not None:
                    self._log_reader.join(5)
                err = "\n".join(line for _, line in self.log)
                raise RuntimeError(f"the agent exited with {self.proc.returncode}: {err}")
            if os.path.exists(sock):
                with grpc.insecure_channel(f"unix:{sock}") as ch:
                    try:
                        status = pb_grpc.AgentStub(ch).GetStatus(pb.GetStatusRequest(), timeout=5)
                    except grpc.RpcError:
                        status = None
                settled = (
                    {c.name for c in status.collectors if c.state in _SETTLED} if status else set()
                )
                names = {c.name for c in status.collectors} if status else set()
                if names and not self.serving_after_s and names - BACKGROUND <= settled:
                    self.serving_after_s = time.monotonic() - t0
                if status is not None and settled == names:
                    self.collectors = {
                        c.name: pb.CollectorState.Name(c.state).removeprefix("COLLECTOR_STATE_")
                        for c in status.collectors
                    }
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the agent was not ready within {self.ready_timeout_s:.0f} s")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        held = set(program_counters(self.pid)) if self.proc is not None else set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log_reader is not None:
            self._log_reader.join(10)
        shutil.rmtree(self._tmp, ignore_errors=True)
        # The kernel frees detached programs a little later: wait, so the next round starts
        # clean (and does not count them as someone else's).
        deadline = time.monotonic() + 10
        while held and time.monotonic() < deadline:
            held &= {int(str(p["id"])) for p in bpf_programs()}
            time.sleep(0.05)

    def _read_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append((time.time(), line.rstrip("\n")))

    def cpu_seconds(self) -> float:
        """User + system CPU time of the daemon so far (all its threads), from /proc."""
        return process_cpu_seconds(self.pid)

    def rss_bytes(self) -> int:
        """The daemon's resident set size now."""
        with open(f"/proc/{self.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def process_cpu_seconds(pid: int) -> float:
    """On-CPU time of a process so far, in seconds, to the nanosecond.

    The sum of its threads' ``schedstat`` (the scheduler's own books): ``/proc/PID/stat``
    counts in clock ticks, 10 ms, which is 0.03 % of a core over a 30 s window — as much as
    the differences measured. A thread that exits takes its time with it, so this is for
    processes whose threads live as long as they do (the agent's executors and gRPC threads).
    """
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return total / 1e9


def bpf_programs() -> list[dict[str, object]]:
    """Every loaded BPF program as ``bpftool prog show --json`` describes it."""
    bpftool = shutil.which("bpftool") or "/usr/sbin/bpftool"
    out = subprocess.run([bpftool, "prog", "show", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    progs: list[dict[str, object]] = json.loads(out.stdout or "[]")
    return progs


def program_counters(pid: int) -> dict[int, tuple[int, int]]:
    """Program id -> (run_cnt, run_time_ns) of every BPF program process ``pid`` holds.

    Read from the fdinfo of its program fds: a program belongs to whoever holds its fd.
    """
    out: dict[int, tuple[int, int]] = {}
    fd_dir = f"/proc/{pid}/fd"
    for fd in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{fd}") != "anon_inode:bpf-prog":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                info = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue  # closed meanwhile
        prog_id = int(info.get("prog_id", "-1"))
        out[prog_id] = (int(info.get("run_cnt", "0")), int(info.get("run_time_ns", "0")))
    return out


def foreign_scheduler_programs(own_pids: Sequence[int]) -> list[str]:
    """Tracing programs held by other processes (other agents or test suites).

    Another suite's program on ``sched_switch`` slows every kind of round alike, but the
    reader of the results should know it was there.
    """
    own: set[int] = set()
    for pid in own_pids:
        own.update(program_counters(pid))
    kinds = {"raw_tracepoint", "tracepoint", "tracing", "perf_event"}
    return [
        str(p.get("name", "?"))
        for p in bpf_programs()
        if p.get("type") in kinds and int(str(p["id"])) not in own
    ]


def baseline_tree(ref: str, into: Path) -> Path:
    """Extract the agent of git ``ref`` (e.g. ``main``) under ``into``, ready to run.

    ``bpf/`` goes inside the package (``agent/bpfdyno/bpf``), so that version's programs are
    the ones it compiles, not this checkout's.

    Raises:
        subprocess.CalledProcessError: not a git checkout, or no such ref.
    """
    repo = Path(__file__).resolve().parents[2]
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", ref, "agent", "bpf"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    shutil.move(str(into / "bpf"), str(into / "agent" / "bpfdyno" / "bpf"))
    return into
