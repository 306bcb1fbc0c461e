"""A containerized process's paths resolved inside its own root: its absolute links never
lead to the host's files (found by reading the code: ``/proc/<pid>/root`` + path followed a
container's ``/out -> /etc`` to the host's ``/etc``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from bpfdyno.core.rootfs import open_in_root, within_root


@pytest.fixture
def container(tmp_path: Path) -> tuple[Path, Path]:
    """(a container's root whose /out links to the absolute path of a host directory, that
    host directory holding a secret)."""
    host = tmp_path / "host-only"
    host.mkdir()
    (host / "t.json").write_text("HOST SECRET")
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(str(host), root / "out")  # absolute: means the container's own /…/host-only
    inside = root / str(host).lstrip("/")
    inside.mkdir(parents=True)
    (inside / "t.json").write_text("the container's own")
    return root, host


def read(fd: int) -> str:
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def test_the_kernels_own_lookup_leaves_the_root(container: tuple[Path, Path]) -> None:
    root, _ = container
    # What the agent did: the link resolves from the agent's root, the host's.
    assert Path(f"{root}/out/t.json").read_text() == "HOST SECRET"


def test_links_resolve_inside_the_root(container: tuple[Path, Path], tmp_path: Path) -> None:
    root, host = container
    assert read(open_in_root(str(root), "/out/t.json", os.O_RDONLY)) == "the container's own"
    # ".." cannot climb out either: it stops at the root, as at "/".
    up = "/".join([".."] * 10) + str(host) + "/t.json"
    assert read(open_in_root(str(root), up, os.O_RDONLY)) == "the container's own"
    os.unlink(root / str(host).lstrip("/") / "t.json")
    with pytest.raises(OSError) as e:
        open_in_root(str(root), "/out/t.json", os.O_RDONLY)
    assert e.value.errno == errno.ENOENT  # not the host's file


def test_within_root_yields_a_path_held_inside(container: tuple[Path, Path]) -> None:
    root, host = container
    local, path = f"{root}/out/t.json", "/out/t.json"
    with within_root(local, path) as safe:
        assert safe.startswith("/proc/self/fd/") and safe.endswith("/t.json")
        assert Path(safe).read_text() == "the container's own"
        Path(safe + ".new").write_text("written inside")  # files next to it stay inside too
    assert (root / str(host).lstrip("/") / "t.json.new").read_text() == "written inside"
    assert not (host / "t.json.new").exists()
    # In the agent's own mount namespace the path is used as it is.
    with within_root(str(host / "t.json"), str(host / "t.json")) as same:
        assert same == str(host / "t.json")
