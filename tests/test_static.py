"""ruff and mypy over the whole code base, as part of the test suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ruff_check() -> None:
    r = subprocess.run(
        [BIN / "ruff", "check", "agent", "tui", "bpf", "tests", "proto", "deploy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = subprocess.run(
        [BIN / "ruff", "format", "--check", "agent", "tui", "bpf", "tests", "proto", "deploy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_mypy_strict(tmp_path: Path) -> None:
    # The source roots are in pyproject.toml (mypy_path): mypy reads the files in place.
    env = dict(os.environ, MYPY_CACHE_DIR=str(ROOT / ".mypy_cache"))
    r = subprocess.run(
        [BIN / "mypy", "--config-file", ROOT / "pyproject.toml", "-p", "bpfdyno"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
