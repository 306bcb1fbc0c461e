"""Paths a process in another mount namespace names, resolved inside its own root.

The agent reaches a containerized process's files through ``/proc/<pid>/root``. The kernel
follows an absolute symbolic link met on the way from the *agent's* root, not the
process's: a container's ``/workspace/out -> /etc`` would lead the agent to the host's
``/etc``. ``openat2(2)`` with ``RESOLVE_IN_ROOT`` resolves every component, links
included, as if the directory given were ``/``, so a path stays inside the process's file
system whatever its links say (kernel 5.6 and later).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
from collections.abc import Iterator

#: ``openat2(2)``'s number: the same in every architecture's table (new system calls are).
_SYS_OPENAT2 = 437
#: Links resolve against the directory given, never leaving it.
RESOLVE_IN_ROOT = 0x10
#: ``/proc/<pid>/fd``-style links are not followed.
RESOLVE_NO_MAGICLINKS = 0x02


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def open_in_root(root: str, path: str, flags: int, mode: int = 0) -> int:
    """Open ``path`` as the process whose root is ``root`` sees it: every link resolved
    inside ``root``. Returns the descriptor.

    Raises:
        OSError: as open(2) would (ENOSYS on kernels without openat2).
    """
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_at_root(root_fd, path, flags, mode)
    finally:
        os.close(root_fd)


def open_at_root(root_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """`open_in_root` with the root given as an open directory."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = int(
        libc.syscall(
            ctypes.c_long(_SYS_OPENAT2),
            ctypes.c_int(root_fd),
            os.fsencode(path),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
    )
    if fd < 0:
        err = ctypes.get_errno() or errno.EIO
        raise OSError(err, os.strerror(err), path)
    return fd


@contextlib.contextmanager
def within_root(local: str, path: str) -> Iterator[str]:
    """A path to use for ``path`` of a process that the agent reaches as ``local``
    (``/proc/<pid>/root`` + ``path``, see `bpfdyno.tracing.safety.mount_root`).

    In the agent's own mount namespace (``local == path``) that is ``path`` itself.
    Otherwise the directory holding the file is resolved inside the process's root and the
    path yielded goes through that open directory (``/proc/self/fd/<n>/<name>``), so
    whatever opens it by name next (with its own checks of the last component) cannot be
    led out of the process's file system. Valid inside the block only.

    Raises:
        OSError: the directory cannot be resolved (missing, not a directory, or a
            kernel without openat2).
    """
    if local == path or not local.endswith(path):
        yield local
        return
    root = local[: len(local) - len(path)] or "/"
    directory, name = os.path.split(path)
    fd = open_in_root(root, directory or "/", os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)
