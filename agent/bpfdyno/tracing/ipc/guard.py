"""The kernel guard: only the agent and a trainer's own user may send to its Kineto socket.

libkineto takes its config from any datagram that reaches its socket (docs/security.md).
Abstract names — the default layout — have no permissions at all. On kernels with cgroup
hooks for Unix sockets (``BPF_CGROUP_UNIX_SENDMSG`` and ``_CONNECT``, Linux 6.7+), two
small programs on the root cgroup look at the destination of every ``sendto``/``sendmsg``
with an address and every ``connect`` on a Unix socket: when it is a registered trainer's
abstract name (a hash map the agent fills as trainers register: name -> owner uid), only
the trainer's own uid, root and the agent's uid pass; anyone else gets ``EPERM``.

Only abstract names are guarded: a name there is exactly the bytes the sender gives, so a
map lookup is exact. A path can be spelled many ways (relative to a working directory,
through links, through ``/proc/<pid>/root``), so the guard would be easy to go around; the
per-user directories protect paths with the kernel's own permission check (`user_dirs`).

bcc 0.26 cannot compile what these programs need (``bpf_cast_to_kern_ctx``, a kfunc, to
reach the address), so the instructions are written here and loaded with ``bpf(2)``; they
are attached through BPF links, which the kernel removes when the agent's fds close — a
killed agent leaves no guard behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import struct

from bpfdyno.ebpf.btfprog import bpf
from bpfdyno.ebpf.errors import BpfLoadError

log = logging.getLogger(__name__)

#: bpf(2) commands.
BPF_MAP_CREATE = 0
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_PROG_LOAD = 5
BPF_LINK_CREATE = 28
BPF_MAP_TYPE_HASH = 1
BPF_PROG_TYPE_CGROUP_SOCK_ADDR = 18
#: enum bpf_attach_type (Linux 6.7).
BPF_CGROUP_UNIX_CONNECT = 49
BPF_CGROUP_UNIX_SENDMSG = 50
BTF_KIND_FUNC = 12
#: Helpers.
_MAP_LOOKUP = 1
_GET_CURRENT_UID_GID = 15
_PROBE_READ_KERNEL = 113

#: Longest sun_path.
PATH_MAX = 108
#: The map's key: the name's length, then its bytes, zero-padded.
_KEY = struct.Struct(f"<I{PATH_MAX}s")
#: Trainers guarded at once (the registry holds 4096 by default).
MAX_ENTRIES = 65536
#: Where mounts are listed (to find the cgroup v2 hierarchy, whose root holds every process).
MOUNTS = "/proc/self/mounts"
_ATTR_SIZE = 144
_LOG_SIZE = 1 << 18


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


# Opcodes used below (classic BPF encoding).
_MOV64_X, _MOV64_K, _ADD64_K, _SUB64_K, _MOV32_X = 0xBF, 0xB7, 0x07, 0x17, 0xBC
_LDX_DW, _LDX_W, _STX_W, _ST_DW = 0x79, 0x61, 0x63, 0x7A
_JEQ_K, _JNE_K, _JEQ_X, _JLT_K, _JGT_K = 0x15, 0x55, 0x1D, 0xA5, 0x25
_CALL, _EXIT, _LD_IMM64 = 0x85, 0x95, 0x18
_PSEUDO_MAP_FD, _PSEUDO_KFUNC_CALL = 1, 2
_KEY_OFF = -_KEY.size  # the key on the stack: r10 - 112


def program(map_fd: int, cast_btf_id: int, agent_uid: int) -> bytes:
    """The guard's instructions (the same for both hooks).

    r6 = ctx; r0 = bpf_cast_to_kern_ctx(ctx): a ``struct bpf_sock_addr_kern`` whose
    ``uaddr`` (offset 8) is the destination and ``uaddrlen`` (offset 32) its length. Allow
    unless the name (family stripped) is in the map and the caller's uid is neither the
    trainer's, root's nor the agent's.
    """
    allow: list[int] = []  # indexes of jumps to patch to the "allow" exit
    code: list[bytes] = []

    def emit(b: bytes) -> int:
        code.append(b)
        return len(code) - 1

    emit(_insn(_MOV64_X, 6, 1))
    emit(_insn(_CALL, 0, _PSEUDO_KFUNC_CALL, 0, cast_btf_id))
    emit(_insn(_LDX_DW, 7, 0, 8))  # r7 = uaddr
    emit(_insn(_LDX_W, 8, 0, 32))  # r8 = uaddrlen
    for i in range(0, _KEY.size, 8):  # a zeroed key
        emit(_insn(_ST_DW, 10, 0, _KEY_OFF + i, 0))
    allow.append(emit(_insn(_JLT_K, 8, 0, 0, 3)))  # family and at least one byte
    allow.append(emit(_insn(_JGT_K, 8, 0, 0, 2 + PATH_MAX)))
    emit(_insn(_SUB64_K, 8, 0, 0, 2))  # r8 = length of sun_path in use, 1..108
    emit(_insn(_STX_W, 10, 8, _KEY_OFF))  # key.len
    emit(_insn(_MOV64_X, 1, 10))
    emit(_insn(_ADD64_K, 1, 0, 0, _KEY_OFF + 4))  # key.path
    emit(_insn(_MOV64_X, 2, 8))
    emit(_insn(_MOV64_X, 3, 7))
    emit(_insn(_ADD64_K, 3, 0, 0, 2))  # &uaddr->sun_path
    emit(_insn(_CALL, 0, 0, 0, _PROBE_READ_KERNEL))
    allow.append(emit(_insn(_JNE_K, 0, 0, 0, 0)))  # the read failed: allow
    emit(_insn(_LD_IMM64, 1, _PSEUDO_MAP_FD, 0, map_fd))
    emit(_insn(0, 0, 0, 0, 0))
    emit(_insn(_MOV64_X, 2, 10))
    emit(_insn(_ADD64_K, 2, 0, 0, _KEY_OFF))
    emit(_insn(_CALL, 0, 0, 0, _MAP_LOOKUP))
    allow.append(emit(_insn(_JEQ_K, 0, 0, 0, 0)))  # not a guarded name
    emit(_insn(_LDX_W, 9, 0, 0))  # r9 = the trainer's uid
    emit(_insn(_CALL, 0, 0, 0, _GET_CURRENT_UID_GID))
    emit(_insn(_MOV32_X, 0, 0))  # the uid: the low 32 bits
    allow.append(emit(_insn(_JEQ_X, 0, 9)))
    allow.append(emit(_insn(_JEQ_K, 0, 0, 0, 0)))  # root
    allow.append(emit(_insn(_JEQ_K, 0, 0, 0, agent_uid)))
    emit(_insn(_MOV64_K, 0, 0, 0, 0))  # refuse: the caller gets EPERM
    emit(_insn(_EXIT))
    target = emit(_insn(_MOV64_K, 0, 0, 0, 1))
    emit(_insn(_EXIT))
    for i in allow:
        op, regs, _, imm = struct.unpack("<BBhi", code[i])
        code[i] = struct.pack("<BBhi", op, regs, target - i - 1, imm)
    return b"".join(code)


def _kfunc_btf_id(name: str) -> int:
    try:
        lib = ctypes.CDLL("libbpf.so.1")
    except OSError as e:
        raise BpfLoadError(f"libbpf.so.1 is not loadable ({e}); install libbpf1") from e
    lib.btf__load_vmlinux_btf.restype = ctypes.c_void_p
    lib.btf__find_by_name_kind.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint32]
    lib.btf__find_by_name_kind.restype = ctypes.c_int
    lib.btf__free.argtypes = [ctypes.c_void_p]
    btf = lib.btf__load_vmlinux_btf()
    if not btf:
        raise BpfLoadError("the kernel has no BTF (/sys/kernel/btf/vmlinux)")
    try:
        found = int(lib.btf__find_by_name_kind(btf, name.encode(), BTF_KIND_FUNC))
    finally:
        lib.btf__free(btf)
    if found < 0:
        raise BpfLoadError(f"the kernel has no {name} (Linux >= 6.2 has it)")
    return found


def cgroup2_root(mounts: str = MOUNTS) -> str:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``.../unified`` on a
    hybrid layout): its root holds every process, whatever v1 controllers are mounted.

    Raises:
        BpfLoadError: it is mounted nowhere.
    """
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 2 and fields[2] == "cgroup2":
                    return fields[1].replace("\\040", " ")
    except OSError as e:
        raise BpfLoadError(f"cannot read {mounts} ({e.strerror})") from e
    raise BpfLoadError(
        "no cgroup v2 hierarchy is mounted; mount one (mount -t cgroup2 none /sys/fs/cgroup/"
        "unified) for the Kineto guard"
    )


def _attr() -> ctypes.Array[ctypes.c_uint8]:
    return (ctypes.c_uint8 * _ATTR_SIZE)()


class KernelGuard:
    """The two programs, their links and the map of guarded names.

    `load` raises `BpfLoadError` with the reason when the kernel cannot have the guard
    (older than 6.7, no BTF, no BPF rights, no cgroup v2); the agent then runs without it
    and `status` says so.
    """

    def __init__(self, agent_uid: int | None = None) -> None:
        self._agent_uid = os.geteuid() if agent_uid is None else agent_uid
        self._map_fd = -1
        self._fds: list[int] = []
        self._guarded: dict[bytes, int] = {}
        #: Updates the kernel refused (the map full): names left unguarded.
        self.refused = 0

    @property
    def active(self) -> bool:
        return self._map_fd >= 0

    @property
    def guarded(self) -> int:
        return len(self._guarded)

    def load(self) -> None:
        """Create the map, load both programs, attach them to the root cgroup."""
        try:
            self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> None:
        cast_id = _kfunc_btf_id("bpf_cast_to_kern_ctx")
        attr = _attr()
        struct.pack_into("<IIII", attr, 0, BPF_MAP_TYPE_HASH, _KEY.size, 4, MAX_ENTRIES)
        try:
            self._map_fd = bpf(BPF_MAP_CREATE, attr)
        except OSError as e:
            raise BpfLoadError(f"cannot create the guard's map ({e.strerror})") from e
        insns = program(self._map_fd, cast_id, self._agent_uid)
        root = cgroup2_root()
        try:
            cgroup = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:
            raise BpfLoadError(f"cannot open the cgroup v2 root {root} ({e.strerror})") from e
        try:
            for attach_type, name in (
                (BPF_CGROUP_UNIX_SENDMSG, b"kineto_sendmsg"),
                (BPF_CGROUP_UNIX_CONNECT, b"kineto_connect"),
            ):
                prog = self._load_prog(insns, attach_type, name)
                self._fds.append(prog)
                attr = _attr()
                struct.pack_into("<IIII", attr, 0, prog, cgroup, attach_type, 0)
                try:
                    self._fds.append(bpf(BPF_LINK_CREATE, attr))
                except OSError as e:
                    raise BpfLoadError(f"cannot attach the guard to {root} ({e.strerror})") from e
        finally:
            os.close(cgroup)
        log.info("Kineto guard active: trainers' abstract sockets take datagrams only from "
                 "their user, root and the agent")  # fmt: skip

    def _load_prog(self, insns: bytes, attach_type: int, name: bytes) -> int:
        buf = ctypes.create_string_buffer(insns, len(insns))
        license_ = ctypes.create_string_buffer(b"GPL")
        log_buf = ctypes.create_string_buffer(_LOG_SIZE)
        attr = _attr()
        struct.pack_into(
            "<IIQQIIQII16sII",
            attr,
            0,
            BPF_PROG_TYPE_CGROUP_SOCK_ADDR,
            len(insns) // 8,
            ctypes.addressof(buf),
            ctypes.addressof(license_),
            1,
            len(log_buf),
            ctypes.addressof(log_buf),
            0,
            0,
            name[:15],
            0,
            attach_type,
        )
        try:
            return bpf(BPF_PROG_LOAD, attr)
        except OSError as e:
            tail = " ".join(log_buf.value.decode("utf-8", "replace").split()[-30:])
            hint = " (Linux >= 6.7 has these hooks)" if e.errno == errno.EINVAL else ""
            raise BpfLoadError(
                f"the kernel refused the guard's program ({e.strerror}){hint}: {tail}"
            ) from e

    def protect(self, address: bytes, uid: int) -> None:
        """Let only ``uid`` (and root, and the agent) send to the abstract name ``address``."""
        if not self.active or not address.startswith(b"\0") or len(address) > PATH_MAX:
            return
        if self._guarded.get(address) == uid:
            return
        key = ctypes.create_string_buffer(_KEY.pack(len(address), address), _KEY.size)
        value = ctypes.create_string_buffer(struct.pack("<I", uid), 4)
        attr = _attr()
        struct.pack_into("<IIQQQ", attr, 0, self._map_fd, 0, ctypes.addressof(key),
                         ctypes.addressof(value), 0)  # fmt: skip
        try:
            bpf(BPF_MAP_UPDATE_ELEM, attr)
        except OSError as e:
            self.refused += 1
            if self.refused == 1:
                log.warning("Kineto guard: cannot guard a trainer's socket (%s)", e.strerror)
            return
        self._guarded[address] = uid

    def release(self, address: bytes) -> None:
        """The trainer at ``address`` is gone: its name is anyone's again."""
        if self._guarded.pop(address, None) is None:
            return
        key = ctypes.create_string_buffer(_KEY.pack(len(address), address), _KEY.size)
        attr = _attr()
        struct.pack_into("<IIQ", attr, 0, self._map_fd, 0, ctypes.addressof(key))
        with contextlib.suppress(OSError):
            bpf(BPF_MAP_DELETE_ELEM, attr)

    def close(self) -> None:
        """Detach (closing the links) and free everything."""
        for fd in reversed(self._fds):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        if self._map_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._map_fd)
        self._map_fd = -1
        self._guarded.clear()
