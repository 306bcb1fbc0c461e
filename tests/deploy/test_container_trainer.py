"""A PyTorch trainer in a podman container (its own pid, mount and network namespaces; only
the agent's Kineto socket directory mounted in) traced end to end by the host's agent
(`bpfdyno serve` on the node, as the Debian package or a checkout runs it).

The trainer is pid 1 in its container and says so; the agent must trace the process the
kernel names (its pid on the host), show both pids in ``trainers`` and ``ps``, and merge into
its file that process's own kernel events: its connection, inside its own network namespace,
with exactly the bytes it sent and received in the traced steps, and its own thread's sleeps.
The file is written in the container's file system only.

The container's root is an overlay on the host's (``--rootfs /:O``), so the trainer runs
this checkout's PyTorch without an image build; podman gives it private namespaces as for
any image. (On these machines podman runs runc with cgroups v1 and explicit ulimits.)
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tracing"))
from kernel_tracks_helpers import long_sleeps, of_cat, row_names  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.timeout(600)]

TRAINERS = REPO / "tests" / "tracing" / "trainers"
NOFILE = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
PODMAN = ["podman", "--runtime", "runc"]
RUN_LIMITS = [
    "--pull=never",
    "--ulimit",
    f"nofile={NOFILE}:{NOFILE}",
    "--ulimit",
    "nproc=4096:4096",
]
#: What the trainer sends per step, gets back, sleeps; steps traced; its server's port, in
#: the container's own network namespace.
SEND, RECV, SLEEP_MS, STEPS, PORT = 90_000, 20_000, 40.0, 4, 7070
#: The trace directory, in the container's file system (the agent's allowed directory).
TRACES = "/tmp/ctraces"

#: The trainer's peer, in the container: reads RECV bytes, answers SEND, per request.
ECHO = f"""
import pathlib, socket, threading
srv = socket.socket(); srv.bind(("127.0.0.1", {PORT})); srv.listen()
pathlib.Path("/tmp/echo-ready").touch()
def serve(conn):
    while True:
        got = 0
        while got < {SEND}:
            chunk = conn.recv({SEND} - got)
            if not chunk:
                return
            got += len(chunk)
        conn.sendall(b"y" * {RECV})
while True:
    threading.Thread(target=serve, args=(srv.accept()[0],), daemon=True).start()
"""


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


@dataclass
class Node:
    base: Path
    sock: str
    container: str

    def cli(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BPFDYNO_")}
        return subprocess.run(
            [sys.executable, "-m", "bpfdyno", *args, "--socket", self.sock],
            capture_output=True, text=True, env=env, timeout=timeout,
        )  # fmt: skip

    def json(self, *args: str, timeout: float = 180) -> Any:
        r = self.cli(*args, "--json", timeout=timeout)
        assert r.returncode == 0, r.stderr + r.stdout
        return json.loads(r.stdout)


@pytest.fixture
def node() -> Iterator[Node]:
    base = Path(tempfile.mkdtemp(prefix="bdct-"))  # short: socket paths
    name = f"bd-trainer-{os.getpid()}-{time.monotonic_ns()}"
    socket_dir = base / "kineto"
    socket_dir.mkdir()
    log = base / "agent.log"
    light = [
        f"--set=collectors.{c}.enabled=false"
        for c in ("pmu", "perf_sw", "gpu", "dcgm", "fabric", "irq", "kubelet")
    ]
    with open(log, "wb") as out:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "bpfdyno", "serve", "--config", str(base / "none.toml"),
                "--socket", str(base / "agent.sock"),
                f"--set=kineto.socket_dir={json.dumps(str(socket_dir))}",
                f"--set=tracing.allowed_dirs={json.dumps([TRACES])}",
                f"--set=tracing.user_dirs={json.dumps(str(base / 'user-dirs'))}",
                "--set=legacy_rpc.listen=[]", *light,
            ],
            stderr=out,
        )  # fmt: skip
    (base / "none.toml").write_text("")
    (base / "echo.py").write_text(ECHO)
    n = Node(base, str(base / "agent.sock"), name)
    try:

        def up() -> bool:
            assert agent.poll() is None, log.read_text()
            st = n.cli("status", "--json")
            if st.returncode != 0:
                return False
            parts = {c["name"]: c["state"] for c in json.loads(st.stdout)["collectors"]}
            return parts.get("capture") not in (None, "COLLECTOR_STATE_STARTING")

        wait_for("the agent", up)
        trainer = [
            sys.executable, str(TRAINERS / "net_sleep.py"), f"--port={PORT}",
            f"--send-bytes={SEND}", f"--recv-bytes={RECV}", f"--sleep-ms={SLEEP_MS}",
            "--seconds", "431",  # (a word the ps filter below finds: ours only)
        ]  # fmt: skip
        script = (
            f"mkdir -m 700 {TRACES} && {sys.executable} {base / 'echo.py'} & "
            'while [ ! -e /tmp/echo-ready ]; do sleep 0.05; done; exec "$@"'
        )
        r = podman(
            "run", "--detach", "--name", name, *RUN_LIMITS, "--network", "none",
            # The agent's Kineto directory at the agent's path: its replies go to the address
            # the trainer's socket has in the trainer's own mount namespace.
            f"--volume={socket_dir}:{socket_dir}",
            "--env=KINETO_USE_DAEMON=1", f"--env=KINETO_IPC_SOCKET_DIR={socket_dir}",
            f"--env=KINETO_CONFIG={TRAINERS / 'kineto.conf'}", "--env=OMP_NUM_THREADS=1",
            "--env=PYTHONUNBUFFERED=1", "--workdir=/",
            "--rootfs", "/:O",  # (a flag: the root is the first argument, then the command)
            "sh", "-c", script, "sh", *trainer,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        yield n
    finally:
        podman("rm", "--force", "--time", "1", name)
        agent.kill()
        agent.wait()
        shutil.rmtree(base, ignore_errors=True)


def test_the_host_agent_traces_a_trainer_in_a_container_with_its_own_kernel_events(
    node: Node,
) -> None:
    ready = wait_for(
        "the trainer's steps",
        lambda: re.search(r"^ready (\d+) (\d+)$", podman("logs", node.container).stdout, re.M),
    )
    assert ready.group(1) == "1"  # pid 1 in its container
    local_port = int(ready.group(2))
    host_pid = int(podman("inspect", "--format", "{{.State.Pid}}", node.container).stdout)
    assert host_pid != 1
    # Registered under both pids: the one it reports, and the kernel's on the node.
    [t] = wait_for("its registration", lambda: node.json("trainers")["trainers"])
    assert (t["pid"], t["host_pid"]) == (1, host_pid)
    # ps shows it by its pid here, its own beside it; either pid finds it.
    [row] = node.json("ps", "--filter", f"pid={host_pid}", "--limit", "0")["processes"]
    assert (row["pid"], row["ns_pid"]) == (host_pid, 1)
    shown = node.json("ps", "--filter", "pid=1 net_sleep 431", "--limit", "0")["processes"]
    assert [r["pid"] for r in shown] == [host_pid]

    out = node.json(
        "gputrace", "--pids", str(host_pid), "--iterations", str(STEPS),
        "--log-file", f"{TRACES}/t.json", "--kernel-tracks", "net,sched",
        "--wait", "--timeout", "120",
    )  # fmt: skip
    [p] = out["trace"]["processes"]
    assert p["state"] == "PROCESS_TRACE_STATE_WRITTEN", (p, node.cli("status").stdout)
    assert p["kernel_tracks"]["state"] == "merged", p
    # Kineto names the file with the pid it knows; the file is in the container only.
    assert p["output_path"] == f"{TRACES}/t_1.json"
    assert not Path(TRACES).exists()
    path = Path(f"/proc/{host_pid}/root{TRACES}/t_1.json")
    assert path.stat().st_size == p["size_bytes"]
    evs = json.loads(path.read_bytes())["traceEvents"]

    rows = row_names(evs, 1)  # the kernel tracks sit in the process's own rows: pid 1
    net = of_cat(evs, "bpfdyno.net")
    local, peer = f"127.0.0.1:{local_port}", f"127.0.0.1:{PORT}"
    # Only its own connection, in its own network namespace.
    assert {rows[e["tid"]] for e in net} == {
        f"kernel net: TCP {local} -> {peer} send",
        f"kernel net: TCP {local} -> {peer} recv",
    }
    talks = [
        (e["ts"], e["ts"] + e["dur"])
        for e in evs
        if e.get("name") == "bpfdyno_test:talk" and e.get("pid") == 1 and e["dur"] > 0
    ]
    assert len(talks) == STEPS
    inside = [e for e in net if any(lo <= e["ts"] <= hi for lo, hi in talks)]
    sent = sum(e["args"]["bytes"] for e in inside if e["name"] == "send")
    received = sum(e["args"]["bytes"] for e in inside if e["name"] == "recv")
    assert (sent, received) == (STEPS * SEND, STEPS * RECV)
    # Its off-CPU slices are its own main thread's, named by its thread id on the node.
    main = f"kernel sched: thread {host_pid} (python)"
    long_sleeps(evs, 1, main, SLEEP_MS, STEPS)


def test_a_container_mounting_the_kineto_directory_elsewhere_is_told_to_mount_it_here(
    node: Node,
) -> None:
    """The socket a trainer polls from is named in its own mount namespace: mounted at
    another path, the directory takes its polls but no reply reaches it. The agent says so
    (status) rather than letting its traces time out for no visible reason."""
    name = f"{node.container}-elsewhere"
    try:
        r = podman(
            "run", "--detach", "--name", name, *RUN_LIMITS, "--network", "none",
            f"--volume={node.base / 'kineto'}:/run/kineto",
            "--env=KINETO_USE_DAEMON=1", "--env=KINETO_IPC_SOCKET_DIR=/run/kineto",
            f"--env=KINETO_CONFIG={TRAINERS / 'kineto.conf'}", "--env=OMP_NUM_THREADS=1",
            "--workdir=/", "--rootfs", "/:O",
            sys.executable, str(TRAINERS / "linear.py"), "--seconds=300",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        said = wait_for(
            "the agent to say why",
            lambda: re.search(
                r"kineto_ipc +ok +.*; (\d+) replies to trainers whose container mounts the "
                r"Kineto directory at another path than the agent's: mount it at the same path",
                node.cli("status").stdout,
            ),
        )
        assert int(said.group(1)) >= 1
    finally:
        podman("rm", "--force", "--time", "1", name)


#: What Kineto logs when it drops a config at its warm-up tick; when the trainer is stopped
#: after the config went out, and for how long (across the tick due 1-2 s after reading it).
DROPPED, STOP_AFTER_S, STOP_FOR_S, ATTEMPTS = "Not starting tracing", 0.3, 3.0, 3


def delivered(log: Path, pid: int) -> int:
    """How many times the agent's log says it handed a config to ``pid`` (the host's pid of
    the container's pid 1)."""
    return log.read_text().count(f"config delivered to pid 1 (pid {pid} here)")


def test_a_config_a_container_s_trainer_dropped_is_handed_out_again_past_its_own_tmp(
    node: Node,
) -> None:
    """The re-delivery of a dropped config (docs/tracing.md) for a trainer in a container:
    the .tmp Kineto left behind is in the container's file system, named by the container's
    path, and the placement check must let exactly that file through there too."""
    wait_for(
        "the trainer's steps",
        lambda: re.search(r"^ready 1 \d+$", podman("logs", node.container).stdout, re.M),
    )
    host_pid = int(podman("inspect", "--format", "{{.State.Pid}}", node.container).stdout)
    log = node.base / "agent.log"
    drops_before = 0
    for attempt in range(ATTEMPTS):
        name = f"d{attempt}.json"
        delivered_before = delivered(log, host_pid)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BPFDYNO_")}
        gputrace = subprocess.Popen(
            [
                sys.executable, "-m", "bpfdyno", "gputrace", "--pids", str(host_pid),
                "--log-file", f"{TRACES}/{name}", "--kernel-tracks", "sched",
                "--wait", "--timeout", "120", "--json", "--socket", node.sock,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        try:
            wait_for(
                "the config to go out",
                lambda n=delivered_before: delivered(log, host_pid) > n,
                timeout=60,
            )
            time.sleep(STOP_AFTER_S)
            os.kill(host_pid, signal.SIGSTOP)
            try:
                time.sleep(STOP_FOR_S)
            finally:
                os.kill(host_pid, signal.SIGCONT)
            out, err = gputrace.communicate(timeout=150)
        finally:
            gputrace.kill()
        assert gputrace.returncode == 0, err + out
        [p] = json.loads(out)["trace"]["processes"]
        trainer_log = podman("logs", node.container).stderr + podman("logs", node.container).stdout
        drops = trainer_log.count(DROPPED) - drops_before
        drops_before += drops
        assert p["state"] == "PROCESS_TRACE_STATE_WRITTEN", (p, trainer_log[-3000:])
        assert p["kernel_tracks"]["state"] == "merged", p
        assert p["output_path"] == f"{TRACES}/d{attempt}_1.json"
        path = Path(f"/proc/{host_pid}/root{TRACES}/d{attempt}_1.json")
        assert path.stat().st_size == p["size_bytes"]
        # Handed out once more for each config Kineto dropped, and no more.
        handed_out = delivered(log, host_pid) - delivered_before
        assert handed_out == drops + 1, (log.read_text()[-3000:], drops)
        if drops:
            assert drops == 1, trainer_log[-3000:]  # it ran on unstopped after the first
            break
    else:
        pytest.fail(f"the stop never made Kineto drop the config in {ATTEMPTS} attempts")
