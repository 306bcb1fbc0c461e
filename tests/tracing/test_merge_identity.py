"""The merge's identity: the file owner's uid, gid and groups on that thread, nothing of root's.

Found by reading the code: ``files_as`` switched the file-system uid and gid but kept the
agent's supplementary groups, so an agent started from a root login with groups (``adm``,
``disk``...) merged with them. glibc's ``setgroups()`` (Python's ``os.setgroups``) changes
every thread of the process, so the switch calls the system call for its thread alone.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_user import LocalUser, local_user

from bpfdyno.core.identity import file_owner, files_as, user_groups
from bpfdyno.tracing.merge import Insertion, MergeError, TraceLayout, merge_into_trace

pytestmark = pytest.mark.root

TRACE = (
    b'{"schemaVersion": 1, "baseTimeNanoseconds": 1700000000000000000, "traceEvents": [\n'
    b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1.0, '
    b'"dur": 2.0}\n], "traceName": "t.json"}\n'
)


def one_event(_layout: TraceLayout) -> Insertion:
    return Insertion([b'{"ph": "i", "name": "added", "pid": 7, "tid": 7, "ts": 1.5}'])


@contextlib.contextmanager
def a_group() -> Iterator[int]:
    """A group that exists for one test."""
    name = f"bdtg{os.getpid() % 100000}{threading.get_ident() % 1000}"
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    try:
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True)


@contextlib.contextmanager
def agent_groups(groups: list[int]) -> Iterator[None]:
    """The test process (the agent) with these supplementary groups, as from a root login."""
    saved = os.getgroups()
    os.setgroups(groups)
    try:
        yield
    finally:
        os.setgroups(saved)


def made(path: Path, uid: int, gid: int, mode: int, content: bytes | None = None) -> Path:
    """A directory (or, with ``content``, a file) with exactly this owner and mode."""
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    os.chown(path, uid, gid)
    os.chmod(path, mode)  # not through mkdir's mode: the umask would take bits away
    return path


@pytest.fixture
def user() -> Iterator[LocalUser]:
    with local_user() as u:
        yield u


@pytest.fixture
def base() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="bdt-id-", dir="/tmp"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_agents_supplementary_groups_are_not_lent_to_the_merge(
    user: LocalUser, base: Path
) -> None:
    """The owner swaps a directory link to a directory of a group the agent is in: the merge
    (as the owner) can neither read the trace there nor write next to it."""
    with a_group() as staff:
        victim_dir = made(base / "staff-only", 0, staff, 0o770)
        victim = made(victim_dir / "t.json", 0, staff, 0o660, TRACE)
        theirs = made(base / "theirs", user.uid, user.gid, 0o700)
        os.symlink(victim_dir, theirs / "d")
        with agent_groups([staff]):
            assert os.access(victim, os.R_OK | os.W_OK)  # the agent itself may
            with pytest.raises(MergeError), files_as(user.uid, user.gid):
                merge_into_trace(str(theirs / "d" / "t.json"), one_event)
            assert os.getgroups() == [staff]  # given back after the merge
        assert victim.read_bytes() == TRACE
        assert sorted(os.listdir(victim_dir)) == ["t.json"]


def test_the_owners_own_groups_are_used(user: LocalUser, base: Path) -> None:
    """A user's trace in a directory its group may write is merged: the user's groups come
    from the group database, the agent's are not involved."""
    with a_group() as team:
        subprocess.run(["usermod", "-aG", grp.getgrgid(team).gr_name, user.name], check=True)
        assert user_groups(user.uid, user.gid) == (user.gid, team)
        path = made(
            made(base / "team", 0, team, 0o770) / "t.json", user.uid, user.gid, 0o640, TRACE
        )
        with agent_groups([]), files_as(user.uid, user.gid):
            _, result = merge_into_trace(str(path), one_event)
        assert result.events_added == 1
        st = path.stat()
        assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
        assert b'"name": "added"' in path.read_bytes()


def test_the_switch_is_for_the_merging_thread_alone(user: LocalUser) -> None:
    """While one thread acts as the user, the agent's other threads keep their groups (the
    event loop, collectors): the switch uses setgroups(2) itself, not glibc's all-threads
    wrapper."""
    inside = threading.Event()
    checked = threading.Event()
    seen: list[list[int]] = []

    def other_thread() -> None:
        inside.wait(10)
        seen.append(os.getgroups())
        checked.set()

    with agent_groups([4242, 4243]):
        t = threading.Thread(target=other_thread)
        t.start()
        with files_as(user.uid, user.gid):
            mine = os.getgroups()
            inside.set()
            assert checked.wait(10)
        t.join(10)
        assert os.getgroups() == [4242, 4243]
    assert mine == [user.gid]
    assert seen == [[4242, 4243]]


#: Run inside the agent's identity by the unit test below: reads ``argv[2]`` as itself and
#: as the user ``argv[1]`` (through files_as), and reports what happened.
_UNIT_READER = r"""
import json, os, sys, threading
from bpfdyno.core.identity import files_as, thread_fs_capabilities, primary_gid
uid, path = int(sys.argv[1]), sys.argv[2]
def read():
    try:
        with open(path, "rb") as f:
            return f.read().decode()
    except OSError as e:
        return type(e).__name__
out = {"agent_uid": os.geteuid(), "caps_before": thread_fs_capabilities(), "as_agent": read()}
other, inside, seen = [], threading.Event(), threading.Event()
def other_thread():  # started before the switch: a thread's credentials are its own
    inside.wait(10); other.append(thread_fs_capabilities()); seen.set()
t = threading.Thread(target=other_thread); t.start()
with files_as(uid, primary_gid(uid)):
    out["caps_inside"] = thread_fs_capabilities()
    out["as_user"] = read()
    inside.set(); seen.wait(10)
t.join()
out["other_thread_inside"] = other[0]
out["caps_after"] = thread_fs_capabilities()
out["again_as_agent"] = read()
print(json.dumps(out))
"""


def test_as_the_units_user_reads_as_the_owner_keep_no_capability(base: Path) -> None:
    """The packaged unit runs the agent as its own user with CAP_DAC_READ_SEARCH: setfsuid
    from a non-zero uid keeps it, so "as the owner" read a root-only file through a link the
    owner planted. The working thread now drops the capabilities that override file
    permissions for the duration (only it: the other threads keep theirs), and gets them
    back afterwards."""
    with local_user() as agent, local_user() as owner:
        secret_dir = made(base / "root-only", 0, 0, 0o700)
        made(secret_dir / "t.json", 0, 0, 0o600, b"SECRET")
        theirs = made(base / "theirs", owner.uid, owner.gid, 0o755)
        os.symlink(secret_dir, theirs / "d")
        r = subprocess.run(
            agent.wrap([sys.executable, "-c", _UNIT_READER, str(owner.uid),
                        str(theirs / "d" / "t.json")], unit=True),
            capture_output=True, text=True, timeout=60, env=agent.env(),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        # The unit's file-permission capabilities: CAP_CHOWN (it hands users their trace
        # directories) and CAP_DAC_READ_SEARCH (it reads past permissions itself).
        units = (1 << 0) | (1 << 2)
        assert out == {
            "agent_uid": agent.uid,
            "caps_before": units,
            "as_agent": "SECRET",
            "caps_inside": 0,
            "as_user": "PermissionError",
            "other_thread_inside": units,
            "caps_after": units,
            "again_as_agent": "SECRET",
        }


def test_the_reading_group_is_the_owners_never_the_files(user: LocalUser, base: Path) -> None:
    """A user who owns a file of a group she is not (or no longer) in: acting "as the owner
    of that file" takes her primary group, not the file's, so that group's files stay
    closed to her."""
    with a_group() as former:
        hers = made(base / "hers.json", user.uid, former, 0o640, TRACE)
        closed = made(base / "team.json", 0, former, 0o640, b"TEAM-ONLY")
        assert file_owner(user.uid, str(hers)) == (user.uid, user.gid)
        with files_as(*file_owner(user.uid, str(hers))), pytest.raises(PermissionError):
            closed.read_bytes()
        # A group she is in is kept (Kineto created the file with it).
        subprocess.run(["usermod", "-aG", grp.getgrgid(former).gr_name, user.name], check=True)
        assert file_owner(user.uid, str(hers)) == (user.uid, former)
