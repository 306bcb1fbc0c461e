"""Every user has a place for traces that always works: the per-user trace directory.

A request without a log file goes to ``<[tracing] user_dirs>/<user>/trace_<time>.pt.trace.json``
(made by the agent: the user's own, mode 0700, in a parent only root writes), and a user may
name files under its own home. Both work on a host whose link protections are off, where
``/tmp`` is refused (``shared_directory_unprotected``); the test turns them off and restores
them. The directory is checked before every use and refused, never followed, when another
user made the parent or the user's directory first.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from local_user import local_user
from served_site import ServedSite, served_site

from bpfdyno.core.errors import PermissionDenied
from bpfdyno.rpc.v1 import tracing_pb2 as pb
from bpfdyno.rpc.v1 import tracing_pb2_grpc as pb_grpc
from bpfdyno.tracing.safety import PROTECTIONS, ensure_user_trace_dir, read_protections

pytestmark = [pytest.mark.root]

TIMESTAMPED = r"trace_[0-9]{8}_[0-9]{6}_PID\.pt\.trace\.json"


@contextlib.contextmanager
def link_protections_off() -> Iterator[None]:
    """``fs.protected_symlinks`` and ``fs.protected_regular`` at 0 for the block (restored)."""
    saved = read_protections()
    off = ("fs.protected_symlinks", "fs.protected_regular")
    try:
        for name in off:
            Path("/proc/sys", *name.split(".")).write_text("0")
        yield
    finally:
        for name in off:
            Path("/proc/sys", *name.split(".")).write_text(str(saved[name]))
    assert read_protections() == saved


def test_the_agent_makes_the_users_own_directory(tmp_path: Path) -> None:
    parent = tmp_path / "bpfdyno"
    with local_user() as u:
        path = ensure_user_trace_dir(str(parent), u.uid)
        assert path == str(parent / u.name)
        st = os.lstat(path)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (u.uid, u.gid, 0o700)
        pst = os.lstat(parent)
        assert (pst.st_uid, stat.S_IMODE(pst.st_mode)) == (0, 0o755)
        # Again: verified, kept (a file inside survives), same answer.
        (parent / u.name / "old.json").write_text("{}")
        assert ensure_user_trace_dir(str(parent), u.uid) == path
        assert (parent / u.name / "old.json").exists()


def test_a_parent_another_user_made_is_refused_not_followed(tmp_path: Path) -> None:
    with local_user() as u:
        mine = tmp_path / "theirs"
        mine.mkdir()
        os.chown(mine, u.uid, u.gid)
        with pytest.raises(PermissionDenied) as e:
            ensure_user_trace_dir(str(mine), 0)
        assert e.value.rule == "unsafe_user_dirs"
        assert f"{mine} belongs to uid {u.uid} ({u.name})" in str(e.value)
        assert f"rm -r {mine}" in str(e.value)
        # A link planted where the parent should be (e.g. in /tmp or /var/tmp).
        link = tmp_path / "link"
        link.symlink_to(mine)
        with pytest.raises(PermissionDenied) as e:
            ensure_user_trace_dir(str(link), 0)
        assert e.value.rule == "unsafe_user_dirs"
        assert "a symbolic link" in str(e.value)
        assert not (mine / "root").exists()


def test_a_users_directory_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "bpfdyno"
    with local_user() as alice, local_user() as mallory:
        parent.mkdir(mode=0o755)
        squat = parent / alice.name
        squat.mkdir(mode=0o700)
        os.chown(squat, mallory.uid, mallory.gid)
        with pytest.raises(PermissionDenied) as e:
            ensure_user_trace_dir(str(parent), alice.uid)
        assert e.value.rule == "unsafe_user_dirs"
        assert f"belongs to uid {mallory.uid} ({mallory.name})" in str(e.value)
        squat.chmod(0o777)
        os.chown(squat, alice.uid, alice.gid)
        with pytest.raises(PermissionDenied) as e:
            ensure_user_trace_dir(str(parent), alice.uid)
        assert "mode 777" in str(e.value)


async def _gputrace(site: ServedSite, user: str, pid: int, *more: str) -> dict[str, object]:
    """``bpfdyno gputrace`` as ``user`` ("root": the test's own user) until written."""
    argv = ["gputrace", "--pids", str(pid), "--iterations", "2", "--wait", "--timeout", "90",
            "--json", *more]  # fmt: skip
    if user == "root":
        r = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "bpfdyno", argv[0], "--socket", site.sock,
                             *argv[1:]], capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    else:
        r = await site.cli(user, *argv)
    assert r.returncode == 0, r.stdout + r.stderr + site.diagnostics()
    out: dict[str, object] = json.loads(r.stdout)
    return out


async def _idle(site: ServedSite, pid: int) -> None:
    """Wait until the trainer polls as idle again after a trace."""
    async with grpc.aio.insecure_channel(f"unix:{site.sock}") as ch:
        stub = pb_grpc.TracingStub(ch)
        async with asyncio.timeout(60):
            while True:
                resp = await stub.ListTrainers(pb.ListTrainersRequest())
                if any(t.pid == pid and t.state == pb.TRAINER_STATE_IDLE for t in resp.trainers):
                    return
                await asyncio.sleep(0.1)


def _written(out: dict[str, object]) -> str:
    [proc] = out["trace"]["processes"]  # type: ignore[index]
    assert proc["state"] == "PROCESS_TRACE_STATE_WRITTEN", proc
    path: str = proc["output_path"]
    assert json.loads(Path(path).read_text())["traceEvents"], path
    return path


@pytest.mark.slow
@pytest.mark.usefixtures("torch_ready")
async def test_traces_land_without_flags_with_link_protections_off(short_tmp: Path) -> None:
    """The README's trace command, as a user and as root, on a host with the link
    protections off: no --log-file, a file under the user's home, and ``/tmp`` refused with a
    way out."""
    user_dirs = short_tmp / "per-user"
    sets = [
        f"tracing.user_dirs={json.dumps(str(user_dirs))}",
        f"tracing.allowed_dirs={json.dumps(['/tmp', str(short_tmp)])}",
    ]
    async with served_site(short_tmp, users=("alice",), sets=sets) as site:
        alice = site.users["alice"]
        # Her home in the passwd database is the directory she owns (useradd made none).
        subprocess.run(["usermod", "-d", str(alice.home), alice.name], check=True)
        proc = site.spawn_trainer("alice")
        [pid] = await proc.wait_ready()
        await site.wait_registered(pid)
        with link_protections_off():
            assert {k: v for k, v in read_protections().items() if v < PROTECTIONS[k]}
            # /tmp: refused, and the refusal says what to do instead.
            r = await site.cli("alice", "gputrace", "--pids", str(pid), "--iterations", "2",
                               "--log-file", "/tmp/t.json")  # fmt: skip
            assert r.returncode == 1, r.stdout + r.stderr
            assert "shared_directory_unprotected" in r.stderr
            assert "leave out --log-file" in r.stderr
            # No log file: her own directory, made now, a timestamped name.
            first = _written(await _gputrace(site, "alice", pid))
            assert os.path.dirname(first) == str(user_dirs / alice.name)
            assert re.fullmatch(TIMESTAMPED.replace("PID", str(pid)), os.path.basename(first)), (
                first
            )
            st = os.stat(user_dirs / alice.name)
            assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice.uid, 0o700)
            assert os.stat(first).st_uid == alice.uid
            # Root tracing her process without a log file: her directory, not root's.
            await _idle(site, pid)
            second = _written(await _gputrace(site, "root", pid))
            assert os.path.dirname(second) == str(user_dirs / alice.name)
            assert second != first
            # Her home is allowed by default.
            await _idle(site, pid)
            home_file = alice.home / "traces.json"
            third = _written(await _gputrace(site, "alice", pid, "--log-file", str(home_file)))
            assert third == str(alice.home / f"traces_{pid}.json")
        assert not (user_dirs / "root").exists()
