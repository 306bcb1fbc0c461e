"""Uprobes without bcc: where a function is in an ELF file, and the perf event that probes it.

A uprobe is the kernel's ``uprobe`` PMU (``/sys/bus/event_source/devices/uprobe``) opened
with the file's path and the function's offset in the file; the BPF program runs on it
through ``PERF_EVENT_IOC_SET_BPF`` (`bpfdyno.ebpf.fdops`).
"""

from __future__ import annotations

import ctypes
import mmap
import re
import struct
from pathlib import Path

from bpfdyno.ebpf import fdops

_PMU = Path("/sys/bus/event_source/devices/uprobe")
#: Where a library name such as ``"c"`` is looked for when no process names its file.
LIBRARY_DIRS = (
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
)

_SHT_SYMTAB = 2
_SHT_DYNSYM = 11
_PT_LOAD = 1
_STT_FUNC = 2
_STT_GNU_IFUNC = 10


class UprobeError(Exception):
    """The binary or symbol was not found, or the kernel refused the probe."""


def mapped_library(
    pid: int, prefixes: tuple[str, ...], proc_root: Path = Path("/proc")
) -> str | None:
    """The path (in the process's mount namespace) of the first shared library process
    ``pid`` maps whose file name starts with one of ``prefixes``, or None. A deleted file
    (replaced by an upgrade while mapped) is skipped: its path no longer names it.

    Raises:
        OSError: the process is gone or its maps cannot be read.
    """
    with open(proc_root / str(pid) / "maps", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) < 6:
                continue
            path = parts[5].strip()
            name = path.rsplit("/", 1)[-1]
            if name.startswith(prefixes) and ".so" in name and not path.endswith("(deleted)"):
                return path
    return None


def resolve_binary(binary: str, pid: int = -1) -> str:
    """The file of ``binary``: a path as it is, a library name (``"c"``) as the file a
    process ``pid`` maps, else the first ELF file ``lib<name>.so*`` in the usual directories.

    Raises:
        UprobeError: no such file.
    """
    if "/" in binary:
        if not Path(binary).is_file():
            raise UprobeError(f"no file {binary}")
        return binary
    pattern = re.compile(rf"/lib{re.escape(binary)}(\.so|-[0-9.]+\.so)[^/]*$")
    if pid > 0:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text(errors="replace")
        except OSError:
            maps = ""
        for line in maps.splitlines():
            path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
            if path.startswith("/") and pattern.search(path):
                return path
    for d in LIBRARY_DIRS:
        try:
            names = sorted(p.name for p in Path(d).iterdir())
        except OSError:
            continue
        for name in names:
            if pattern.search("/" + name) and _is_elf(f"{d}/{name}"):
                return f"{d}/{name}"  # (libc.so itself is a linker script, not the library)
    raise UprobeError(f"no library lib{binary}.so found (give its path)")


def _is_elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def symbol_offset(path: str, symbol: str) -> int:
    """The file offset of function ``symbol`` in the 64-bit little-endian ELF file ``path``.

    Raises:
        UprobeError: not a 64-bit ELF file, or no such function in its symbol tables.
    """
    # Mapped, not read: a library can be hundreds of MB (libnccl), and only its headers and
    # symbol tables are looked at.
    try:
        with open(path, "rb") as f:
            data = mmap.mmap(f.fileno(), 0, mmap.MAP_PRIVATE, mmap.PROT_READ)
    except (OSError, ValueError) as e:
        raise UprobeError(f"cannot read {path}: {e}") from e
    try:
        return _offset_in(data, path, symbol)
    except (struct.error, IndexError) as e:  # offsets pointing outside the file
        raise UprobeError(f"{path} is not a well-formed ELF file ({e})") from e
    finally:
        data.close()


def _offset_in(data: mmap.mmap, path: str, symbol: str) -> int:
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise UprobeError(f"{path} is not a 64-bit little-endian ELF file")
    (phoff, shoff) = struct.unpack_from("<QQ", data, 0x20)
    (phentsize, phnum, shentsize, shnum) = struct.unpack_from("<HHHH", data, 0x36)
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    address = None
    wanted = symbol.encode()
    for sh in sections:
        if sh[1] not in (_SHT_SYMTAB, _SHT_DYNSYM):
            continue
        strtab = sections[sh[6]]
        str_off = strtab[4]
        for at in range(sh[4], sh[4] + sh[5], 24):
            st_name, st_info, _, st_shndx, st_value = struct.unpack_from("<IBBHQ", data, at)
            if st_shndx == 0 or st_value == 0 or (st_info & 0xF) not in (_STT_FUNC, _STT_GNU_IFUNC):
                continue
            at_name = str_off + st_name
            if data[at_name : at_name + len(wanted)] != wanted:
                continue
            end = data.find(b"\0", at_name)
            name = data[at_name:end].decode(errors="replace")
            if name == symbol or name.split("@", 1)[0] == symbol:
                address = st_value
                break
        if address is not None:
            break
    if address is None:
        raise UprobeError(f"no function {symbol} in {path}")
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == _PT_LOAD and p_vaddr <= address < p_vaddr + p_filesz:
            return int(address - p_vaddr + p_offset)
    raise UprobeError(f"function {symbol} of {path} is in no loaded segment")


def open_uprobe(path: str, offset: int, *, pid: int = -1, retprobe: bool = False) -> int:
    """The perf event of a uprobe (or uretprobe) at ``offset`` of ``path``.

    Raises:
        OSError: the kernel has no uprobe PMU or refused the probe.
    """
    ptype = int((_PMU / "type").read_text())
    config = 0
    if retprobe:
        # "config:0": which bit of config asks for the return probe.
        fmt = (_PMU / "format" / "retprobe").read_text().strip()
        config = 1 << int(fmt.split(":", 1)[1])
    name = ctypes.create_string_buffer(path.encode())
    return fdops.perf_event_open(
        ptype, config, pid=pid, config1=ctypes.addressof(name), config2=offset
    )
