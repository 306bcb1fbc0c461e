"""Trace-file placement rules on real directories (owners and modes set with chown/chmod).

Each case builds the directory situation an attacker would prepare and checks that the
path is refused with the rule's name, or accepted when only root and the writer control it.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from bpfdyno.core.errors import InvalidArgument, PermissionDenied, RequestError
from bpfdyno.tracing.safety import PROTECTIONS, PlacementChecker, Writer, mount_root

ALICE, MALLORY = 51001, 51002  # uids nobody on the machine has
PROTECTED = dict.fromkeys(PROTECTIONS, 1)
UNPROTECTED = {**PROTECTED, "fs.protected_symlinks": 0}


@pytest.fixture
def base(short_tmp: Path) -> Iterator[Path]:
    os.chmod(short_tmp, 0o755)  # its parent /tmp is sticky: fine on the way down
    yield short_tmp


def checker(protections: dict[str, int] = PROTECTED) -> PlacementChecker:
    return PlacementChecker(protections=lambda: dict(protections))


def mkdir(path: Path, mode: int = 0o755, uid: int = 0) -> Path:
    path.mkdir()
    os.chmod(path, mode)
    os.chown(path, uid, uid)
    return path


def rule_of(path: Path, writer: Writer, c: PlacementChecker | None = None) -> str:
    try:
        (c or checker()).check(str(path), writer)
    except RequestError as e:
        return e.rule
    return ""


def test_root_and_owner_directories_pass(base: Path) -> None:
    root_dir = mkdir(base / "root")
    alice_dir = mkdir(base / "alice", 0o700, ALICE)
    assert rule_of(root_dir / "t_1.json", Writer(0)) == ""
    assert rule_of(root_dir / "t_1.json", Writer(None)) == ""  # unknown owner: root's only
    assert rule_of(alice_dir / "t_1.json", Writer(ALICE)) == ""


def test_a_directory_of_another_user_is_refused(base: Path) -> None:
    """The issue's attack: a root trainer writing into a directory a user controls."""
    user_dir = mkdir(base / "mallory", 0o755, MALLORY)
    with pytest.raises(PermissionDenied) as info:
        checker().check(str(user_dir / "t_1.json"), Writer(0, 0))
    assert info.value.rule == "unsafe_directory"
    assert f"belongs to uid {MALLORY}" in str(info.value)
    # Nor may alice's trainer write there, nor under it.
    deeper = mkdir(user_dir / "sub", 0o755, ALICE)
    assert rule_of(user_dir / "t_1.json", Writer(ALICE)) == "unsafe_directory"
    assert rule_of(deeper / "t_1.json", Writer(ALICE)) == "unsafe_directory"


def test_writable_by_others_without_sticky_bit_is_refused(base: Path) -> None:
    for mode in (0o775, 0o757, 0o777):
        d = base / f"m{mode:o}"
        mkdir(d, mode)
        assert rule_of(d / "t.json", Writer(0)) == "unsafe_directory", oct(mode)


def test_shared_sticky_directory_needs_the_kernel_protections(base: Path) -> None:
    shared = mkdir(base / "shared", 0o1777)
    assert rule_of(shared / "t.json", Writer(0), checker(PROTECTED)) == ""
    with pytest.raises(PermissionDenied) as info:
        checker(UNPROTECTED).check(str(shared / "t.json"), Writer(0))
    assert info.value.rule == "shared_directory_unprotected"
    assert "fs.protected_symlinks = 0" in str(info.value)
    assert "sysctl fs.protected_symlinks=1" in str(info.value)
    # A private directory inside the shared one is fine: nobody else can move it.
    inner = mkdir(shared / "mine", 0o700, ALICE)
    assert rule_of(inner / "t.json", Writer(ALICE), checker(UNPROTECTED)) == ""


def test_links_on_the_way_must_belong_to_root_or_the_writer(base: Path) -> None:
    real = mkdir(base / "real")
    good = base / "good"
    good.symlink_to(real)
    assert rule_of(good / "t.json", Writer(0)) == ""
    bad = base / "bad"
    bad.symlink_to(real)
    os.lchown(bad, MALLORY, MALLORY)
    with pytest.raises(PermissionDenied) as info:
        checker().check(str(bad / "t.json"), Writer(0))
    assert info.value.rule == "unsafe_directory"
    assert "symbolic link owned by uid 51002" in str(info.value)
    # A link to a directory of another user is refused at its target.
    theirs = mkdir(base / "theirs", 0o755, MALLORY)
    (base / "to_theirs").symlink_to(theirs)
    assert rule_of(base / "to_theirs" / "t.json", Writer(0)) == "unsafe_directory"
    relative = base / "rel"
    relative.symlink_to("real/../real")
    assert rule_of(relative / "t.json", Writer(0)) == ""


def test_existing_final_or_tmp_name_is_refused(base: Path) -> None:
    d = mkdir(base / "d")
    (d / "t_7.json").write_text("old trace")
    with pytest.raises(InvalidArgument) as info:
        checker().check(str(d / "t_7.json"), Writer(0))
    assert info.value.rule == "would_overwrite"
    victim = base / "victim"
    victim.write_text("precious")
    (d / "u_7.json.tmp").symlink_to(victim)  # the planted link
    with pytest.raises(InvalidArgument) as info:
        checker().check(str(d / "u_7.json"), Writer(0))
    assert info.value.rule == "tmp_exists"
    assert victim.read_text() == "precious"


def test_only_the_tmp_the_writers_dropped_config_left_may_stay(base: Path) -> None:
    """A config handed out again after Kineto dropped it may find the .tmp Kineto left: that
    file (same inode and mtime, still the writer's regular file) passes, nothing else."""
    d = mkdir(base / "d", 0o755, ALICE)
    tmp = d / "t_7.json.tmp"
    tmp.write_text("")
    os.lchown(tmp, ALICE, ALICE)
    left = (tmp.stat().st_ino, tmp.stat().st_mtime_ns)
    path, alice = str(d / "t_7.json"), Writer(ALICE)
    checker().check(path, alice, own_tmp=left)
    with pytest.raises(InvalidArgument) as info:
        checker().check(path, alice)  # not known as left by its dropped config
    assert info.value.rule == "tmp_exists"
    with pytest.raises(InvalidArgument):
        checker().check(path, alice, own_tmp=(left[0], left[1] + 1))  # written since
    os.lchown(tmp, MALLORY, MALLORY)
    with pytest.raises(InvalidArgument):
        checker().check(path, alice, own_tmp=left)  # no longer the writer's
    tmp.unlink()
    victim = base / "victim"
    victim.write_text("precious")
    tmp.symlink_to(victim)
    os.lchown(tmp, ALICE, ALICE)
    link = os.lstat(tmp)
    with pytest.raises(InvalidArgument):
        checker().check(path, alice, own_tmp=(link.st_ino, link.st_mtime_ns))  # a link
    assert victim.read_text() == "precious"


def test_the_writer_must_be_able_to_create_the_file(base: Path) -> None:
    root_only = mkdir(base / "rootonly", 0o755)
    # Alice's trainer (its groups read from /proc: this test process stands in for it).
    writer = Writer(ALICE, os.getpid())
    with pytest.raises(PermissionDenied) as info:
        checker().check(str(root_only / "t.json"), writer)
    assert info.value.rule == "directory_not_writable"
    own = mkdir(base / "own", 0o500, ALICE)
    assert rule_of(own / "t.json", writer) == "directory_not_writable"
    os.chmod(own, 0o700)
    assert rule_of(own / "t.json", writer) == ""


def test_missing_directory_is_refused(base: Path) -> None:
    assert rule_of(base / "nope" / "t.json", Writer(0)) == "missing_directory"


@pytest.mark.root
def test_a_writer_in_its_own_mount_namespace_is_checked_in_its_file_system(base: Path) -> None:
    """A container's trainer: its directory exists only in its mount namespace (a tmpfs
    mounted there), and the checker and `mount_root` reach it through /proc/<pid>/root."""
    inside = base / "only-in-the-namespace"
    inside.mkdir(mode=0o755)
    # The process mounts a tmpfs over the directory in a mount namespace of its own, makes
    # traces/ in it, says so, and waits.
    child = subprocess.Popen(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs none {inside} && mkdir -m 700 {inside}/traces && echo ready && "
         "exec sleep 60"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        root = mount_root(child.pid)
        assert root == f"/proc/{child.pid}/root"
        assert mount_root(os.getpid()) == "" and mount_root(0) == ""
        target = inside / "traces" / "t.json"
        assert not target.parent.exists()  # not in this agent's file system
        assert rule_of(target, Writer(0, child.pid)) == ""
        assert rule_of(target, Writer(0)) == "missing_directory"  # the agent's own view
        (Path(root + str(target))).write_text("{}")
        assert rule_of(target, Writer(0, child.pid)) == "would_overwrite"
    finally:
        child.kill()
        child.wait()
