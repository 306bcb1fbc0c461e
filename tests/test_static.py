"""ruff and mypy over the whole code base, as part of the test suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def _link_tree(dest: Path) -> Path:
    """A `bpfdyno` package tree of symlinks mirroring the installed layout.

    The source folders (agent/ -> bpfdyno, tui/ -> bpfdyno.tui, bpf/ -> bpfdyno.bpf) do not
    carry the package's name, so mypy is pointed at this mirror instead.
    """
    pkg = dest / "bpfdyno"
    pkg.mkdir(parents=True)
    for entry in (ROOT / "agent").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    (pkg / "tui").symlink_to(ROOT / "tui")
    (pkg / "bpf").symlink_to(ROOT / "bpf")
    return pkg


def test_ruff_check() -> None:
    r = subprocess.run(
        [BIN / "ruff", "check", "agent", "tui", "bpf", "tests", "proto"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_format() -> None:
    r = subprocess.run(
        [BIN / "ruff", "format", "--check", "agent", "tui", "bpf", "tests", "proto"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_mypy_strict(tmp_path: Path) -> None:
    pkg = _link_tree(tmp_path)
    env = dict(os.environ, MYPY_CACHE_DIR=str(ROOT / ".mypy_cache"))
    r = subprocess.run(
        [BIN / "mypy", "--config-file", ROOT / "pyproject.toml", str(pkg)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
