"""``bpfdyno run``'s state directory is its user's alone, as real unprivileged users see it.

Found on main: ``bpfdyno run`` created ``/tmp/bpfdyno-<uid>`` with ``mkdir(exist_ok=True)``
and never checked it; another user who planted that directory with links named ``state``
and ``agent.log`` made the victim overwrite its own files (a 0600 file was replaced), and
could have pointed the victim's tasks at a socket of the planter's.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_user import LocalUser, local_user

pytestmark = [pytest.mark.root, pytest.mark.slow]

PRECIOUS = b"alice's own secret, mode 0600\n"
#: The task: which agent it was pointed at, then exit 7.
TASK = textwrap.dedent(
    """
    import json, os, subprocess, sys
    st = subprocess.run([sys.executable, "-m", "bpfdyno", "status", "--json"],
                        capture_output=True, text=True)
    pid = json.loads(st.stdout)["pid"] if st.returncode == 0 else -1
    print(json.dumps({"target": os.environ.get("BPFDYNO_TARGET", ""), "agent_pid": pid}))
    sys.exit(7)
    """
)


@pytest.fixture
def users() -> Iterator[tuple[LocalUser, LocalUser]]:
    with local_user() as alice, local_user() as mallory:
        yield alice, mallory


def run(user: LocalUser, *extra: str, **env: str) -> tuple[int, str, str]:
    """``bpfdyno run -- <TASK>`` as ``user``, with no node agent to find."""
    argv = [
        sys.executable, "-m", "bpfdyno", "run", "--node-socket", str(user.home / "no-agent"),
        "--set=legacy_rpc.enabled=false", "--set=capture.enabled=false",
        f'--set=kineto.socket_dir="{user.home}"',
        *(f"--set=collectors.{c}.enabled=false"
          for c in ("sched", "net", "pmu", "perf_sw", "gpu", "dcgm", "procs")),
        *extra, "--", sys.executable, "-c", TASK,
    ]  # fmt: skip
    r = user.run(argv, timeout=180, **env)
    return r.returncode, r.stdout, r.stderr


def test_a_planted_directory_is_refused_and_nothing_of_the_user_is_touched(
    users: tuple[LocalUser, LocalUser],
) -> None:
    alice, mallory = users
    precious = alice.home / "precious"
    precious.write_bytes(PRECIOUS)
    os.chown(precious, alice.uid, alice.gid)
    os.chmod(precious, 0o600)
    planted = Path("/tmp") / f"bpfdyno-{alice.uid}"
    script = (
        f"mkdir -m 777 {planted} && ln -s {precious} {planted}/state && "
        f"ln -s {precious} {planted}/agent.log && ln -s {precious} {planted}/users.lock"
    )
    r = mallory.run(["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    try:
        rc, out, err = run(alice, TMPDIR="/tmp")
        assert rc == 7, err  # the command ran, without an agent
        assert json.loads(out) == {"target": "", "agent_pid": -1}
        assert f"{planted} belongs to uid {mallory.uid}, not to you (uid {alice.uid})" in err
        assert "running the command without one" in err
        assert precious.read_bytes() == PRECIOUS
        assert sorted(os.listdir(planted)) == ["agent.log", "state", "users.lock"]
    finally:
        mallory.run(["rm", "-rf", str(planted)])
    # A link in its place (to a directory of the planter's) is not followed either.
    theirs = mallory.home / "d"
    r = mallory.run(["sh", "-c", f"mkdir -m 777 {theirs} && ln -s {theirs} {planted}"])
    assert r.returncode == 0, r.stderr
    try:
        rc, _, err = run(alice, TMPDIR="/tmp")
        assert rc == 7 and f"{planted} is a symbolic link" in err, err
        assert os.listdir(theirs) == []
    finally:
        os.unlink(planted)


def test_the_users_runtime_directory_is_used(users: tuple[LocalUser, LocalUser]) -> None:
    """With ``$XDG_RUNTIME_DIR`` (systemd's /run/user/<uid>), the agent lives there; a
    directory of the user's own that others may enter is refused until it is closed."""
    alice, _ = users
    runtime = alice.home / "run"
    runtime.mkdir()
    os.chown(runtime, alice.uid, alice.gid)
    os.chmod(runtime, 0o700)
    rc, out, err = run(alice, XDG_RUNTIME_DIR=str(runtime))
    assert rc == 7, err
    report = json.loads(out)
    state = runtime / "bpfdyno"
    assert report["target"] == str(state / "bpfdyno.sock")
    assert report["agent_pid"] > 0, err
    st = state.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (alice.uid, 0o700)
    os.chmod(state, 0o755)
    rc, out, err = run(alice, XDG_RUNTIME_DIR=str(runtime))
    assert rc == 7 and json.loads(out)["agent_pid"] == -1
    assert f"{state} is open to others (mode 755)" in err
