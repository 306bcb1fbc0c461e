"""What a newcomer's first commands print, against a real `bpfdyno serve`: no quiet failures
(a metric name that matches nothing is an error that says how names work), the same JSON
shape whether or not anything is there, columns that never run together, a process table
that fits an 80-column terminal, ratios shown in percent (JSON keeps the ratio), and a
manual page that lists each command's options."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.cli.agent import percent

ROOT = Path(__file__).resolve().parents[2]
BPFDYNO = [sys.executable, "-m", "bpfdyno"]
#: The host and self collectors only (and procs for ps): these tests read the CLI's output.
LIGHT = [
    f"--set=collectors.{name}.enabled=false"
    for name in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "irq", "fabric", "kubelet")
]


class Served:
    def __init__(self, base: Path) -> None:
        self.sock = str(base / "agent.sock")
        self.proc = subprocess.Popen(
            [*BPFDYNO, "serve", "--config", "/dev/null", "--socket", self.sock,
             "--interval", "0.5", "--set=legacy_rpc.enabled=false",
             f'--set=kineto.socket_dir="{base}"', *LIGHT],
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while self.cli("metrics", "cpu_utilization_ratio").returncode != 0:
            assert self.proc.poll() is None, "the agent exited"
            assert time.monotonic() < deadline, "no cpu_utilization_ratio within 60 s"
            time.sleep(0.2)

    def cli(self, *argv: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "COLUMNS": str(columns)}
        return subprocess.run(
            [*BPFDYNO, *argv, "--socket", self.sock],
            capture_output=True, text=True, timeout=60, env=env,
        )  # fmt: skip


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    base = Path(tempfile.mkdtemp(prefix="bdfh-", dir="/tmp"))
    s = Served(base)
    try:
        yield s
    finally:
        s.proc.terminate()
        s.proc.wait(timeout=30)


@pytest.mark.parametrize("name", ["cpu", "no_such_metric", "cpu*x"])
def test_a_name_that_matches_nothing_says_so_and_how_names_work(served: Served, name: str) -> None:
    r = served.cli("metrics", name)
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith(f"bpfdyno: no metric matches {name!r}.\n")
    assert "prefixes ending in '*', quoted" in r.stderr
    assert "bpfdyno metrics 'cpu_*'" in r.stderr
    if name == "cpu":
        assert "Names with 'cpu' in them: " in r.stderr
        assert "cpu_utilization_ratio" in r.stderr


def test_ratios_are_percent_for_people_and_ratios_in_json(served: Served) -> None:
    r = served.cli("metrics", "cpu_utilization_ratio")
    assert r.returncode == 0, r.stderr
    header, *lines = r.stdout.splitlines()
    assert header.startswith("# ")
    total = next(line for line in lines if "{cpu=total}" in line)
    m = re.fullmatch(r"cpu_utilization_ratio\{cpu=total\}\s+(\d+\.\d) %", total)
    assert m, total
    assert 0.0 <= float(m.group(1)) <= 100.0
    r = served.cli("metrics", "cpu_utilization_ratio", "--json")
    series = json.loads(r.stdout)["series"]
    assert {s["unit"] for s in series} == {"ratio"}
    assert all(0.0 <= s["value"] <= 1.0 for s in series)
    # The conversion itself, on known values.
    assert [percent(v) for v in (0.00990099, 0.5, 1.0, 0.0, 0.0004, 2.5)] == [
        "1.0", "50.0", "100.0", "0.0", "0.04", "250.0",
    ]  # fmt: skip


def test_trainers_json_has_one_shape_also_when_empty(served: Served) -> None:
    r = served.cli("trainers", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"trainers": []}


def test_status_columns_never_run_together(served: Served) -> None:
    r = served.cli("status")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("COLLECTOR"))
    state_col = lines[header].index("STATE")
    rows = lines[header + 1 :]
    names = [row.split()[0] for row in rows]
    assert "metric_streams" in names  # the longest part name, 14 characters
    for row in rows:
        # The name, then at least one space, then the state word in the STATE column.
        assert row[state_col - 1] == " " and row[state_col] != " ", row


def test_ps_fits_the_terminal(served: Served) -> None:
    r = served.cli("ps", "--limit", "0", columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split()[:4] == ["PID", "USER", "CPU%", "RSS"]
    assert len(lines) > 3
    too_long = [line for line in lines if len(line) > 80]
    assert not too_long, too_long
    wide = served.cli("ps", "--limit", "0", columns=250).stdout.splitlines()
    assert max(len(line) for line in wide) > 80  # a wider terminal shows more of commands


def test_the_manual_page_lists_each_commands_options() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "deploy/debian/manpage.py"), "0.1.0"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    page = r.stdout
    gputrace = page[page.index("\\fBgputrace\\fR") :]
    gputrace = gputrace[: gputrace.index("\n.RE\n.TP\n")]  # up to the next command
    for option in ("\\fB\\-\\-log\\-file\\fR\\fI LOG_FILE\\fR", "\\fB\\-\\-wait\\fR"):
        assert option in gputrace, option
    assert "\\fB\\-\\-sort\\fR\\fI KEY\\fR" in page
