"""Who may change the generated kernel headers: the agent (or root) alone, whatever the umask.

Found: under the packaged unit's UMask=0007 the cache was 0770 group bpfdyno, and the docs
told sites to add users to that group for socket access; a member swapped the tree and the
agent's next compile included her header in programs loaded with CAP_BPF/CAP_SYS_ADMIN.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from bpfdyno.ebpf.kheaders import (
    DIR_MODE,
    FILE_MODE,
    KernelHeadersError,
    KernelSources,
    ensure_headers,
    tree_problem,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracing"))
from local_user import local_user

pytestmark = pytest.mark.root

EVIL = "#error planted\n"


@pytest.fixture
def kernel(tmp_path: Path) -> KernelSources:
    cfg = tmp_path / "config"
    cfg.write_text("CONFIG_BPF_SYSCALL=y\nCONFIG_HZ=250\n")
    return replace(KernelSources(), release="6.18.0-modes", config=cfg)


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(top: Path) -> set[tuple[str, int, int]]:
    """(kind, owner, mode) of every entry under ``top`` (``top`` included)."""
    out = set()
    for path in (top, *top.rglob("*")):
        st = os.lstat(path)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "?"
        out.add((kind, st.st_uid, stat.S_IMODE(st.st_mode)))
    return out


@pytest.mark.parametrize("mask", [0o007, 0o000, 0o077])
def test_every_entry_has_its_mode_whatever_the_umask(
    tmp_path: Path, kernel: KernelSources, mask: int
) -> None:
    cache = tmp_path / "cache" / "kheaders"
    with umask(mask):
        tree = ensure_headers("minimal", cache, kernel=kernel)
    assert modes(tmp_path / "cache") == {("dir", 0, DIR_MODE), ("file", 0, FILE_MODE)}
    assert tree_problem(tree.path) == ""


def test_a_tree_others_could_change_is_refused_and_made_anew(
    tmp_path: Path, kernel: KernelSources
) -> None:
    """A tree as an older version left it under UMask=0007 (group-writable), in which a
    member of the group replaced a header: refused, removed, generated anew."""
    cache = tmp_path / "cache"
    tree = ensure_headers("minimal", cache, kernel=kernel).path
    good = (tree / "include/linux/kconfig.h").read_text()
    os.chmod(tree / "include/linux", 0o770)
    (tree / "include/linux/kconfig.h").unlink()
    (tree / "include/linux/kconfig.h").write_text(EVIL)
    assert (
        tree_problem(tree)
        == f"{tree}/include/linux has mode 0770 (others than its owner may write)"
    )
    again = ensure_headers("minimal", cache, kernel=kernel).path
    assert again == tree
    assert (tree / "include/linux/kconfig.h").read_text() == good
    assert tree_problem(tree) == ""
    assert [p.name for p in tree.parent.iterdir()] == ["minimal"]  # nothing left aside


@pytest.mark.parametrize("how", ["link", "owner", "group-writable-file"])
def test_each_kind_of_swapped_tree_is_refused(
    tmp_path: Path, kernel: KernelSources, how: str
) -> None:
    cache = tmp_path / "cache"
    tree = ensure_headers("minimal", cache, kernel=kernel).path
    header = tree / "include/linux/kconfig.h"
    if how == "link":
        planted = tmp_path / "planted"
        (planted / "include/linux").mkdir(parents=True)
        (planted / "include/linux/kconfig.h").write_text(EVIL)
        (planted / ".bpfdyno-complete").write_text("x\n")
        os.rename(tree, tmp_path / "moved")
        os.symlink(planted, tree)
        expected = f"{tree} is a symbolic link"
    elif how == "owner":
        os.chown(header, 65534, 65534)
        header.write_text(EVIL)
        expected = f"{header} belongs to uid 65534"
    else:
        os.chmod(header, 0o664)
        header.write_text(EVIL)
        expected = f"{header} has mode 0664 (others than its owner may write)"
    assert tree_problem(tree) == expected
    again = ensure_headers("minimal", cache, kernel=kernel).path
    assert not again.is_symlink() and EVIL not in header.read_text()
    assert tree_problem(again) == ""


def test_a_cache_in_a_directory_others_may_change_is_refused(
    tmp_path: Path, kernel: KernelSources
) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # not sticky: anyone may rename what is inside
    with pytest.raises(KernelHeadersError) as e:
        ensure_headers("minimal", open_dir / "kheaders", kernel=kernel)
    assert str(e.value).startswith(
        f"the header cache {open_dir}/kheaders/6.18.0-modes-"
    ) and f"{open_dir} has mode 0777 (others than its owner may write)" in str(e.value)


_GENERATE = r"""
import json, sys
from dataclasses import replace
from pathlib import Path
from bpfdyno.ebpf.kheaders import KernelSources, ensure_headers
k = replace(KernelSources(), release="6.18.0-modes", config=Path(sys.argv[2]))
print(json.dumps(str(ensure_headers("minimal", Path(sys.argv[1]), kernel=k).path)))
"""


def test_a_member_of_the_agents_group_cannot_change_what_the_unit_generated(
    kernel: KernelSources,
) -> None:
    """The agent as the unit runs it (its own user, ambient capabilities, UMask=0007)
    generates the tree; a member of the agent's group tries to swap or edit it: refused by
    the kernel at each step."""
    base = Path(tempfile.mkdtemp(prefix="bdt-kh-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        with local_user() as agent, local_user() as member:
            group = grp.getgrgid(agent.gid).gr_name
            subprocess.run(["usermod", "-aG", group, member.name], check=True)
            cache = base / "cache"
            cache.mkdir()
            os.chown(cache, agent.uid, agent.gid)
            config = base / "config"
            config.write_bytes(kernel.config.read_bytes())
            os.chmod(config, 0o644)
            r = agent.run([sys.executable, "-c", _GENERATE, str(cache / "kheaders"),
                           str(config)], unit=True)  # fmt: skip
            assert r.returncode == 0, r.stderr
            tree = Path(json.loads(r.stdout))
            assert modes(cache / "kheaders") == {
                ("dir", agent.uid, DIR_MODE),
                ("file", agent.uid, FILE_MODE),
            }
            header = tree / "include/linux/kconfig.h"
            attempts = {
                "rename": f"mv {tree} {tree}.x",
                "edit": f"echo '{EVIL.strip()}' > {header}",
                "add": f"echo x > {tree}/include/linux/extra.h",
                "replace": f"rm -f {header}",
            }
            for what, cmd in attempts.items():
                r = member.run(["sh", "-c", cmd], groups=True)
                assert r.returncode != 0, what
                assert "Permission denied" in r.stderr, (what, r.stderr)
            assert EVIL.strip() not in header.read_text() and tree.is_dir()
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


_GENERATE_BY_DEFAULT = r"""
import json, sys
from dataclasses import replace
from pathlib import Path
from bpfdyno.ebpf import kheaders
kheaders.DEFAULT_CACHE_DIR = Path(sys.argv[1])
trees = {}
for release in sys.argv[3:]:
    k = replace(kheaders.KernelSources(), release=release, config=Path(sys.argv[2]))
    trees[release] = str(kheaders.ensure_headers("minimal", kernel=k).path)
print(json.dumps(trees))
"""


def test_an_agent_that_may_not_write_roots_cache_uses_its_trees_and_makes_others_its_own(
    kernel: KernelSources,
) -> None:
    """Found by CI: the agent as an ordinary user with the unit's capabilities, on a machine
    where root's agent had made the cache, could not compile the one program whose tree root
    had not generated yet ("Permission denied" in the cache): that collector was lost.
    Now root's trees are used as they are and a missing one goes into the user's cache."""
    base = Path(tempfile.mkdtemp(prefix="bdt-kh-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        with local_user() as agent:
            system = base / "kheaders"
            config = base / "config"
            config.write_bytes(kernel.config.read_bytes())
            os.chmod(config, 0o644)
            k_root = replace(kernel, release="6.18.0-made-by-root", config=config)
            k_other = replace(kernel, release="6.18.0-made-by-agent", config=config)
            roots = ensure_headers("minimal", system, kernel=k_root).path
            r = agent.run([sys.executable, "-c", _GENERATE_BY_DEFAULT, str(system), str(config),
                           k_root.release, k_other.release], unit=True)  # fmt: skip
            assert r.returncode == 0, r.stderr
            trees = {name: Path(p) for name, p in json.loads(r.stdout).items()}
            assert trees[k_root.release] == roots  # root's tree, read as it is
            own = agent.home / ".cache/bpfdyno/kheaders"
            assert trees[k_other.release].parent.parent == own
            assert trees[k_other.release].name == "minimal"
            assert (trees[k_other.release] / "include/linux/kconfig.h").is_file()
            assert modes(own) == {("dir", agent.uid, DIR_MODE), ("file", agent.uid, FILE_MODE)}
            # The system cache gained nothing and stays root's.
            assert sorted(p.name for p in system.iterdir()) == [roots.parent.name]
            assert {owner for _, owner, _ in modes(system)} == {0}
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_an_agent_that_may_write_neither_cache_says_what_to_do(kernel: KernelSources) -> None:
    base = Path(tempfile.mkdtemp(prefix="bdt-kh-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        with local_user() as agent:
            system = base / "kheaders"
            system.mkdir(mode=0o755)
            config = base / "config"
            config.write_bytes(kernel.config.read_bytes())
            os.chmod(config, 0o644)
            squatter = 65534
            squat = agent.home / f"bpfdyno-kheaders-{agent.uid}"
            squat.mkdir()
            os.chmod(squat, 0o777)  # the agent could write into it: refused all the same
            os.chown(squat, squatter, squatter)
            argv = [sys.executable, "-c", _GENERATE_BY_DEFAULT, str(system), str(config)]
            r = agent.run([*argv, kernel.release], unit=True, XDG_CACHE_HOME=str(base / "nope"))
            assert r.returncode != 0
            last = r.stderr.strip().splitlines()[-1]
            release_dir = f"{system}/6.18.0-modes-"
            assert last.startswith("bpfdyno.ebpf.kheaders.KernelHeadersError: no writable kernel"
                                   f" header cache: cannot create {release_dir}"), last  # fmt: skip
            assert f"(Permission denied); cannot create {base}/nope (Permission denied); " in last
            # Another user made the temporary directory's fallback first: refused.
            assert f"{squat} belongs to uid {squatter}" in last, last
            assert last.endswith("Run the agent as root or as the packaged unit (its "
                                 "CacheDirectory is its own), or give its user a writable home "
                                 "or XDG_CACHE_HOME"), last  # fmt: skip
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
