"""The wheel installs the `bpfdyno` package, and only it, into a clean virtualenv.

agent/ and tui/ are source roots (agent/bpfdyno/..., tui/bpfdyno/tui/...: every file sits at its
module path) and bpf/ is remapped to the data package bpfdyno.bpf. These tests check that a
real wheel installed into a fresh venv holds every module, the console script works, no
generic top-level `agent` / `tui` module leaks into site-packages, and the BPF C sources
travel as package data.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

import bpfdyno.version
from bpfdyno.app.doctor import run_checks
from bpfdyno.core.config import Config

ROOT = Path(__file__).resolve().parent.parent
# Build from a copy without the developer's artefacts, so nothing local leaks into the wheel
# and the build never writes into the checkout (build/, *.egg-info) under other test runs.
_NOT_SOURCES = shutil.ignore_patterns(
    ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
)


def test_dev_env_does_not_expose_source_folder_names() -> None:
    assert importlib.util.find_spec("agent") is None
    assert importlib.util.find_spec("tui") is None
    assert Path(bpfdyno.version.__file__).resolve().parent == ROOT / "agent" / "bpfdyno"


def source_modules() -> set[str]:
    """Every module of the source roots, named by its path (agent/bpfdyno/x/y.py: bpfdyno.x.y)."""
    names = set()
    for root in (ROOT / "agent", ROOT / "tui"):
        for path in root.rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_module_is_importable_at_its_path() -> None:
    """Paths match module paths, so IDEs and static import graphs follow every import."""
    for name in sorted(source_modules()):
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        rel = Path(spec.origin).resolve().relative_to(ROOT)
        expected = Path(*name.split("."))
        assert rel.parts[0] in ("agent", "tui"), (name, rel)
        found = Path(*rel.parts[1:]).with_suffix("")
        assert found in (expected, expected / "__init__"), (name, rel)


class Installed:
    """A copy of this checkout, the wheel built from it, and a fresh venv it is installed in."""

    def __init__(self, src: Path, wheel: Path, venv: Path, workdir: Path) -> None:
        self.src = src
        self.wheel = wheel
        self.venv = venv
        self.workdir = workdir

    def run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """Run a program of the venv from a directory outside the checkout."""
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        return subprocess.run(
            [self.venv / "bin" / args[0], *args[1:]],
            cwd=self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("packaging")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_NOT_SOURCES)
    dist = work / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", dist, src],
        check=True,
        capture_output=True,
        timeout=240,
    )
    (wheel,) = dist.glob("*.whl")
    venv = work / "venv"
    # sys.executable is the dev venv's Python; venv bases the new one on the real interpreter
    # and, by default, without system site-packages.
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=120)
    subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "-q", wheel],
        check=True,
        capture_output=True,
        timeout=240,
    )
    return Installed(src, wheel, venv, work)


@pytest.mark.slow
def test_wheel_holds_only_the_bpfdyno_package(installed: Installed) -> None:
    assert installed.wheel.name == f"bpfdyno-{bpfdyno.version.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(installed.wheel) as zf:
        top = {name.split("/", 1)[0] for name in zf.namelist()}
    assert top == {"bpfdyno", f"bpfdyno-{bpfdyno.version.__version__}.dist-info"}
    with zipfile.ZipFile(installed.wheel) as zf:
        packed = {
            n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            for n in zf.namelist()
            if n.endswith(".py")
        }
    assert source_modules() <= packed


@pytest.mark.slow
def test_console_script_version(installed: Installed) -> None:
    r = installed.run("bpfdyno", "--version")
    assert (r.returncode, r.stdout, r.stderr) == (0, f"bpfdyno {bpfdyno.version.__version__}\n", "")


@pytest.mark.slow
def test_console_script_doctor(installed: Installed) -> None:
    names = [c.name for c in run_checks(Config())]
    r = installed.run("bpfdyno", "doctor")
    lines = r.stdout.splitlines()
    status = {}
    for name in dict.fromkeys(names):  # one line per check (one per legacy address)
        found = [ln for ln in lines if re.match(rf"(ok|warn|missing) +{re.escape(name)}: ", ln)]
        assert len(found) == names.count(name), f"{name}: {found} in\n{r.stdout}"
        status[name] = found[0].split()[0]
    # The fresh venv cannot see Debian's bcc (only the bootstrap links it into .venv), so a
    # required check is missing and doctor must say so through its exit code.
    assert status["bcc"] == "missing"
    assert r.returncode == 1, r.stdout + r.stderr


@pytest.mark.slow
def test_installed_layout_and_package_data(installed: Installed) -> None:
    probe = textwrap.dedent(
        """
        import importlib.resources, importlib.util, json, sys
        import bpfdyno.version, bpfdyno.bpf, bpfdyno.tui

        def data(package, suffixes):
            root = importlib.resources.files(package)
            return {p.name: p.read_text() for p in root.iterdir() if p.name.endswith(suffixes)}

        print(json.dumps({
            "agent": importlib.util.find_spec("agent") is not None,
            "tui": importlib.util.find_spec("tui") is not None,
            "bpfdyno": bpfdyno.version.__file__,
            "prefix": sys.prefix,
            "bpf": data("bpfdyno.bpf", (".c", ".h")),
            "tcss": data("bpfdyno.tui", (".tcss",)),
        }))
        """
    )
    r = installed.run("python", "-c", probe)
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert found["agent"] is False
    assert found["tui"] is False
    assert Path(found["bpfdyno"]).is_relative_to(found["prefix"])
    for name in ("agent", "tui"):
        r = installed.run("python", "-c", f"import {name}")
        assert f"ModuleNotFoundError: No module named '{name}'" in r.stderr
    # Compared with the tree the wheel was built from (the checkout may change meanwhile).
    bpf_sources = {p.name: p.read_text() for p in (installed.src / "bpf").glob("*.[ch]")}
    assert any(name.endswith(".bpf.c") for name in bpf_sources)
    assert found["bpf"] == bpf_sources
    assert found["tcss"] == {
        p.name: p.read_text() for p in (installed.src / "tui" / "bpfdyno" / "tui").glob("*.tcss")
    }


def test_installed_package_builds_the_nccl_profiler_plugin(
    installed: Installed, tmp_path: Path
) -> None:
    # The plugin's C sources travel as package data and build where the agent is installed.
    r = installed.run("python", "-m", "bpfdyno.sources.nccl_profiler.build", str(tmp_path))
    assert r.returncode == 0, r.stderr
    library = tmp_path / "libbpfdyno-nccl-profiler.so"
    assert r.stdout == f"{library}\n"
    assert b"ncclProfiler_v5" in library.read_bytes()
