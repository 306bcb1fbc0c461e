"""Fixtures for the tracing tests: PyTorch 2.13 for the trainers, short temporary directories
(Unix socket paths are limited to 107 bytes), and a daemon-side harness."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from tracing_harness import Harness

from bpfdyno.sources.irq.collector import IrqCollector

TORCH_VERSION = "2.13.0"


@pytest.fixture(scope="session")
def torch_ready() -> str:
    """The trainers' interpreter, with torch 2.13 importable (installed if it is missing).

    The CPU build is a local package on the project's machines; a bare ``torch`` from PyPI
    would pull gigabytes of CUDA libraries, so the exact version is pinned.
    """
    probe = [sys.executable, "-c", "import torch; print(torch.__version__)"]
    r = subprocess.run(probe, capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.startswith(TORCH_VERSION):
        install = subprocess.run(
            [sys.executable, "-m", "pip", "install", f"torch=={TORCH_VERSION}"],
            capture_output=True,
            text=True,
        )
        if install.returncode != 0:
            pytest.fail(
                f"torch=={TORCH_VERSION} is needed for the tracing tests and could not be "
                f"installed: {install.stderr[-2000:]}"
            )
    return sys.executable


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bdt-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def harness(short_tmp: Path) -> AsyncIterator[Harness]:
    h = Harness(short_tmp)
    async with h:
        yield h


@pytest.fixture(scope="module")
def irq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IrqCollector]:
    """The interrupt collector with its BPF program in the kernel (interrupt time for the
    fabric track)."""
    c = IrqCollector(header_cache=tmp_path_factory.mktemp("kheaders"))
    c.start()
    try:
        yield c
    finally:
        c.close()
