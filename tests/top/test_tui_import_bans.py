"""The UI reaches data only through its DataSource: ruff fails an import of the daemon's side.

tui/ruff.toml bans (TID251) every daemon-side package and the data libraries under tui/;
these tests hand ruff a file placed under tui/ (on stdin, with --stdin-filename, so its
config is the one tui/ files get) and check what it says.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
RUFF = Path(sys.executable).parent / "ruff"
IN_TUI = "tui/bpfdyno/tui/widgets/probe.py"

BANNED = (
    "bpfdyno.app",
    "bpfdyno.cli",
    "bpfdyno.core",
    "bpfdyno.ebpf",
    "bpfdyno.exporters",
    "bpfdyno.server",
    "bpfdyno.services",
    "bpfdyno.sources",
    "bpfdyno.tracing",
    "psutil",
    "pynvml",
    "bcc",
)
ALLOWED = ("bpfdyno.rpc.processes", "bpfdyno.rpc.v1", "bpfdyno.client.connection", "bpfdyno.tui")


def ruff_bans(source: str, filename: str) -> subprocess.CompletedProcess[str]:
    """ruff's banned-import check of ``source`` as if it were the file ``filename``."""
    return subprocess.run(
        [RUFF, "check", "--no-cache", "--select", "TID251", "--stdin-filename", filename, "-"],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("module", BANNED)
def test_a_daemon_side_import_in_the_tui_fails_ruff(module: str) -> None:
    source = f"import {module}\nfrom {module}.inner import thing\n"
    r = ruff_bans(source, IN_TUI)
    assert r.returncode == 1, r.stdout + r.stderr
    # The package and any module inside it.
    assert r.stdout.count(f"TID251 `{module}` is banned") == 2, r.stdout


@pytest.mark.parametrize("module", ALLOWED)
def test_the_contract_and_the_connection_are_allowed(module: str) -> None:
    r = ruff_bans(f"import {module}\n", IN_TUI)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_bans_are_the_tuis_own() -> None:
    # The agent imports its own packages freely: the bans live in tui/ruff.toml only.
    r = ruff_bans(
        "import bpfdyno.core.config\nimport bpfdyno.sources.procs\n", "agent/bpfdyno/x.py"
    )
    assert r.returncode == 0, r.stdout + r.stderr
