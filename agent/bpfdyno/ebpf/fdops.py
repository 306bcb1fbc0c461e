"""The BPF work the daemon does on file descriptors alone: load, attach, read maps.

The compile helper (`bpfdyno.ebpf.compilehelper`) hands over each function's instructions and
each map's fd; everything after that is a few system calls, done here through ctypes:
``bpf(2)`` (load a program, open a raw tracepoint, map lookups, batches), and
``perf_event_open(2)`` with ``PERF_EVENT_IOC_SET_BPF`` for tracepoints and uprobes.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import struct
from pathlib import Path

from bpfdyno.ebpf.btfprog import bpf

#: enum bpf_cmd values used here.
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_PROG_LOAD = 5
BPF_RAW_TRACEPOINT_OPEN = 17
BPF_MAP_LOOKUP_BATCH = 24
BPF_MAP_LOOKUP_AND_DELETE_BATCH = 25
#: enum bpf_prog_type values of the programs bpfdyno loads.
PROG_KPROBE = 2
PROG_TRACEPOINT = 5
PROG_RAW_TRACEPOINT = 17
PROG_TRACING = 26
#: enum bpf_map_type values whose values come one per possible CPU.
PERCPU_MAP_TYPES = frozenset({5, 6, 10})  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
MAP_TYPE_RINGBUF = 27

_ATTR_SIZE = 144
_LOG_SIZE = 1 << 20
_NR_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_TRACEPOINT = 2
_PERF_FLAG_FD_CLOEXEC = 8
_PERF_ATTR_SIZE = 112
_PERF_EVENT_IOC_ENABLE = 0x2400
_PERF_EVENT_IOC_SET_BPF = 0x40042408

_libc = ctypes.CDLL(None, use_errno=True)


def _attr() -> ctypes.Array[ctypes.c_uint8]:
    return (ctypes.c_uint8 * _ATTR_SIZE)()


def load_program(
    insns: bytes,
    prog_type: int,
    name: str,
    license_: bytes,
    *,
    kern_version: int = 0,
    expected_attach_type: int = 0,
    attach_btf_id: int = 0,
) -> tuple[int, str]:
    """Load instructions as a program of ``prog_type``.

    Returns:
        (the program fd, "") or (-1, the errno's text and the end of the verifier's log).
    """
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license_)

    def attempt(log: ctypes.Array[ctypes.c_char] | None) -> int:
        attr = _attr()
        struct.pack_into(
            "<IIQQIIQII16sIIIIQIIQII",
            attr,
            0,
            prog_type,
            len(insns) // 8,
            ctypes.addressof(code),
            ctypes.addressof(lic),
            1 if log is not None else 0,
            len(log) if log is not None else 0,
            ctypes.addressof(log) if log is not None else 0,
            kern_version,
            0,  # prog_flags
            name.encode()[:15],
            0,  # prog_ifindex
            expected_attach_type,
            0,  # prog_btf_fd
            0,
            0,
            0,
            0,
            0,
            0,
            attach_btf_id,
        )
        return bpf(BPF_PROG_LOAD, attr)

    try:
        return attempt(None), ""
    except OSError as first:
        log = ctypes.create_string_buffer(_LOG_SIZE)
        try:
            return attempt(log), ""  # loaded after all (a transient failure): keep it
        except OSError:
            pass
        tail = " ".join(log.value.decode("utf-8", "replace").split()[-40:])
        return -1, f"{first.strerror}; verifier: {tail}"


def relocate_maps(insns: bytes, fds: dict[int, int]) -> bytes:
    """``insns`` with every map reference's fd (the helper's numbers) replaced by ours.

    Map references are ``BPF_LD_IMM64`` instructions whose source register is
    ``BPF_PSEUDO_MAP_FD`` (1) or ``BPF_PSEUDO_MAP_VALUE`` (2), the fd in their immediate.

    Raises:
        ValueError: an instruction refers to an fd that is not one of the maps.
    """
    out = bytearray(insns)
    i = 0
    while i + 8 <= len(out):
        code, regs = out[i], out[i + 1]
        if code == 0x18:  # BPF_LD | BPF_DW | BPF_IMM: two slots
            if (regs >> 4) in (1, 2):
                (theirs,) = struct.unpack_from("<i", out, i + 4)
                if theirs not in fds:
                    raise ValueError(f"instruction {i // 8} refers to unknown map fd {theirs}")
                struct.pack_into("<i", out, i + 4, fds[theirs])
            i += 16
        else:
            i += 8
    return bytes(out)


def open_raw_tracepoint(name: str, prog_fd: int) -> int:
    """Attach a raw tracepoint program; returns the fd whose close detaches it."""
    tp = ctypes.create_string_buffer(name.encode())
    attr = _attr()
    struct.pack_into("<QI", attr, 0, ctypes.addressof(tp), prog_fd)
    return bpf(BPF_RAW_TRACEPOINT_OPEN, attr)


def perf_event_open(
    ptype: int, config: int, *, pid: int = -1, config1: int = 0, config2: int = 0
) -> int:
    """``perf_event_open(2)`` of a probe event that runs a BPF program (any CPU).

    Raises:
        OSError: with the kernel's errno.
    """
    nr = _NR_PERF_EVENT_OPEN.get(platform.machine())
    if nr is None:
        raise OSError(errno.ENOSYS, f"perf_event_open number unknown on {platform.machine()}")
    attr = (ctypes.c_uint8 * _PERF_ATTR_SIZE)()
    # type, size, config, sample_period; the flags word (64) stays 0: enabled at once.
    struct.pack_into("<IIQQ", attr, 0, ptype, _PERF_ATTR_SIZE, config, 1)
    struct.pack_into("<I", attr, 48, 1)  # wakeup_events
    struct.pack_into("<QQ", attr, 56, config1, config2)
    # A probe's BPF program runs on every CPU; perf wants a CPU when no process is named.
    cpu = 0 if pid == -1 else -1
    fd = int(_libc.syscall(nr, ctypes.byref(attr), pid, cpu, -1, _PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return fd


def set_bpf(perf_fd: int, prog_fd: int) -> int:
    """Run ``prog_fd`` on every hit of the perf event ``perf_fd`` (close detaches); returns
    ``perf_fd``, which is closed when the kernel refuses.

    Raises:
        OSError: the kernel refused.
    """
    try:
        fcntl.ioctl(perf_fd, _PERF_EVENT_IOC_SET_BPF, prog_fd)
        fcntl.ioctl(perf_fd, _PERF_EVENT_IOC_ENABLE, 0)
    except BaseException:
        os.close(perf_fd)
        raise
    return perf_fd


def tracepoint_id(tracefs: Path, tracepoint: str) -> int:
    """The id of tracepoint ``category:event`` in tracefs.

    Raises:
        OSError: no such tracepoint (or tracefs is not there).
    """
    category, _, event = tracepoint.partition(":")
    return int((tracefs / "events" / category / event / "id").read_text())


def map_op(cmd: int, map_fd: int, key: int, value: int = 0, flags: int = 0) -> int:
    """One key's ``bpf(2)`` map command (addresses of the key and value buffers).

    Returns:
        0, or the errno when the kernel refused (ENOENT: no such key).
    """
    attr = _attr()
    struct.pack_into("<IIQQQ", attr, 0, map_fd, 0, key, value, flags)
    try:
        bpf(cmd, attr)
    except OSError as e:
        return e.errno or errno.EIO
    return 0


def map_batch(
    cmd: int, map_fd: int, cursor: int, cursor_out: int, keys: int, values: int, count: int
) -> tuple[int, int]:
    """One ``BPF_MAP_LOOKUP(_AND_DELETE)_BATCH`` (addresses of the cursors and buffers;
    ``cursor`` 0 starts at the beginning).

    Returns:
        (entries filled, 0 or the errno: ENOENT after the last entry).
    """
    attr = _attr()
    struct.pack_into("<QQQQII", attr, 0, cursor, cursor_out, keys, values, count, map_fd)
    try:
        bpf(cmd, attr)
        err = 0
    except OSError as e:
        err = e.errno or errno.EIO
    (filled,) = struct.unpack_from("<I", attr, 32)
    return filled, err


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """How many CPUs this machine could ever have: the length of a per-CPU map's value."""
    with open(path, encoding="ascii") as f:
        text = f.read().strip()
    top = 0
    for part in text.split(","):
        top = max(top, int(part.split("-")[-1]))
    return top + 1
