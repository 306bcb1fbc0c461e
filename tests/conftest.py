"""Fixtures shared by more than one test directory."""

from __future__ import annotations

import os

# gRPC's fork handlers off in the test process (read when gRPC starts, so before anything
# imports it): a test that forks while a stream of its own is open (a detection watcher)
# must not wait in gRPC's handler, where no test timeout can interrupt it. No test's child
# uses gRPC before it execs.
os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "0"

from collections.abc import Iterator

import pytest

from bpfdyno.sources.irq.collector import IrqCollector

#: Lines of a failure's report printed the moment it fails.
_EARLY_REPORT_LINES = 60
#: The session's config, for its terminal reporter.
_CONFIG: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    _CONFIG.append(config)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure's report as soon as the test fails, not only in the summary at the end:
    a run stopped before its end (a CI time limit) still shows why each test failed."""
    if not report.failed:
        return
    reporter = _CONFIG[0].pluginmanager.get_plugin("terminalreporter") if _CONFIG else None
    if reporter is None:
        return
    lines = report.longreprtext.splitlines()[-_EARLY_REPORT_LINES:]
    reporter.ensure_newline()
    reporter.write_line(
        f"FAILED at once ({report.when}, {report.duration:.1f} s): {report.nodeid}", red=True
    )
    for line in lines:
        reporter.write_line(f"    {line}")


@pytest.fixture
def fresh_irq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IrqCollector]:
    """The interrupt collector with its BPF program in the kernel, for one test (a test that
    takes or holds its budget step leaves nothing behind for the next)."""
    c = IrqCollector(header_cache=tmp_path_factory.mktemp("kheaders"))
    c.start()
    try:
        yield c
    finally:
        c.close()
