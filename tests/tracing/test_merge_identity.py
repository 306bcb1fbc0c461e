"""The merge's identity: the file owner's uid, gid and groups on that thread, nothing of root's.

Found by reading the code: ``files_as`` switched the file-system uid and gid but kept the
agent's supplementary groups, so an agent started from a root login with groups (``adm``,
``disk``...) merged with them. glibc's ``setgroups()`` (Python's ``os.setgroups``) changes
every thread of the process, so the switch calls the system call for its thread alone.
"""

from __future__ import annotations

import contextlib
import grp
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_user import LocalUser, local_user

from bpfdyno.core.identity import files_as, user_groups
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
