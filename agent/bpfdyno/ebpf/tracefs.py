"""Where tracefs is: the one lookup shared by the BPF loader and `bpfdyno doctor`.

bcc reads tracepoint ids and formats from tracefs, so the loader mounts it when it is missing
(`ensure_tracefs`); `bpfdyno doctor` only looks (`find_tracefs`), since a diagnosis must not
change the machine. Nothing here imports bcc.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from pathlib import Path

from bpfdyno.ebpf.errors import BpfLoadError

#: Where the kernel expects tracefs (since Linux 4.1).
TRACEFS_MOUNTPOINT = Path("/sys/kernel/tracing")
#: The command that mounts it there; error messages and doctor suggest it.
MOUNT_COMMAND = f"mount -t tracefs nodev {TRACEFS_MOUNTPOINT}"


class TracefsError(BpfLoadError):
    """tracefs is not mounted and mounting it failed; says how to mount it."""


def find_tracefs(mounts: Path = Path("/proc/mounts")) -> Path | None:
    """Where tracefs is reachable now; mounts nothing.

    Prefers the standard mount point, then any other tracefs mount, then the ``tracing``
    directory of a mounted debugfs (where older kernels expose it).

    Args:
        mounts: the mount table to read.

    Returns:
        The tracefs root (it holds ``events/``), or None when tracefs is not mounted.
    """
    tracefs: list[Path] = []
    debugfs: list[Path] = []
    with contextlib.suppress(OSError):
        for line in mounts.read_text().splitlines():
            fields = line.split()
            if len(fields) < 3:
                continue
            if fields[2] == "tracefs":
                tracefs.append(Path(fields[1]))
            elif fields[2] == "debugfs":
                debugfs.append(Path(fields[1]))
    if TRACEFS_MOUNTPOINT in tracefs:
        return TRACEFS_MOUNTPOINT
    if tracefs:
        return tracefs[0]
    for root in debugfs:
        if (root / "tracing" / "events").is_dir():
            return root / "tracing"
    return None


def ensure_tracefs() -> Path:
    """Find tracefs, mounting it at `TRACEFS_MOUNTPOINT` when it is not mounted.

    Returns:
        The tracefs root.

    Raises:
        TracefsError: tracefs is not mounted and mounting it failed.
    """
    found = find_tracefs()
    if found is not None:
        return found
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    target = str(TRACEFS_MOUNTPOINT).encode()
    if libc.mount(b"nodev", target, b"tracefs", 0, None) != 0:
        err = ctypes.get_errno()
        raise TracefsError(
            f"tracefs is not mounted and mounting it at {TRACEFS_MOUNTPOINT} failed "
            f"({os.strerror(err)}); run as root or mount it: {MOUNT_COMMAND}"
        )
    return TRACEFS_MOUNTPOINT


def read_format(tracefs: Path, tracepoint: str) -> str | None:
    """The ``format`` file of ``category:event``; None if the kernel has no such event."""
    category, _, event = tracepoint.partition(":")
    try:
        return (tracefs / "events" / category / event / "format").read_text()
    except OSError:
        return None
