"""An unprivileged local user for one test: created with useradd, removed afterwards.

Commands run as that user through ``setpriv`` (real, effective and saved uid and gid, no
supplementary groups). The test interpreter may live where other users cannot reach it
(pyenv under /root, mode 0700): then the command runs in a private mount namespace in which
the unreachable directory is covered by an empty tmpfs (mode 755) with only the interpreter,
the virtualenv and this checkout bound back — the user gets exactly the same interpreter
and packages, and nothing else of that directory. The daemon sees such a process as one in
another mount namespace (like a container) and checks its files through /proc/<pid>/root.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "bpfdyno.service"


def unit_capabilities() -> list[str]:
    """The packaged unit's ambient capabilities, as setpriv names them (``bpf``, ...)."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("AmbientCapabilities="):
            return [c.lower().removeprefix("cap_") for c in line.split("=", 1)[1].split()]
    raise AssertionError(f"{UNIT} has no AmbientCapabilities")


def unit_umask() -> str:
    """The packaged unit's UMask."""
    for line in UNIT.read_text().splitlines():
        if line.startswith("UMask="):
            return line.split("=", 1)[1]
    raise AssertionError(f"{UNIT} has no UMask")


def _blocker(path: Path) -> Path | None:
    """The first directory above ``path`` that other users cannot traverse (None: none)."""
    current = Path("/")
    for part in path.parts[1:]:
        if not os.stat(current).st_mode & 0o001:
            return current
        current = current / part
    return None


def _reach_script(needed: Sequence[Path], stash: Path) -> str:
    """Shell lines that make every path in ``needed`` reachable in a new mount namespace."""
    lines = ["set -e"]
    by_blocker: dict[Path, list[Path]] = {}
    for path in needed:
        blocker = _blocker(path)
        if blocker is not None:
            by_blocker.setdefault(blocker, []).append(path)
    n = 0
    for blocker, paths in by_blocker.items():
        saved = []
        for path in paths:
            spot = stash / str(n)
            n += 1
            lines += [f"mkdir -p {spot}", f"mount --bind {shlex.quote(str(path))} {spot}"]
            saved.append((path, spot))
        lines.append(f"mount -t tmpfs -o mode=755 bdt-reach {shlex.quote(str(blocker))}")
        for path, spot in saved:
            q = shlex.quote(str(path))
            lines += [f"mkdir -p {q}", f"mount --bind {spot} {q}"]
    return "\n".join(lines)


@dataclass
class LocalUser:
    """A user that exists for one test.

    Attributes:
        name, uid, gid: who it is.
        home: a directory it owns (its HOME and TMPDIR).
    """

    name: str
    uid: int
    gid: int
    home: Path
    _stash: Path

    def wrap(
        self,
        argv: Sequence[str],
        pid_namespace: bool = False,
        unit: bool = False,
        groups: bool = False,
    ) -> list[str]:
        """``argv`` as a command that runs as this user (in a new pid namespace if asked).

        With ``unit``, the way the packaged systemd unit runs the agent as this user: its
        groups, the unit's ambient (and only those bounding) capabilities, its umask,
        NoNewPrivileges. With ``groups``, with its supplementary groups (as at a login).
        """
        member = "--init-groups" if groups else "--clear-groups"
        drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", member, "--"]
        if unit:
            caps = ",".join(f"+{c}" for c in unit_capabilities())
            drop = [
                "setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups",
                f"--inh-caps=-all,{caps}", f"--ambient-caps=-all,{caps}",
                f"--bounding-set=-all,{caps}", "--no-new-privs", "--",
                "sh", "-c", f'umask {unit_umask()} && exec "$@"', "sh",
            ]  # fmt: skip
        needed = [Path(os.path.realpath(p)) for p in (sys.base_prefix, sys.prefix)] + [ROOT]
        reach = _reach_script(needed, self._stash)
        if reach == "set -e" and not pid_namespace:
            return [*drop, *argv]
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if pid_namespace:
            unshare += ["--pid", "--fork", "--mount-proc"]
        script = f'{reach}\nexec {shlex.join(drop)} "$@"'
        return [*unshare, "sh", "-c", script, "sh", *argv]

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment for this user (no root leftovers such as SUDO_*)."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("SUDO_", "SLURM_", "KINETO_", "BPFDYNO_"))
        }
        env.update(HOME=str(self.home), TMPDIR=str(self.home), USER=self.name, LOGNAME=self.name)
        env.update(extra)
        return env

    def run(
        self,
        argv: Sequence[str],
        timeout: float = 120,
        unit: bool = False,
        groups: bool = False,
        **extra_env: str,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as this user and wait for it (see `wrap` for ``unit``, ``groups``)."""
        return subprocess.run(
            self.wrap(argv, unit=unit, groups=groups),
            env=self.env(**extra_env),
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.home,
        )

    def python(
        self, code: str, *args: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run Python ``code`` (with ``sys.argv[1:] == args``) as this user."""
        return self.run([sys.executable, "-c", code, *args], timeout=timeout)


@contextlib.contextmanager
def local_user() -> Iterator[LocalUser]:
    """Create a user (and its group) for the duration of the block; remove both after."""
    name = f"bdt{uuid.uuid4().hex[:10]}"
    subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/sh", name],
        check=True,
        capture_output=True,
    )
    home = Path(tempfile.mkdtemp(prefix="bdthome-", dir="/tmp"))
    stash = Path(tempfile.mkdtemp(prefix="bdtstash-", dir="/tmp"))
    try:
        pw = pwd.getpwnam(name)
        os.chown(home, pw.pw_uid, pw.pw_gid)
        yield LocalUser(name, pw.pw_uid, pw.pw_gid, home, stash)
    finally:
        # Tests kill the processes they start; -f only if one still runs as the user.
        if subprocess.run(["userdel", name], capture_output=True).returncode != 0:
            subprocess.run(["userdel", "-f", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(stash, ignore_errors=True)
