"""Test harness for the exporters: a real `bpfdyno serve` and a real Prometheus server.

`AgentProcess` runs the daemon as a child with its gRPC socket in a temp dir (no legacy RPC,
its own Kineto socket dir) and reads its own values back over gRPC. `PrometheusServer` runs
Debian's ``prometheus`` binary on a free loopback port with a temp config and data dir,
scraping the agent every second, and answers queries through its HTTP API.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import grpc

from bpfdyno.rpc.v1 import agent_pb2 as pb
from bpfdyno.rpc.v1 import agent_pb2_grpc as pb_grpc
from bpfdyno.rpc.v1 import kernel_pb2, kernel_pb2_grpc

BPFDYNO = [sys.executable, "-m", "bpfdyno"]
REPO = Path(__file__).resolve().parents[2]
FAKE_NVML_SOURCE = REPO / "tests" / "sources" / "gpu" / "nvml_fake" / "fake_nvml.c"

T = TypeVar("T")
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 60.0) -> T:
    """Poll ``check`` until it returns something other than None (generous for a busy host)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.2)


def build_fake_nvml(out_dir: Path) -> Path:
    """The fake libnvidia-ml (tests/sources/gpu) compiled into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / "libnvidia-ml.so.1"
    cmd = ["gcc", "-O1", "-shared", "-fPIC", "-pthread", "-Wl,-soname,libnvidia-ml.so.1"]
    subprocess.run([*cmd, "-o", str(lib), str(FAKE_NVML_SOURCE)], check=True)
    return lib


class AgentProcess:
    """`bpfdyno serve` as a child process, with ``sets`` as ``--set`` overrides."""

    def __init__(self, tmp: Path, *sets: str, env: dict[str, str] | None = None) -> None:
        self.sock = str(tmp / "agent.sock")
        kineto_dir = tempfile.mkdtemp(prefix="bd-", dir="/tmp")  # sun_path is short
        self.log_path = tmp / "agent.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        args = [
            *BPFDYNO,
            "serve",
            "--socket",
            self.sock,
            "--set=legacy_rpc.enabled=false",
            f'--set=kineto.socket_dir="{kineto_dir}"',
            # A known budget: exact values are compared here, never from a reduced agent.
            "--set=budget.enabled=false",
            *(f"--set={s}" for s in sets),
        ]
        self.proc = subprocess.Popen(
            args, stderr=self._log, env={**os.environ, **(env or {})}, start_new_session=True
        )
        self.channel = grpc.insecure_channel(f"unix:{self.sock}")
        self.agent = pb_grpc.AgentStub(self.channel)
        self.kernel = kernel_pb2_grpc.KernelStub(self.channel)
        wait_for("the agent to answer", self._ready, timeout=90)

    def _ready(self) -> bool | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"agent exited {self.proc.returncode}: {self.log()}")
        try:
            self.agent.GetStatus(pb.GetStatusRequest(), timeout=2)
        except grpc.RpcError:
            return None
        return True

    def log(self) -> str:
        return self.log_path.read_text()

    def status(self) -> dict[str, tuple[int, str]]:
        st = self.agent.GetStatus(pb.GetStatusRequest(), timeout=10)
        return {c.name: (c.state, c.reason) for c in st.collectors}

    def metrics(self, *names: str) -> dict[SeriesKey, float]:
        snap = self.agent.GetMetrics(pb.GetMetricsRequest(names=names), timeout=10)
        return {_key(s): s.points[-1].value for s in snap.series if s.points}

    def window(
        self, *names: str, seconds: float = 120.0
    ) -> dict[SeriesKey, list[tuple[float, float]]]:
        """Every point of the matching series over the last ``seconds``: (ts, value)."""
        req = pb.GetMetricsWindowRequest(names=names, start_unix_seconds=time.time() - seconds)
        win = self.agent.GetMetricsWindow(req, timeout=10)
        return {_key(s): [(p.unix_seconds, p.value) for p in s.points] for s in win.series}

    def processes(self) -> list[Any]:
        resp = self.kernel.ListProcesses(kernel_pb2.ListProcessesRequest(), timeout=10)
        return list(resp.processes)

    def stop(self) -> None:
        self.channel.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _key(series: Any) -> SeriesKey:
    # Prometheus drops empty label values; so does this key, so both sides compare.
    labels = ((lab.name, lab.value) for lab in series.labels if lab.value)
    return (series.name, tuple(sorted(labels)))


class PrometheusServer:
    """Debian's prometheus on a free loopback port, scraping ``target`` every second."""

    def __init__(self, tmp: Path, target: str) -> None:
        binary = shutil.which("prometheus")
        assert binary is not None, "prometheus is not installed: run vagrant/bootstrap.sh test"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n"
            "  scrape_interval: 1s\n"
            "  scrape_timeout: 1s\n"
            "scrape_configs:\n"
            "  - job_name: bpfdyno\n"
            f"    static_configs: [{{targets: ['{target}']}}]\n"
        )
        self.log_path = tmp / "prometheus.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for("Prometheus to answer", self._ready, timeout=90)

    def _ready(self) -> bool | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited: {self.log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return True if r.status == 200 else None
        except OSError:
            return None

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> dict[SeriesKey, float]:
        """An instant query: each series' value, keyed like `AgentProcess.metrics`."""
        data = self.api("query", query=expr)
        return {_prom_key(r["metric"]): float(r["value"][1]) for r in data["result"]}

    def raw(self, expr: str, seconds: int) -> dict[SeriesKey, list[tuple[float, float]]]:
        """Every scraped sample of ``expr`` over the last ``seconds``: (scrape ts, value)."""
        data = self.api("query", query=f"{expr}[{seconds}s]")
        return {
            _prom_key(r["metric"]): [(float(t), float(v)) for t, v in r["values"]]
            for r in data["result"]
        }

    def target_health(self) -> str:
        targets = self.api("targets")["activeTargets"]
        return str(targets[0]["health"]) if targets else "none"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def _prom_key(metric: dict[str, str]) -> SeriesKey:
    labels = tuple(
        sorted((k, v) for k, v in metric.items() if k not in ("__name__", "job", "instance"))
    )
    return (metric.get("__name__", ""), labels)
