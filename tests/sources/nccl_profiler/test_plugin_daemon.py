"""A real `bpfdyno serve` says in its status whether a trainer on the node uses the plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from nccl_harness import Plugin

from bpfdyno.sources.nccl_profiler.build import build_plugin

BPFDYNO = [sys.executable, "-m", "bpfdyno"]
#: Everything else off: this is about the nccl_profiler part only.
OFF = ("host", "self", "sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs", "kubelet",
       "fabric", "irq")  # fmt: skip


@pytest.fixture
def agent_socket(tmp_path: Path) -> Iterator[str]:
    sock = str(tmp_path / "agent.sock")
    proc = subprocess.Popen(
        [*BPFDYNO, "serve", "--socket", sock, "--interval", "0.5",
         "--set=legacy_rpc.enabled=false", "--set=budget.enabled=false",
         f'--set=kineto.socket_dir="{tempfile.mkdtemp(prefix="bd-", dir="/tmp")}"',
         *(f"--set=collectors.{name}.enabled=false" for name in OFF)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield sock
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def part(sock: str) -> dict[str, str]:
    """The agent's nccl_profiler part, once it has collected."""
    deadline = time.monotonic() + 30
    while True:
        done = subprocess.run(
            [*BPFDYNO, "status", "--json", "--socket", sock], capture_output=True, text=True
        )
        if done.returncode == 0:
            parts = {c["name"]: c for c in orjson.loads(done.stdout)["collectors"]}
            if int(parts["nccl_profiler"].get("collections", 0)) > 0:
                return parts["nccl_profiler"]  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.2)


def test_status_says_which_trainers_use_the_plugin(
    agent_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = part(agent_socket)
    assert first["state"] == "COLLECTOR_STATE_OK"
    assert first["reason"].startswith("no trainer publishes NCCL profiler data in /dev/shm")
    # This process as a trainer, its file where the agent looks at its defaults.
    monkeypatch.delenv("BPFDYNO_NCCL_SHM_DIR", raising=False)
    plugin = Plugin(build_plugin(tmp_path / "lib"))
    _, ctx, _ = plugin.init(1, nranks=2, rank=0)
    try:
        want = f"in use by 1 trainer process(es): {os.getpid()}"
        deadline = time.monotonic() + 10
        while (now := part(agent_socket))["reason"] != want:
            assert time.monotonic() < deadline, now
            time.sleep(0.2)
        assert now["state"] == "COLLECTOR_STATE_OK"
    finally:
        plugin.finalize(ctx)
        plugin.close()
