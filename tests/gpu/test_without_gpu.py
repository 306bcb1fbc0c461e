"""The GPU acceptance suite where there is no GPU (CI): it is left out of a plain run and says
so, it reports why it did not run when asked for, and its checks of trace files hold on the
real traces of the first manual run on an H200 node and catch the bug that run found."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from gpu_suite import Checks, gpu_absent_reason
from trace_checks import (
    H200_RUN_TRACKS,
    NoProfilerSpan,
    Trace,
    check_allreduces,
    check_connection,
    check_file,
    check_verdict,
    optimizer_steps,
)

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "tracing" / "fixtures" / "h200"
#: The H200 run's trainer: pid 652 on GPU 0; per step one all-reduce of 64 MiB of float32
#: and 65,521 bytes over loopback TCP (fixtures/h200/README.md).
PID, GPU = 652, "0"
H200_ALLREDUCE = (16_777_216, "float32", 67_108_864, "sum", "ncclSuccess")


def pytest_run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).with_name("pytest")), "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )


def failed(checks: Checks) -> list[str]:
    return [c.what for c in checks.items if not c.ok]


@pytest.fixture(scope="module")
def no_gpu() -> str:
    reason = gpu_absent_reason()
    if not reason:
        pytest.skip("this machine has an NVIDIA GPU: run the suite itself (pytest -m gpu)")
    return reason


def test_a_plain_run_leaves_the_suite_out_and_says_so() -> None:
    r = pytest_run("tests/gpu/test_gpu_node.py")
    assert r.returncode == 5, r.stdout  # pytest: no test ran
    assert "7 deselected" in r.stdout
    assert (
        "GPU acceptance suite: 7 tests deselected; they run only with `pytest -m gpu`, on a GPU "
        "node (tests/gpu/README.md)"
    ) in r.stdout


def test_without_a_gpu_the_suite_says_why_it_did_not_run(no_gpu: str) -> None:
    assert no_gpu == (
        "no NVIDIA GPU: NVML could not be initialised: no NVIDIA driver on this machine "
        "(libnvidia-ml.so.1 not found)"
    )
    r = pytest_run("-m", "gpu", "tests/gpu/test_gpu_node.py")
    assert r.returncode == 0, r.stdout
    assert "7 skipped" in r.stdout and "passed" not in r.stdout
    assert f"GPU acceptance suite NOT RUN: {no_gpu}" in r.stdout
    assert r.stdout.count("SKIPPED [1] tests/gpu/test_gpu_node.py:") == 7
    # Where a GPU is required (the offline runner), its absence is a failure.
    r = pytest_run("-m", "gpu", "tests/gpu/test_gpu_node.py", BPFDYNO_GPU_REQUIRED="1")
    assert r.returncode == 1, r.stdout
    assert "7 errors" in r.stdout
    assert f"the GPU acceptance suite must run here, but {no_gpu}" in r.stdout


def test_the_trace_checks_pass_on_the_h200_iteration_trace() -> None:
    """The good file of the manual run: 5 iterations, the window found."""
    t = Trace.load(H200 / "cuda_iterations_merged.pt.trace.json.gz")
    checks = Checks()
    check_file(t, PID, GPU, checks, H200_RUN_TRACKS)
    check_connection(t, "127.0.0.1:39356", "127.0.0.1:45205", 65_521, checks)
    check_allreduces(t, PID, {H200_ALLREDUCE}, checks)
    assert failed(checks) == [] and len(checks.items) == 14, checks.items
    assert optimizer_steps(t) == 5
    assert len(t.of("kernel")) == 193


def test_the_trace_checks_catch_the_lost_window_of_the_h200_duration_trace() -> None:
    """The 1.5 s trace was merged by the version that missed Kineto's span: 17.9 s of kernel
    events around a 1.5 s trace. The verdict, which reads the span itself, holds."""
    t = Trace.load(H200 / "cuda_duration_merged.pt.trace.json.gz")
    checks = Checks()
    check_file(t, PID, GPU, checks, H200_RUN_TRACKS)
    assert failed(checks) == [
        "window",
        "info slice over the profiler's span",
        "bpfdyno.net slices, all in the window",
        "bpfdyno.sched slices, all in the window",
    ]
    checks = Checks()
    check_allreduces(t, PID, {H200_ALLREDUCE}, checks)
    check_connection(t, "127.0.0.1:39356", "127.0.0.1:45205", 65_521, checks)
    check_verdict(t, PID, checks)
    assert failed(checks) == [], checks.items
    verdict = next(c for c in checks.items if c.what == "verdict")
    assert verdict.detail.startswith(
        "one rank (pid 652): nothing to compare it with; a step takes 10."
    ), verdict.detail


def test_a_file_kineto_recorded_nothing_in_is_named(tmp_path: Path) -> None:
    """Kineto once wrote a duration trace with only its metadata: the suite takes it again."""
    path = tmp_path / "empty.pt.trace.json"
    path.write_text(
        '{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 7, "tid": 0, "ts": 1, '
        '"args": {"name": "python"}}, {"ph": "X", "cat": "bpfdyno.info", "name": "x", '
        '"pid": 7, "tid": 1000000001, "ts": 1, "dur": 2, "args": {}}]}'
    )
    with pytest.raises(NoProfilerSpan) as info:
        Trace.load(path)
    assert str(info.value) == (
        f"{path} has 0 profiler spans (in 2 events): Kineto recorded nothing (see the "
        "trainer's log)"
    )
