"""Fixtures for the tracing tests: PyTorch 2.13 for the trainers, short temporary directories
(Unix socket paths are limited to 107 bytes), and a daemon-side harness."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from local_user import local_user
from security_site import MAX_DURATION_MS, VICTIM_BYTES, Site
from served_site import RUN_MODES
from tracing_harness import Harness, grpc_api

from bpfdyno.server.audit import audit_servicer_factory
from bpfdyno.server.tracing import servicer_factory
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


@pytest.fixture
async def site(short_tmp: Path) -> AsyncIterator[Site]:
    """A shared node (`security_site.Site`): the agent with its gRPC socket open to all."""
    os.chmod(short_tmp, 0o755)  # everyone may reach the agent's sockets
    with local_user() as user:
        h = Harness(
            short_tmp,
            allowed=[str(short_tmp)],
            overrides=[
                ("tracing.max_duration_ms", str(MAX_DURATION_MS)),
                ("tracing.audit_file", json.dumps(str(short_tmp / "audit.log"))),
            ],
        )
        os.chmod(h.socket_dir, 0o1777)  # trainers of every user bind their sockets here
        user_dir = short_tmp / "userdir"
        user_dir.mkdir()
        os.chown(user_dir, user.uid, user.gid)
        victim = short_tmp / "victim"
        victim.write_bytes(VICTIM_BYTES)
        await h.comp.start()
        sock = str(short_tmp / "grpc.sock")
        try:
            async with grpc_api(
                sock, servicer_factory(h.service), audit_servicer_factory(h.service.audit)
            ):
                yield Site(h, user, sock, user_dir, victim)
        finally:
            h.close()
            await h.comp.stop()


@pytest.fixture(params=RUN_MODES)
def run_mode(request: pytest.FixtureRequest) -> str:
    """Where the run mode matters (what the agent reads and with which capabilities), the
    attack is made against the agent as root and as the packaged unit runs it."""
    mode: str = request.param
    return mode


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
