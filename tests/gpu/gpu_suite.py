"""What the GPU acceptance suite drives on a GPU node: the agent as a process and its CLI,
``nvidia-smi``, the CUDA processes (a steady load, a traced trainer), and the checks whose
measured values make the suite's report.

Everything here runs real programs; nothing stands in for the GPU. Used by the suite
(``test_gpu_node.py``) and by ``preflight.py``.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from bpfdyno.rpc.v1 import agent_pb2, agent_pb2_grpc
from bpfdyno.rpc.wire import message_dict
from bpfdyno.sources.gpu.nvml import probe_host

HERE = Path(__file__).resolve().parent
BPFDYNO = [sys.executable, "-m", "bpfdyno"]
#: Environment variables the suite reads (tests/gpu/README.md).
REQUIRED_ENV = "BPFDYNO_GPU_REQUIRED"
PYTHON_ENV = "BPFDYNO_GPU_PYTHON"
WORK_ENV = "BPFDYNO_GPU_WORK_DIR"


@functools.cache
def gpu_absent_reason() -> str:
    """Why this machine cannot run the suite ("" when it has a usable NVIDIA GPU), from
    bpfdyno's own NVML probe (the one ``bpfdyno doctor`` uses)."""
    ok, detail, fix = probe_host()
    if ok is None:
        return f"no NVIDIA GPU: NVML could not be initialised: {detail}"
    if not ok:
        return f"no usable NVIDIA GPU: {detail} — {fix}"
    return ""


def cuda_python() -> str:
    """The interpreter whose torch has CUDA: $BPFDYNO_GPU_PYTHON, else this one."""
    return os.environ.get(PYTHON_ENV) or sys.executable


def tail(path: Path, chars: int = 3000) -> str:
    """The end of a log file ("" if there is none)."""
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


# -- the agent -------------------------------------------------------------------------------


class Agent:
    """``bpfdyno serve`` at its defaults, with a test config that only moves its sockets and
    lets traces be written under ``work``; its log is ``work/agent.log``.

    Args:
        work: the run's directory (config, log, traces).
        sockets: a short directory for the Unix sockets (paths are limited to 107 bytes).
    """

    def __init__(self, work: Path, sockets: Path) -> None:
        self.socket = str(sockets / "agent.sock")
        self.ipc_dir = sockets / "ipc"
        self.ipc_dir.mkdir(exist_ok=True)
        self.trace_dir = work / "traces"
        self.trace_dir.mkdir(exist_ok=True)
        self.log = work / "agent.log"
        config = work / "agent.toml"
        config.write_text(
            f"[grpc]\nsocket = {json.dumps(self.socket)}\n\n"
            f"[kineto]\nsocket_dir = {json.dumps(str(self.ipc_dir))}\n\n"
            f"[tracing]\ntrace_dir = {json.dumps(str(self.trace_dir))}\n\n"
            # Port 1778 may be taken by a dynolog or another agent on the node.
            "[legacy_rpc]\nenabled = false\n"
        )
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*BPFDYNO, "serve", "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 90.0) -> dict[str, Any]:
        """Wait until the agent answers; returns its status."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if os.path.exists(self.socket):
                with contextlib.suppress(grpc.RpcError):
                    return self.status()
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the agent did not answer within {timeout:g} s; its log:\n{tail(self.log)}"
                )
            time.sleep(0.2)

    def check_alive(self) -> None:
        """Fail, with the end of its log, if the agent has exited."""
        if self.proc.poll() is not None:
            raise AssertionError(
                f"the agent exited with status {self.proc.returncode}; its log:\n{tail(self.log)}"
            )

    def cli(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``bpfdyno ARGS --socket <this agent>``."""
        return subprocess.run(
            [*BPFDYNO, *args, "--socket", self.socket],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start_cli(self, *args: str) -> subprocess.Popen[str]:
        """Start ``bpfdyno ARGS --socket <this agent>``, its output and errors on pipes."""
        return subprocess.Popen(
            [*BPFDYNO, *args, "--socket", self.socket],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def status(self) -> dict[str, Any]:
        """The agent's status, as ``bpfdyno status --json`` prints it (through gRPC here: the
        suite polls it while traces run, and a CLI process each time would load the node)."""
        with grpc.insecure_channel(f"unix:{self.socket}") as channel:
            status = agent_pb2_grpc.AgentStub(channel).GetStatus(
                agent_pb2.GetStatusRequest(), timeout=10
            )
        return message_dict(status, proto_names=False)

    def collector(self, name: str) -> dict[str, Any]:
        """One collector's entry of `status` (state, reason, collections...)."""
        status = self.status()
        for c in status["collectors"]:
            if c["name"] == name:
                entry: dict[str, Any] = c
                return entry
        raise AssertionError(f"no collector {name!r} in bpfdyno status: {status}")

    def stop(self) -> int:
        """SIGTERM, then SIGKILL if it has not stopped in 30 s; returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return self.proc.returncode


# -- the agent's metrics, as `bpfdyno metrics 'gpu_*' --watch --json` prints them --------------

Labels = tuple[tuple[str, str], ...]


@dataclass
class Round:
    """One collection round of the ``gpu`` collector.

    Attributes:
        ts: when the agent collected it (epoch seconds).
        values: (metric, sorted labels) -> value; series without a value are left out.
    """

    ts: float
    values: dict[tuple[str, Labels], float]

    def get(self, name: str, **labels: str) -> float | None:
        """The value of the series ``name`` whose labels include ``labels`` (None: absent)."""
        want = set(labels.items())
        for (metric, have), value in self.values.items():
            if metric == name and want <= set(have):
                return value
        return None

    def label_sets(self, name: str) -> list[dict[str, str]]:
        """The labels of every series of ``name`` in this round."""
        return [dict(labels) for metric, labels in self.values if metric == name]


class MetricsWatch:
    """Follows the agent's ``gpu`` rounds through the CLI's stream, on a thread."""

    def __init__(self, agent: Agent) -> None:
        self._proc = subprocess.Popen(
            [*BPFDYNO, "metrics", "gpu_*", "--watch", "--json", "--socket", agent.socket],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._rounds: list[Round] = []
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            doc = json.loads(line)
            if doc["collector"] != "gpu":
                continue
            values = {
                (s["name"], tuple(sorted(s["labels"].items()))): float(s["value"])
                for s in doc["series"]
                if s["value"] is not None and not math.isnan(s["value"])
            }
            with self._cond:
                self._rounds.append(Round(doc["ts"], values))
                self._cond.notify_all()

    def next(self, after: float, timeout: float = 30.0) -> Round:
        """The first round collected after ``after`` (epoch seconds)."""
        return self.wait_for(lambda r: r.ts > after, f"a gpu round after {after:.3f}", timeout)

    def wait_for(self, good: Callable[[Round], bool], what: str, timeout: float = 30.0) -> Round:
        """The first round (already seen or to come) for which ``good`` holds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for r in self._rounds:
                    if good(r):
                        return r
                left = deadline - time.monotonic()
                if left <= 0 or self.exited:
                    err = self._proc.stderr.read() if self._proc.stderr and self.exited else ""
                    raise AssertionError(f"no {what} within {timeout:g} s {err}".strip())
                self._cond.wait(min(left, 1.0))

    @property
    def exited(self) -> bool:
        return self._proc.poll() is not None

    def rounds_between(self, start: float, end: float) -> list[Round]:
        """The rounds collected in [start, end] (epoch seconds)."""
        with self._cond:
            return [r for r in self._rounds if start <= r.ts <= end]

    def close(self) -> None:
        self._proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=10)


# -- nvidia-smi --------------------------------------------------------------------------------

#: What the suite reads from ``nvidia-smi --query-gpu`` (``nvidia-smi --help-query-gpu``).
SMI_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "temperature.gpu",
    "power.draw",
    "enforced.power.limit",
    "clocks.sm",
    "clocks.mem",
    "clocks.max.sm",
    "utilization.gpu",
)


def smi(*args: str) -> list[dict[str, str]]:
    """Rows of an ``nvidia-smi --query-...=FIELDS --format=csv,noheader,nounits`` call, as
    dicts by field (the query is the last argument)."""
    fields = args[-1].split("=", 1)[1].split(",")
    r = subprocess.run(
        ["nvidia-smi", *args, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, f"nvidia-smi {' '.join(args)} failed: {r.stdout}{r.stderr}"
    rows = [[v.strip() for v in row] for row in csv.reader(r.stdout.splitlines())]
    # Lines of another shape ("No running processes found") are not rows.
    return [dict(zip(fields, row, strict=True)) for row in rows if len(row) == len(fields)]


def smi_gpus() -> dict[str, dict[str, str]]:
    """``nvidia-smi --query-gpu`` of `SMI_FIELDS`, by GPU uuid."""
    return {row["uuid"]: row for row in smi("--query-gpu=" + ",".join(SMI_FIELDS))}


def smi_number(text: str) -> float | None:
    """A number nvidia-smi printed; None for ``[N/A]``, ``[Not Supported]``..."""
    try:
        return float(text)
    except ValueError:
        return None


# -- CUDA processes ------------------------------------------------------------------------------


@dataclass
class CudaProcess:
    """A CUDA script of this directory run by `cuda_python`, its stderr in ``work/NAME.log``.

    Its ``ready {json}`` line (see the scripts) gives `facts`.
    """

    script: str
    args: list[str]
    work: Path
    env: dict[str, str] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.log = self.work / f"{Path(self.script).stem}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))}
        # CUDA numbers GPUs fastest first unless told otherwise; NVML and nvidia-smi in PCI
        # order. The same order makes "cuda:0" the first GPU nvidia-smi lists.
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        env.update(PYTHONUNBUFFERED="1", **self.env)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [cuda_python(), str(HERE / self.script), *self.args],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                text=True,
                start_new_session=True,
            )

    def wait_ready(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait for its ``ready`` line; returns the facts it printed."""
        lines: list[str] = []

        def read() -> None:  # drains stdout for the process's whole life
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                lines.append(line)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        while not any(line.startswith("ready ") for line in lines):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(
                    f"{self.script} did not get ready within {timeout:g} s (exit status "
                    f"{self.proc.returncode}); its stderr:\n{tail(self.log)}"
                )
            time.sleep(0.1)
        ready = next(line for line in lines if line.startswith("ready "))
        self.facts = json.loads(ready.removeprefix("ready "))
        return self.facts

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL after 15 s."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


@contextlib.contextmanager
def running(process: CudaProcess, timeout: float = 120.0) -> Iterator[CudaProcess]:
    """``process`` once ready; stopped on exit."""
    try:
        process.wait_ready(timeout)
        yield process
    finally:
        process.stop()


# -- checks and the report ----------------------------------------------------------------------


@dataclass
class Check:
    """One comparison: what, whether it held, and the values measured."""

    what: str
    ok: bool
    detail: str


@dataclass
class Checks:
    """The comparisons of one test. All are made (and reported) before the test fails on
    any, so one run on a GPU node gives every measured value."""

    items: list[Check] = field(default_factory=list)

    def record(self, what: str, ok: bool, detail: str) -> bool:
        self.items.append(Check(what, bool(ok), detail))
        return bool(ok)

    def equal(self, what: str, got: object, want: object) -> bool:
        return self.record(what, got == want, f"{got!r} (expected {want!r})")

    def near(self, what: str, got: float | None, want: float | None, tolerance: float) -> bool:
        """``got`` within ``tolerance`` of ``want`` (either None: not comparable, failed)."""
        if got is None or want is None:
            return self.record(what, False, f"agent {got}, reference {want}: a value is missing")
        return self.record(
            what,
            abs(got - want) <= tolerance,
            f"agent {got:g}, reference {want:g} (tolerance ±{tolerance:g})",
        )

    def between(self, what: str, got: float | None, low: float, high: float) -> bool:
        ok = got is not None and low <= got <= high
        return self.record(what, ok, f"{got} (expected {low:g} to {high:g})")

    def verify(self) -> None:
        """Fail the test, listing every comparison that did not hold."""
        failed = [f"{c.what}: {c.detail}" for c in self.items if not c.ok]
        assert not failed, "\n".join(failed)


@dataclass
class Report:
    """What the suite prints at its end and writes to ``report.json``: the node's facts, then
    per test its outcome (with the reason of a skip or an error) and every comparison with
    the values measured."""

    facts: dict[str, str] = field(default_factory=dict)
    checks: dict[str, Checks] = field(default_factory=dict)
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"{key}: {value}" for key, value in self.facts.items()]
        for test, (outcome, note) in self.outcomes.items():
            out.append(f"{outcome.upper():<7} {test}" + (f": {note}" if note else ""))
            out += [
                f"    {'ok' if c.ok else 'FAILED':<6} {c.what}: {c.detail}"
                for c in self.checks.get(test, Checks()).items
            ]
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "facts": self.facts,
            "tests": {
                test: {
                    "outcome": outcome,
                    "note": note,
                    "checks": [vars(c) for c in self.checks.get(test, Checks()).items],
                }
                for test, (outcome, note) in self.outcomes.items()
            },
        }


#: The report of this run (filled by the fixtures and the tests, printed by the conftest).
REPORT = Report()
