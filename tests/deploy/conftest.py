"""What the package and image tests share: one build of the Debian package per session."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def debian_package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bpfdyno_<version>_<arch>.deb, built by deploy/debian/build.sh from this checkout."""
    out = tmp_path_factory.mktemp("deb")
    started = time.monotonic()
    r = subprocess.run(
        [REPO / "deploy" / "debian" / "build.sh", "--out", out],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr
    (deb,) = out.glob("bpfdyno_*.deb")
    assert r.stdout == f"{deb}\n"  # the script names what it built, and only that
    print(f"debian package built in {time.monotonic() - started:.0f} s: {deb}")
    return deb
