"""Looking for Kineto's on-demand rule in a trainer's libraries: a user's file is read in
bounded chunks (never mapped) and what one user's files cost is bounded."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from bpfdyno.core.identity import Principals
from bpfdyno.tracing.kineto_build import RULE_MARKER, ScanAllowance, holds


def test_the_marker_is_found_across_every_chunk_boundary(tmp_path: Path) -> None:
    path = tmp_path / "lib.so"
    for at in range(0, 64 - len(RULE_MARKER) + 1):
        data = bytearray(64)
        data[at : at + len(RULE_MARKER)] = RULE_MARKER
        path.write_bytes(bytes(data))
        fd = os.open(path, os.O_RDONLY)
        try:
            assert holds(fd, 64, RULE_MARKER, chunk=16), at
            # Only the first ``size`` bytes are searched.
            assert holds(fd, at + len(RULE_MARKER) - 1, RULE_MARKER, chunk=16) is False, at
        finally:
            os.close(fd)
    path.write_bytes(RULE_MARKER[:-1] + b"x" + bytes(100))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert holds(fd, 126, RULE_MARKER, chunk=16) is False
    finally:
        os.close(fd)


def test_a_file_truncated_under_the_search_ends_it(tmp_path: Path) -> None:
    """The owner truncates the file during the search: the reads come back short and the
    search ends with "not found" (a mapped file would have killed the process: SIGBUS)."""
    path = tmp_path / "lib.so"
    size = 64 << 20
    with open(path, "wb") as f:
        f.truncate(size)
    fd = os.open(path, os.O_RDONLY)
    stop = threading.Event()

    def shrink() -> None:
        while not stop.is_set():
            os.truncate(path, 0)
            os.truncate(path, size)

    t = threading.Thread(target=shrink)
    t.start()
    try:
        for _ in range(20):
            assert holds(fd, size, RULE_MARKER, chunk=1 << 20) is False
    finally:
        stop.set()
        t.join()
        os.close(fd)
    os.truncate(path, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert holds(fd, size, RULE_MARKER) is False  # size from an earlier fstat
    finally:
        os.close(fd)


def test_each_user_has_its_own_allowance_subordinate_uids_counted_as_theirs(
    tmp_path: Path,
) -> None:
    subuid = tmp_path / "subuid"
    subuid.write_text("1000:100000:65536\n")
    now = [0.0]
    allowance = ScanAllowance(100, 60.0, Principals(subuid), clock=lambda: now[0])
    assert allowance.take(1000, 60)
    assert allowance.take(100_001, 40)  # her container's uid: hers
    assert not allowance.take(100_002, 1)
    assert not allowance.take(1000, 1)
    assert allowance.take(1001, 100)  # another user is not affected
    assert allowance.refused == {1000: 2}
    now[0] = 60.0  # the window turns
    assert allowance.take(165_535, 100)
    assert not allowance.take(1000, 1)
