"""The GPU acceptance suite's set-up: whether this machine can run it, the run's directory,
the agent under test, and the report printed at the end (README.md here).

The suite's tests carry the ``gpu`` marker, which the project's pytest options deselect: a
plain ``pytest`` (CI) leaves them out and says so in one line; ``pytest -m gpu`` runs them.
Without an NVIDIA GPU they are skipped with the reason, or fail when $BPFDYNO_GPU_REQUIRED
is 1 (the offline runner sets it: on a GPU node, no GPU is a failure).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gpu_suite import REPORT, REQUIRED_ENV, WORK_ENV, Agent, Checks, gpu_absent_reason, smi

from bpfdyno.version import __version__

#: Where prepare_offline.sh may put its directory (git ignores it): a copy of this suite.
collect_ignore = ["offline"]

_state = {"deselected": 0, "started": time.monotonic()}
_work: list[Path] = []
_suite: set[str] = set()  # the node ids of the suite's tests


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


@pytest.fixture(scope="session")
def gpu_node() -> None:
    """Skips (or fails, see the module doc) without a GPU; checks what the suite needs."""
    reason = gpu_absent_reason()
    if reason:
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(f"the GPU acceptance suite must run here, but {reason}", pytrace=False)
        pytest.skip(reason)
    if os.geteuid() != 0:
        pytest.fail("the agent loads BPF programs: run the suite as root", pytrace=False)
    if shutil.which("nvidia-smi") is None:
        pytest.fail("nvidia-smi is not on PATH (it ships with the NVIDIA driver)", pytrace=False)
    gpus = smi("--query-gpu=name,memory.total,driver_version")
    models = sorted({f"{g['name']} ({g['memory.total']} MiB)" for g in gpus})
    REPORT.facts.update(
        node=f"{len(gpus)} GPU(s): {', '.join(models)}, driver {gpus[0]['driver_version']}",
        software=f"bpfdyno {__version__}, Python {platform.python_version()}, "
        f"kernel {platform.release()}",
    )


@pytest.fixture(scope="session")
def work(gpu_node: None) -> Path:
    """The run's directory, kept afterwards: the agent's config and log, the CUDA processes'
    logs, the merged traces and report.json ($BPFDYNO_GPU_WORK_DIR, else a new one)."""
    given = os.environ.get(WORK_ENV)
    path = Path(given) if given else Path(tempfile.mkdtemp(prefix="bpfdyno-gpu-", dir="/tmp"))
    path.mkdir(parents=True, exist_ok=True)
    _work.append(path)
    REPORT.facts["files"] = str(path)
    return path


@pytest.fixture(scope="session")
def sockets(gpu_node: None) -> Iterator[Path]:
    """A short directory for Unix sockets (their paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="bdg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def agent(work: Path, sockets: Path) -> Iterator[Agent]:
    """``bpfdyno serve`` at its defaults, once its ``gpu`` collector has collected."""
    a = Agent(work, sockets)
    try:
        a.wait_ready()
        deadline = time.monotonic() + 30
        while (gpu := a.collector("gpu"))["state"] != "COLLECTOR_STATE_OK" or not int(
            gpu.get("collections", 0)
        ):
            assert time.monotonic() < deadline, f"the gpu collector is not running: {gpu}"
            time.sleep(0.5)
        REPORT.facts["agent"] = f"gpu collector: {gpu['reason']}"
        yield a
    finally:
        status = a.stop()
        assert status == 0, f"the agent exited with status {status}; see {a.log}"


@pytest.fixture
def checks(request: pytest.FixtureRequest) -> Checks:
    """The test's comparisons, kept for the report."""
    c = Checks()
    REPORT.checks[_short(request.node.nodeid)] = c
    return c


def pytest_itemcollected(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu"):
        _suite.add(item.nodeid)


def pytest_deselected(items: list[pytest.Item]) -> None:
    _state["deselected"] += sum(1 for item in items if item.get_closest_marker("gpu"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _suite:
        return
    test = _short(report.nodeid)
    if report.when == "call" or report.outcome != "passed":
        note = ""
        if report.skipped and isinstance(report.longrepr, tuple):
            note = report.longrepr[2].removeprefix("Skipped: ")
        elif report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)
            note = str(getattr(crash, "message", "")).splitlines()[0][:300] if crash else ""
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        REPORT.outcomes[test] = (outcome, note)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    tr = terminalreporter
    if not REPORT.outcomes:
        if _state["deselected"]:
            tr.write_line(
                f"GPU acceptance suite: {_state['deselected']} tests deselected; they run only "
                "with `pytest -m gpu`, on a GPU node (tests/gpu/README.md)"
            )
        return
    absent = gpu_absent_reason()
    if absent and all(outcome != "passed" for outcome, _ in REPORT.outcomes.values()):
        tr.write_line(f"GPU acceptance suite NOT RUN: {absent}", yellow=True, bold=True)
        return
    REPORT.facts["time"] = f"{time.monotonic() - _state['started']:.0f} s"
    tr.write_sep("=", "GPU acceptance report")
    for line in REPORT.lines():
        tr.write_line(line)
    if _work:
        path = _work[0] / "report.json"
        path.write_text(json.dumps(REPORT.to_json(), indent=2) + "\n")
        tr.write_line(f"report written to {path}")
    sys.stdout.flush()
