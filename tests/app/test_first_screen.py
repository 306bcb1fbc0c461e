"""The first screen of `bpfdyno serve` on a host without GPUs: no warnings for what is simply
not there (GPU, DCGM, kubelet, hardware PMU: one INFO line names them), and after ``ready``
where the API is and the next three commands."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bpfdyno.app.serve import next_steps
from bpfdyno.core.config import load

BPFDYNO = [sys.executable, "-m", "bpfdyno"]


def test_a_host_without_gpus_starts_without_warnings_and_says_what_next() -> None:
    base = Path(tempfile.mkdtemp(prefix="bdfs-", dir="/tmp"))
    sock = base / "agent.sock"
    log = base / "serve.log"
    with open(log, "w") as out:
        agent = subprocess.Popen(
            [*BPFDYNO, "serve", "--config", "/dev/null", "--socket", str(sock),
             "--set=legacy_rpc.enabled=false", f"--set=kineto.socket_dir={json.dumps(str(base))}"],
            stderr=out,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while "next: " not in log.read_text():
            assert agent.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        status = subprocess.run(
            [*BPFDYNO, "status", "--socket", str(sock), "--json"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
    finally:
        agent.terminate()
        agent.wait(timeout=30)
    text = log.read_text()
    lines = text.splitlines()
    assert [line for line in lines if " WARNING " in line or " ERROR " in line] == [], text
    states = {c["name"]: c for c in json.loads(status.stdout)["collectors"]}
    absent = [
        n for n in ("pmu", "gpu", "dcgm", "kubelet") if states[n]["state"].endswith("UNAVAILABLE")
    ]
    assert {"gpu", "dcgm", "kubelet"} <= set(absent)  # this machine: no GPU, no Kubernetes
    [normal] = [line for line in lines if "not on this host" in line]
    assert " INFO " in normal
    assert normal.endswith(
        f"not on this host, which is normal: {', '.join(absent)} "
        "(bpfdyno status says what each needs)"
    )
    # Still each with its reason in status.
    assert all(states[n]["reason"] for n in absent)
    ready = next(i for i, line in enumerate(lines) if " ready in " in line)
    api, steps = lines[ready + 1], lines[ready + 2]
    assert api.endswith(f"API on unix:{sock} (every local user, each as itself)")
    assert steps.endswith(
        f"next: bpfdyno status --socket {sock}  |  bpfdyno top --socket {sock}  |  "
        f"bpfdyno gputrace --socket {sock} --pids PID --iterations 5 --wait "
        "(PyTorch started with KINETO_USE_DAEMON=1)"
    )


def test_next_steps_at_the_default_socket_need_no_flag() -> None:
    cfg = load(None, [("grpc.socket_mode", "0o660"), ("grpc.socket_group", "bpfdyno")])
    assert next_steps(cfg) == [
        "API on unix:/run/bpfdyno/bpfdyno.sock (root and the group bpfdyno)",
        "next: bpfdyno status  |  bpfdyno top  |  bpfdyno gputrace --pids PID --iterations 5 "
        "--wait (PyTorch started with KINETO_USE_DAEMON=1)",
    ]
