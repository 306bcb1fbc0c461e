"""vagrant/bootstrap.sh's set-up works for every user, not only root: the virtualenv is built on
the system's /usr/bin/python3, one built on an interpreter other users cannot run is rebuilt,
and ``bpfdyno`` is put on every user's PATH.

The script is sourced (it then only defines its functions) and its steps are run one by one
on virtualenvs and a link directory of the test's own, so the checkout's .venv is never
touched; the result is then used by a real unprivileged user.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracing"))
from local_user import local_user

pytestmark = [pytest.mark.root]

SCRIPT = Path(__file__).resolve().parents[2] / "vagrant" / "bootstrap.sh"
SYSTEM_PYTHON = Path("/usr/bin/python3")


def bootstrap(steps: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Source the script, set ``env`` as its variables, run ``steps`` (bash)."""
    assigns = "\n".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(SCRIPT))}\n{assigns}\n{steps}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A directory every user can reach: not under pytest's base, which is 0700 (opening it
    raced another pytest session of root's, which closes it again at its start)."""
    d = Path(tempfile.mkdtemp(prefix="bdt-boot-", dir="/tmp"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def system_python_ok() -> bool:
    r = subprocess.run([str(SYSTEM_PYTHON), "-c", "import sys, venv, ensurepip; "
                        "sys.exit(sys.version_info < (3, 11))"], capture_output=True)  # fmt: skip
    return r.returncode == 0


def test_sourcing_runs_nothing() -> None:
    r = bootstrap("echo sourced")
    assert (r.returncode, r.stdout, r.stderr) == (0, "sourced\n", "")


@pytest.mark.skipif(not system_python_ok(), reason="no /usr/bin/python3 >= 3.11 with venv here")
def test_the_system_python_comes_first_whatever_is_on_path(tmp_path: Path) -> None:
    # A private interpreter first on PATH (as pyenv's shims are for root).
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "python3.11").symlink_to(SYSTEM_PYTHON)
    r = bootstrap('PATH="$PRIVATE:$PATH"; find_python', PRIVATE=str(private))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.realpath(SYSTEM_PYTHON) or r.stdout.strip() == str(
        SYSTEM_PYTHON
    )


@pytest.mark.skipif(not system_python_ok(), reason="no /usr/bin/python3 >= 3.11 with venv here")
def test_a_venv_other_users_cannot_run_is_rebuilt_and_then_every_user_runs_it(
    reachable: Path,
) -> None:
    tmp_path = reachable
    venv = tmp_path / "venv"
    # Built first on an interpreter in a private directory, as on a machine where root's
    # pyenv Python was first on PATH.
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "python3").symlink_to(SYSTEM_PYTHON)
    subprocess.run([str(private / "python3"), "-m", "venv", str(venv)], check=True)
    assert str(private) in os.readlink(venv / "bin" / "python3") or (
        str(private) in (venv / "pyvenv.cfg").read_text()
    )
    r = bootstrap(
        'PYTHON=$(find_python); usable_by_all "$VENV/bin/python" && echo usable || echo private;'
        ' ensure_venv; usable_by_all "$VENV/bin/python" && echo usable',
        VENV=str(venv),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["private", "usable"], r.stdout + r.stderr
    assert "which other users cannot run: rebuilding it on /usr/bin/python3" in r.stderr
    assert os.path.realpath(venv / "bin" / "python") == os.path.realpath(SYSTEM_PYTHON)
    # A second run keeps it.
    again = bootstrap("PYTHON=$(find_python); ensure_venv; echo kept", VENV=str(venv))
    assert again.stdout == "kept\n" and "rebuilding" not in again.stderr
    with local_user() as user:
        out = subprocess.run(
            ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--",
             str(venv / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert (out.returncode, out.stdout.strip()) == (0, str(venv)), out.stderr


def test_bpfdyno_goes_on_every_users_path_without_clobbering(tmp_path: Path) -> None:
    venv = tmp_path / "checkout" / ".venv"
    (venv / "bin").mkdir(parents=True)
    command = venv / "bin" / "bpfdyno"
    command.write_text("#!/bin/sh\necho bpfdyno from the checkout\n")
    command.chmod(0o755)
    link = tmp_path / "bin" / "bpfdyno"
    r = bootstrap("ensure_path_link; ensure_path_link", VENV=str(venv), BIN_LINK=str(link))
    assert r.returncode == 0, r.stderr
    assert os.readlink(link) == str(command)
    assert r.stderr.count(f"bpfdyno on every user's PATH: {link} -> {command}") == 1
    # Another checkout's link is replaced; an installed command is left alone.
    other = tmp_path / "other" / ".venv" / "bin" / "bpfdyno"
    link.unlink()
    link.symlink_to(other)
    assert bootstrap("ensure_path_link", VENV=str(venv), BIN_LINK=str(link)).returncode == 0
    assert os.readlink(link) == str(command)
    link.unlink()
    link.write_text("#!/bin/sh\necho packaged\n")
    r = bootstrap("ensure_path_link", VENV=str(venv), BIN_LINK=str(link))
    assert r.returncode == 0 and not link.is_symlink()
    assert f"note: {link} exists (an installed bpfdyno?): left as it is" in r.stderr
    assert stat.S_ISREG(os.lstat(link).st_mode)
