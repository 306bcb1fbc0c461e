"""A process in a memory cgroup of its own, limited below its working set (a Kubernetes
memory limit): cgroup v1's ``memory.limit_in_bytes`` or v2's ``memory.high``."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def memory_limited(name: str, pid: int, limit_bytes: int) -> Iterator[Path]:
    """Process ``pid`` in a new memory cgroup ``bds<test pid>-<name>`` limited to
    ``limit_bytes`` for the block; back in the root after, the cgroup removed."""
    root = Path("/sys/fs/cgroup/memory")
    v2 = not (root / "memory.limit_in_bytes").exists()
    if v2:
        root = Path("/sys/fs/cgroup")
    d = root / f"bds{os.getpid()}-{name}"
    d.mkdir()
    try:
        (d / ("memory.high" if v2 else "memory.limit_in_bytes")).write_text(str(limit_bytes))
        (d / "cgroup.procs").write_text(str(pid))
        yield d
    finally:
        with contextlib.suppress(OSError):
            (root / "cgroup.procs").write_text(str(pid))
        for _ in range(50):  # its charges leave with it, not at once
            try:
                d.rmdir()
                break
            except OSError:
                time.sleep(0.1)
