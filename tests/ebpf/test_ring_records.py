"""Ring buffer records read with a struct (`RecordLayout`): the same values ctypes reads, the
kernel's header bits obeyed, and the kept off-CPU records out of the garbage collector's way.

The bytes are laid out as the kernel lays out a ring buffer's data (kernel/bpf/ringbuf.c: an
8-byte header whose first word is the record's length with the busy and discard bits, the
record, padding to 8 bytes); the real ring is read in tests/ebpf/test_bpf_program.py and by
every capture test.
"""

from __future__ import annotations

import ctypes
import gc
import struct

from bpfdyno.ebpf.fdmap import RecordLayout
from bpfdyno.tracing.capture.records import OffCpu, unpacked

BUSY, DISCARD = 1 << 31, 1 << 30


class Record(ctypes.Structure):
    """Every kind of field the BPF programs' records have, with padding inside and at the
    end (5 bytes after a u8 before a u64, 4 before the next u64, 7 after the last byte: a
    64-byte record, 72 bytes with its header in the ring)."""

    _fields_ = [
        ("ts_ns", ctypes.c_ulong),
        ("tgid", ctypes.c_uint),
        ("syscall", ctypes.c_int),
        ("family", ctypes.c_ushort),
        ("kind", ctypes.c_ubyte),
        ("sk", ctypes.c_ulonglong),
        ("comm", ctypes.c_char * 8),
        ("addr", ctypes.c_ubyte * 4),
        ("delta", ctypes.c_long),
        ("flag", ctypes.c_byte),
    ]


def framed(payload: bytes, header: int | None = None) -> bytes:
    """One record as the ring holds it: header (its length unless given), record, padding."""
    length = len(payload) if header is None else header
    raw = struct.pack("=I4x", length) + payload
    return raw + b"\0" * (-len(raw) % 8)


def sample(n: int) -> Record:
    return Record(
        ts_ns=2**64 - 1 - n,
        tgid=4_000_000_000 + n,
        syscall=-1 - n,
        family=10,
        kind=255,
        sk=0xFFFF_8880_0000_0000 + n,
        comm=f"w{n}".encode(),
        addr=(ctypes.c_ubyte * 4)(127, 0, 0, n),
        delta=-(2**62) + n,
        flag=-3,
    )


def assert_same(got: object, want: Record) -> None:
    """A record read by the layout has every field ctypes reads (char arrays raw)."""
    for name, _ftype in Record._fields_:
        value, expected = getattr(got, name), getattr(want, name)
        if name == "comm":
            assert value.split(b"\0", 1)[0] == expected  # ctypes cuts at the first NUL
            assert len(value) == 8
        elif name == "addr":
            assert value == bytes(expected)
        else:
            assert value == expected, name


def test_a_struct_reads_every_field_as_ctypes_does() -> None:
    layout = RecordLayout(Record)
    assert layout.by_struct
    assert (layout.size, layout.stride) == (64, 72)
    records = [sample(n) for n in range(3)]
    data = b"".join(framed(bytes(r)) for r in records)
    got, used = layout.read(data)
    assert used == len(data) == 3 * 72
    assert len(got) == 3
    for g, want in zip(got, records, strict=True):
        assert_same(g, want)
    assert got[0].comm == b"w0\0\0\0\0\0\0"
    assert got[0].addr == bytes([127, 0, 0, 0])


def test_a_record_being_written_stops_the_read_and_discarded_ones_are_skipped() -> None:
    layout = RecordLayout(Record)
    r = [bytes(sample(n)) for n in range(6)]
    data = (
        framed(r[0])
        + framed(r[1], header=64 | DISCARD)  # discarded: skipped, its room consumed
        + framed(r[2])
        + framed(r[3])
        + framed(r[4], header=64 | BUSY)  # reserved, not committed: stop here
        + framed(r[5])
    )
    got, used = layout.read(data)
    assert [g.tgid for g in got] == [4_000_000_000, 4_000_000_002, 4_000_000_003]
    assert used == 4 * 72  # the busy record and the one after it wait for the next read
    again, used_again = layout.read(
        data[used:].replace(struct.pack("=I", 64 | BUSY), struct.pack("=I", 64), 1)
    )
    assert [g.tgid for g in again] == [4_000_000_004, 4_000_000_005]
    assert used_again == 2 * 72


def test_records_of_another_size_are_padded_or_cut() -> None:
    layout = RecordLayout(Record)
    whole = bytes(sample(7))
    short = whole[:16]  # ts_ns, tgid, syscall: the rest reads as zeros
    data = framed(whole) + framed(short) + framed(whole + b"extra!") + framed(whole)
    got, used = layout.read(data)
    assert used == len(data)
    assert [g.tgid for g in got] == [4_000_000_007] * 4
    assert (got[1].syscall, got[1].sk, got[1].comm) == (-8, 0, b"\0" * 8)
    assert_same(got[2], sample(7))
    assert_same(got[3], sample(7))


def test_an_empty_or_header_only_ring_reads_nothing() -> None:
    layout = RecordLayout(Record)
    assert layout.read(b"") == ([], 0)
    assert layout.read(struct.pack("=I4x", 64 | BUSY)) == ([], 0)


class WithUnion(ctypes.Structure):
    class Value(ctypes.Union):
        _fields_ = [("i", ctypes.c_int), ("f", ctypes.c_float)]

    _fields_ = [("tgid", ctypes.c_uint), ("value", Value)]


class WithBits(ctypes.Structure):
    _fields_ = [("tgid", ctypes.c_uint), ("low", ctypes.c_uint, 4), ("high", ctypes.c_uint, 28)]


def test_types_a_format_cannot_say_are_read_with_ctypes() -> None:
    for ctype in (WithUnion, WithBits):
        layout = RecordLayout(ctype)
        assert not layout.by_struct
    bits = WithBits(tgid=9, low=5, high=1000)
    got, used = RecordLayout(WithBits).read(framed(bytes(bits)) + framed(bytes(bits)))
    assert used == 2 * 16
    assert [(g.tgid, g.low, g.high) for g in got] == [(9, 5, 1000)] * 2


def test_kept_off_cpu_records_leave_the_garbage_collectors_view() -> None:
    fields = (42, "worker", 1, 2, 3, 1, 0, 1, 0, 0, "", 0, 7, 8, 100, 200)
    packed = tuple(list(fields))  # built at run time, as the decoder builds it
    record = OffCpu(*fields)
    gc.collect()
    assert not gc.is_tracked(packed)  # a plain tuple of numbers and strings
    assert gc.is_tracked(record)  # a named tuple stays followed
    assert unpacked(packed) == record
    assert type(unpacked(packed)) is OffCpu
    assert unpacked(record) is record
