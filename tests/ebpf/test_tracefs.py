"""Finding tracefs from a mount table: the lookup the loader and `bpfdyno doctor` share."""

from __future__ import annotations

from pathlib import Path

from bpfdyno.ebpf.tracefs import TRACEFS_MOUNTPOINT, find_tracefs


def mounts(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "mounts"
    p.write_text("".join(f"{line}\n" for line in lines))
    return p


def test_the_standard_mount_point_wins(tmp_path: Path) -> None:
    table = mounts(
        tmp_path,
        "proc /proc proc rw 0 0",
        "tracefs /sys/kernel/debug/tracing tracefs rw 0 0",
        f"nodev {TRACEFS_MOUNTPOINT} tracefs rw 0 0",
    )
    assert find_tracefs(table) == TRACEFS_MOUNTPOINT


def test_any_tracefs_mount_before_debugfs(tmp_path: Path) -> None:
    (tmp_path / "dbg" / "tracing" / "events").mkdir(parents=True)
    table = mounts(
        tmp_path, f"debugfs {tmp_path}/dbg debugfs rw 0 0", "nodev /mnt/trace tracefs rw 0 0"
    )
    assert find_tracefs(table) == Path("/mnt/trace")


def test_the_tracing_directory_of_debugfs(tmp_path: Path) -> None:
    (tmp_path / "dbg" / "tracing" / "events").mkdir(parents=True)
    table = mounts(tmp_path, f"debugfs {tmp_path}/dbg debugfs rw 0 0")
    assert find_tracefs(table) == tmp_path / "dbg" / "tracing"


def test_not_mounted(tmp_path: Path) -> None:
    (tmp_path / "dbg").mkdir()  # debugfs without a tracing directory
    assert find_tracefs(mounts(tmp_path, f"debugfs {tmp_path}/dbg debugfs rw 0 0")) is None
    assert find_tracefs(mounts(tmp_path, "proc /proc proc rw 0 0")) is None
    assert find_tracefs(tmp_path / "missing") is None
