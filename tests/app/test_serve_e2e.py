"""`bpfdyno serve` as a real process: CLI status/metrics against /proc, signals, files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import orjson
import pytest

import bpfdyno.version
from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc

BPFDYNO = [sys.executable, "-m", "bpfdyno"]
LIGHT = [
    # Only the host and self collectors: this file tests the daemon, not BPF or NVML.
    *(
        f"--set=collectors.{name}.enabled=false"
        for name in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "irq")
    ),
    # A known budget: the overhead budget measures but never slows the 0.5 s rounds checked
    # here (tests/sources/budget checks what it does).
    "--set=budget.enabled=false",
]


class Agent:
    def __init__(self, tmp: Path, *extra: str) -> None:
        self.sock = str(tmp / "agent.sock")
        self.jsonl = tmp / "metrics.jsonl"
        self.proc = subprocess.Popen(
            [
                *BPFDYNO,
                "serve",
                "--socket",
                self.sock,
                "--interval",
                "0.5",
                "--jsonl",
                str(self.jsonl),
                "--set=legacy_rpc.enabled=false",
                # sun_path is short: a pytest tmp_path can be too long for the IPC socket
                f'--set=kineto.socket_dir="{tempfile.mkdtemp(prefix="bd-", dir="/tmp")}"',
                *LIGHT,
                *extra,
            ],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.wait_ready()

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"agent exited {self.proc.returncode}: {self.proc.stderr.read()}"
                )  # type: ignore[union-attr]
            if os.path.exists(self.sock):
                with grpc.insecure_channel(f"unix:{self.sock}") as ch:
                    try:
                        pb_grpc.AgentStub(ch).GetStatus(pb.GetStatusRequest(), timeout=2)
                        return
                    except grpc.RpcError:
                        pass
            time.sleep(0.05)
        raise AssertionError("agent not ready in time")

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*BPFDYNO, *args, "--socket", self.sock], capture_output=True, text=True, timeout=30
        )

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        self.proc.send_signal(sig)
        _, err = self.proc.communicate(timeout=20)
        return self.proc.returncode, err


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    a = Agent(tmp_path)
    yield a
    if a.proc.poll() is None:
        a.stop()


def _meminfo_kib(key: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def test_status_and_metrics_over_the_unix_socket(agent: Agent) -> None:
    time.sleep(1.2)  # at least two rounds, so rates exist
    st = agent.cli("status", "--json")
    assert st.returncode == 0, st.stderr
    status = orjson.loads(st.stdout)
    assert status["version"] == "0.1.0"
    assert status["pid"] == agent.proc.pid
    states = {c["name"]: c["state"] for c in status["collectors"]}
    assert states["host"] == "COLLECTOR_STATE_OK"
    assert states["self"] == "COLLECTOR_STATE_OK"

    text = agent.cli("status")
    assert text.returncode == 0
    assert "host" in text.stdout and "ok" in text.stdout

    m = agent.cli("metrics", "--json", "memory_total_bytes", "cpu_*", "uptime_seconds")
    assert m.returncode == 0, m.stderr
    snap = orjson.loads(m.stdout)
    values = {(s["name"], tuple(sorted(s["labels"].items()))): s["value"] for s in snap["series"]}
    assert values[("memory_total_bytes", ())] == _meminfo_kib("MemTotal") * 1024
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    assert abs(values[("uptime_seconds", ())] - uptime) < 2.0
    total = sum(
        v
        for (name, labels), v in values.items()
        if labels == (("cpu", "total"),)
        and name
        in {
            f"cpu_{s}_ratio"
            for s in ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
        }
    )
    assert total == pytest.approx(1.0, abs=0.02)
    units = {s["name"]: s["unit"] for s in snap["series"]}
    assert units["memory_total_bytes"] == "bytes"

    plain = agent.cli("metrics", "memory_total_bytes")
    assert plain.returncode == 0
    expected = f"{_meminfo_kib('MemTotal') * 1024:,}"
    assert plain.stdout.splitlines()[1].split() == ["memory_total_bytes", expected, "bytes"]


def test_metrics_watch_streams_rounds(agent: Agent) -> None:
    p = subprocess.Popen(
        [*BPFDYNO, "metrics", "--watch", "--json", "--socket", agent.sock, "uptime_seconds"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    lines = [p.stdout.readline() for _ in range(2)]
    p.terminate()
    p.wait(timeout=10)
    rounds = [orjson.loads(line) for line in lines]
    assert [r["collector"] for r in rounds] == ["host", "host"]
    assert 0.3 < rounds[1]["ts"] - rounds[0]["ts"] < 0.8


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown(tmp_path: Path, sig: int) -> None:
    a = Agent(tmp_path)
    time.sleep(1.0)
    rc, err = a.stop(sig)
    assert rc == 0, err
    assert "stopping" in err
    assert not os.path.exists(a.sock), "socket removed on exit"
    lines = a.jsonl.read_bytes().splitlines()
    assert lines, "metrics flushed"
    for line in lines:
        orjson.loads(line)  # every line whole


def test_second_agent_on_the_same_socket_fails_clearly(agent: Agent, tmp_path: Path) -> None:
    r = subprocess.run(
        [*BPFDYNO, "serve", "--socket", agent.sock, "--set=legacy_rpc.enabled=false", *LIGHT],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert f"gRPC socket {agent.sock} is in use" in r.stderr
    # the first agent is untouched
    assert agent.cli("status").returncode == 0


def test_cli_without_an_agent_says_what_to_do(tmp_path: Path) -> None:
    r = subprocess.run(
        [*BPFDYNO, "status", "--socket", str(tmp_path / "none.sock")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 1
    assert "cannot reach the agent" in r.stderr
    assert "sudo bpfdyno serve" in r.stderr


def test_version() -> None:
    r = subprocess.run([*BPFDYNO, "--version"], capture_output=True, text=True, timeout=30)
    assert r.stdout == "bpfdyno 0.1.0\n"
    r = subprocess.run([*BPFDYNO, "version"], capture_output=True, text=True, timeout=30)
    assert r.stdout == "bpfdyno 0.1.0\n"


def test_doctor_as_a_user_of_a_running_agent_says_what_she_can_do(tmp_path: Path) -> None:
    """An ordinary user beside a healthy agent: doctor finds the agent first and says what
    she can do with it (exit 0), not "run as root", "missing bcc" or "stop the process on
    1778" — which is the agent itself."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracing"))
    from local_user import local_user

    shared = Path(tempfile.mkdtemp(prefix="bdd-", dir="/tmp"))
    shared.chmod(0o755)  # the socket's directory, reachable by the user
    a = Agent(shared, "--set=grpc.socket_mode=0o666")
    try:
        with local_user() as user:
            r = user.run([*BPFDYNO, "doctor", "--socket", a.sock], timeout=60)
            assert r.returncode == 0, r.stdout + r.stderr
            lines = r.stdout.splitlines()
            assert lines[0].startswith(
                f"ok      agent: bpfdyno {bpfdyno.version.__version__} "
                f"answers at {a.sock} (pid {a.proc.pid}, user root, up "
            ), lines[0]
            assert lines[1].startswith(f"ok      you: uid {user.uid} ({user.name}): metrics, ")
            assert "traces of your own processes" in lines[1]
            assert lines[2].startswith(("ok      agent parts: ", "warn    agent parts: "))
            for line in lines:
                assert not line.startswith("missing"), line
                assert "run as root" not in line and "bcc" not in line, line
            # Root (or --machine) also gets what this machine supports for an agent.
            r = subprocess.run([*BPFDYNO, "doctor", "--socket", a.sock], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
            assert r.returncode == 0, r.stdout
            assert "ok      agent: " in r.stdout and "ok      privileges: " in r.stdout
    finally:
        a.stop()
