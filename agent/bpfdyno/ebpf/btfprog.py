"""BTF-typed BPF programs (``tp_btf`` tracepoints, task iterators) from bcc-compiled code.

bcc compiles these programs fine but cannot load them under their own names: it derives the
attach target from a function-name prefix (``bpf_iter__task``, ...) and loads the program
under what follows the prefix, and it has no ``tp_btf`` attach at all. BTF-typed programs
are what make a scheduler probe cheap: their arguments are trusted kernel pointers read with
plain loads instead of ``bpf_probe_read_kernel`` calls, and they may use task-local storage.

So this module takes a function's instructions from the compile helper (its maps are
already created and referenced, `bpfdyno.ebpf.compiled`) and does the few ``bpf(2)``
commands itself: load it as ``BPF_PROG_TYPE_TRACING`` with the attach type and the BTF id
of its target (looked up in the kernel's BTF with libbpf), attach a tracepoint, or link an
iterator and read it. Needs Linux >= 5.5 (tp_btf), 5.8 (iterators) and a kernel with BTF.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from bpfdyno.ebpf.errors import BpfLoadError

#: enum bpf_cmd values used here.
BPF_RAW_TRACEPOINT_OPEN = 17
BPF_LINK_CREATE = 28
BPF_ITER_CREATE = 33
#: enum bpf_attach_type values of the BTF-typed programs.
BPF_TRACE_RAW_TP = 23
BPF_TRACE_ITER = 28

_NR_BPF = {"x86_64": 321, "aarch64": 280}
#: sizeof(union bpf_attr) we pass: larger than any command's part, zero-filled.
_ATTR_SIZE = 144

_libc: ctypes.CDLL | None = None
_libbpf: ctypes.CDLL | None = None


def bpf(cmd: int, attr: ctypes.Array[ctypes.c_uint8]) -> int:
    """The ``bpf(2)`` system call.

    Returns:
        Its non-negative result (usually a new fd).

    Raises:
        OSError: with the kernel's errno.
    """
    global _libc
    nr = _NR_BPF.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf syscall number unknown on {platform.machine()}")
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    ret = int(_libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def vmlinux_btf_id(name: str, attach_type: int) -> int:
    """The kernel BTF id of a tracepoint (``btf_trace_<name>``) or an iterator target.

    Raises:
        BpfLoadError: libbpf is missing, the kernel has no BTF, or has no such target.
    """
    global _libbpf
    if _libbpf is None:
        try:
            lib = ctypes.CDLL("libbpf.so.1")
        except OSError as e:
            raise BpfLoadError(
                f"libbpf.so.1 is not loadable ({e}); install libbpf1 (it comes with "
                "python3-bpfcc on Debian/Ubuntu)"
            ) from e
        lib.libbpf_find_vmlinux_btf_id.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.libbpf_find_vmlinux_btf_id.restype = ctypes.c_int
        _libbpf = lib
    btf_id = int(_libbpf.libbpf_find_vmlinux_btf_id(name.encode(), attach_type))
    if btf_id < 0:
        raise BpfLoadError(
            f"{name!r} is not in the kernel's BTF ({os.strerror(-btf_id)}); BTF-typed "
            "programs need a kernel with /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF) "
            "and that tracepoint or iterator"
        )
    return btf_id


def load_tracing(insns: bytes, license_: bytes, fn: str, attach_type: int, target: str) -> int:
    """Load the instructions of function ``fn`` as a BTF-typed program named ``fn``.

    Args:
        insns: the function's instructions, its map references already this process's fds.
        license_: the program's license string.
        fn: the function, also the kernel's name for the program (15 characters kept).
        attach_type: `BPF_TRACE_RAW_TP` or `BPF_TRACE_ITER`.
        target: the tracepoint (``sched_switch``) or iterator (``task``) it is for.

    Returns:
        The program fd (the caller closes it).

    Raises:
        BpfLoadError: no BTF, or the verifier refused it (with its log).
    """
    from bpfdyno.ebpf.fdops import PROG_TRACING, load_program

    btf_id = vmlinux_btf_id(target, attach_type)
    fd, why = load_program(
        insns,
        PROG_TRACING,
        fn,
        license_,
        expected_attach_type=attach_type,
        attach_btf_id=btf_id,
    )
    if fd < 0:
        raise BpfLoadError(
            f"the kernel refused {fn} as a BTF-typed program for {target} ({why}); "
            "it needs Linux >= 5.11 with BTF"
        )
    return fd


def attach_tracepoint(prog_fd: int) -> int:
    """Attach a loaded tp_btf program to its tracepoint; returns the link fd (close detaches)."""
    attr = (ctypes.c_uint8 * _ATTR_SIZE)()
    struct.pack_into("<QI", attr, 0, 0, prog_fd)  # name NULL: the BTF id says which
    return bpf(BPF_RAW_TRACEPOINT_OPEN, attr)


def link_iterator(prog_fd: int) -> int:
    """Create the link of a loaded iterator program; returns the link fd."""
    attr = (ctypes.c_uint8 * _ATTR_SIZE)()
    struct.pack_into("<III", attr, 0, prog_fd, 0, BPF_TRACE_ITER)
    return bpf(BPF_LINK_CREATE, attr)


def read_iterator(link_fd: int, chunk: int = 1 << 16) -> bytes:
    """Run an iterator once and return everything its program wrote.

    Raises:
        OSError: the kernel failed to create or run it.
    """
    attr = (ctypes.c_uint8 * _ATTR_SIZE)()
    struct.pack_into("<II", attr, 0, link_fd, 0)
    fd = bpf(BPF_ITER_CREATE, attr)
    try:
        parts: list[bytes] = []
        while True:
            data = os.read(fd, chunk)
            if not data:
                return b"".join(parts)
            parts.append(data)
    finally:
        os.close(fd)
