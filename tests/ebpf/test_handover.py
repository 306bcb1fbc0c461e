"""What crosses from the compile helper to the daemon: ctypes types as data, map fds renumbered
in the instructions, and uprobe offsets found without bcc."""

from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest

from bpfdyno.ebpf import ctypedesc
from bpfdyno.ebpf.fdops import relocate_maps
from bpfdyno.ebpf.uprobe import UprobeError, resolve_binary, symbol_offset


class _Inner(ctypes.Union):
    _fields_ = [("a", ctypes.c_uint32), ("b", ctypes.c_uint16 * 2)]


class _Record(ctypes.Structure):
    _pack_ = 1
    _anonymous_ = ["u"]
    _fields_ = [
        ("tgid", ctypes.c_uint32),
        ("flags", ctypes.c_uint8, 3),
        ("comm", ctypes.c_char * 16),
        ("u", _Inner),
        ("ns", ctypes.c_ulonglong),
    ]


def test_a_described_struct_is_built_again_with_the_same_layout() -> None:
    built = ctypedesc.build(ctypedesc.describe(_Record))
    assert ctypes.sizeof(built) == ctypes.sizeof(_Record) == 33
    for name in ("tgid", "flags", "comm", "a", "ns"):
        assert getattr(built, name).offset == getattr(_Record, name).offset, name
    raw = bytes(range(33))
    assert built.from_buffer_copy(raw).ns == _Record.from_buffer_copy(raw).ns
    assert built.from_buffer_copy(raw).a == _Record.from_buffer_copy(raw).a
    assert ctypedesc.build(ctypedesc.describe(ctypes.c_uint64 * 4))._length_ == 4  # type: ignore[attr-defined]


def test_a_description_that_is_not_one_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not a ctypes type description: \{'kind': 'lisp'\}"):
        ctypedesc.build({"kind": "lisp"})
    with pytest.raises(TypeError, match="cannot describe"):
        ctypedesc.describe(ctypes.POINTER(ctypes.c_int))


def _insn(code: int, src: int, imm: int) -> bytes:
    return struct.pack("<BBhi", code, src << 4 | 1, 0, imm)


def test_map_references_are_renumbered_and_nothing_else() -> None:
    mov = _insn(0xB7, 0, 7)  # r1 = 7: an immediate, not a map
    ld_map = _insn(0x18, 1, 7) + _insn(0, 0, 0)  # r1 = map fd 7 (two slots)
    ld_value = _insn(0x18, 2, 9) + _insn(0, 0, 0)  # r1 = &value of map fd 9
    ld_plain = _insn(0x18, 0, 7) + _insn(0, 0, 0)  # r1 = 64-bit constant 7
    out = relocate_maps(mov + ld_map + ld_value + ld_plain, {7: 40, 9: 41})
    assert (
        out
        == mov
        + _insn(0x18, 1, 40)
        + _insn(0, 0, 0)
        + _insn(0x18, 2, 41)
        + _insn(0, 0, 0)
        + ld_plain
    )
    with pytest.raises(ValueError, match="instruction 0 refers to unknown map fd 7"):
        relocate_maps(ld_map, {})


def test_uprobe_offset_of_a_libc_function_is_where_the_loader_put_it() -> None:
    """The file offset of ``labs`` is its address in this process minus where libc's file
    offset 0 is mapped (the first mapping of the file)."""
    path = resolve_binary("c")
    real = str(Path(path).resolve())
    base = None
    for line in Path("/proc/self/maps").read_text().splitlines():
        f = line.split()
        if len(f) >= 6 and str(Path(f[5]).resolve()) == real and int(f[2], 16) == 0:
            base = int(f[0].split("-")[0], 16)
            break
    assert base is not None, "libc is mapped"
    libc = ctypes.CDLL("libc.so.6")
    address = ctypes.cast(libc.labs, ctypes.c_void_p).value
    assert address is not None
    assert symbol_offset(path, "labs") == address - base
    with pytest.raises(UprobeError, match=r"no function no_such_fn_x in .*libc"):
        symbol_offset(path, "no_such_fn_x")
    with pytest.raises(UprobeError, match=r"no library libno-such-lib-x\.so found"):
        resolve_binary("no-such-lib-x")


def test_a_file_that_is_not_elf_gets_a_clear_error(tmp_path: Path) -> None:
    text = tmp_path / "libfake.so"
    text.write_text("GROUP ( /lib/libc.so.6 )\n")  # what libc.so is: a linker script
    with pytest.raises(UprobeError, match=r"libfake\.so is not a 64-bit little-endian ELF"):
        symbol_offset(str(text), "labs")
    cut = tmp_path / "libcut.so"
    cut.write_bytes(Path(resolve_binary("c")).read_bytes()[:4096])  # headers, no sections
    with pytest.raises(UprobeError, match=r"libcut\.so is not a well-formed ELF file"):
        symbol_offset(str(cut), "labs")


def test_a_helper_that_dies_without_answering_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The helper process exits at once (as if it crashed in LLVM): the load fails with what
    happened, and nothing hangs."""
    import sys

    from bpfdyno.ebpf.compiled import compile_in_helper
    from bpfdyno.ebpf.errors import BpfLoadError
    from bpfdyno.ebpf.kheaders import HeaderTree

    monkeypatch.setattr(sys, "executable", "/bin/false")
    tree = HeaderTree(Path("/nonexistent"), "generated-minimal", "0", "")
    with pytest.raises(BpfLoadError, match=r"the BPF compile helper for x\.bpf\.c gave no answer"):
        compile_in_helper("x.bpf.c", "int x;", [], tree, timeout_s=30)
