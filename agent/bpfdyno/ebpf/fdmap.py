"""A BPF map the daemon holds only by its fd: `MapTable`, and `RingReader` and `RingDrainer` for
ring buffers.

`MapTable` offers what the collectors use of a map — ``Key`` and ``Leaf`` ctypes types,
``table[key]``, assignment, ``del``, ``items()``, ``getvalue`` — with the key and value types
the compile helper described (`bpfdyno.ebpf.ctypedesc`). A per-CPU map's ``Leaf`` is an array
of one value per possible CPU, as the kernel returns it. `bpfdyno.ebpf.maps` reads whole maps
in batches through ``map_fd``.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bpfdyno.ebpf import fdops


@dataclass(frozen=True, slots=True)
class MapSpec:
    """What the compile helper tells of one map besides its fd."""

    name: str
    map_type: int
    max_entries: int
    key: type[Any]
    leaf: type[Any]
    #: The ctypes type of a ring buffer's records (None for other maps).
    event: type[Any] | None = None


class MapTable:
    """One BPF map by fd. The fd is the owner's (`BpfProgram` closes it)."""

    def __init__(self, spec: MapSpec, fd: int, ncpus: int) -> None:
        self.name = spec.name
        self.map_fd = fd
        self.map_type = spec.map_type
        self.max_entries = spec.max_entries
        self.Key: type[Any] = spec.key
        self.Leaf: type[Any] = spec.leaf
        self._event = spec.event
        #: Values per key of a per-CPU map: one per possible CPU.
        self.total_cpu = ncpus
        if spec.map_type in fdops.PERCPU_MAP_TYPES:
            if ctypes.sizeof(spec.leaf) % 8:
                raise ValueError(
                    f"per-CPU map {spec.name}: values must be a multiple of 8 bytes "
                    f"({ctypes.sizeof(spec.leaf)}); pad the C type"
                )
            self.Leaf = spec.leaf * ncpus

    def _key(self, key: Any) -> Any:
        return key if isinstance(key, self.Key) else self.Key(key)

    def getvalue(self, key: Any) -> Any:
        """The value at ``key``.

        Raises:
            KeyError: no such key.
        """
        k = self._key(key)
        value = self.Leaf()
        err = fdops.map_op(
            fdops.BPF_MAP_LOOKUP_ELEM, self.map_fd, ctypes.addressof(k), ctypes.addressof(value)
        )
        if err:
            raise KeyError(key)
        return value

    __getitem__ = getvalue

    def __setitem__(self, key: Any, value: Any) -> None:
        """Store ``value`` at ``key``.

        Raises:
            OSError: the kernel refused (E2BIG: the map is full).
        """
        k = self._key(key)
        v = value if isinstance(value, self.Leaf) else self.Leaf(value)
        err = fdops.map_op(
            fdops.BPF_MAP_UPDATE_ELEM, self.map_fd, ctypes.addressof(k), ctypes.addressof(v)
        )
        if err:
            raise OSError(err, f"updating map {self.name} failed: {os.strerror(err)}")

    def __delitem__(self, key: Any) -> None:
        """Remove ``key``.

        Raises:
            KeyError: no such key.
        """
        k = self._key(key)
        if fdops.map_op(fdops.BPF_MAP_DELETE_ELEM, self.map_fd, ctypes.addressof(k)):
            raise KeyError(key)

    def keys(self) -> Iterator[Any]:
        """Every key, one syscall each (`bpfdyno.ebpf.maps` reads in batches instead)."""
        cur: Any = None
        while True:
            nxt = self.Key()
            err = fdops.map_op(
                fdops.BPF_MAP_GET_NEXT_KEY,
                self.map_fd,
                0 if cur is None else ctypes.addressof(cur),
                ctypes.addressof(nxt),
            )
            if err:
                return
            yield nxt
            cur = nxt

    def items(self) -> list[tuple[Any, Any]]:
        """Every (key, value) pair, key by key."""
        out = []
        for k in self.keys():
            with contextlib.suppress(KeyError):  # removed meanwhile
                out.append((k, self.getvalue(k)))
        return out

    @property
    def record_type(self) -> type[Any] | None:
        """The ctypes type of a ring buffer's records (None for other maps)."""
        return self._event


#: Ring buffer record header bits (kernel/bpf/ringbuf.c).
_BUSY = 1 << 31
_DISCARD = 1 << 30
_HDR = 8


class RecordLayout:
    """How the records of one ring buffer are read: with one `struct.Struct` where the C
    type allows, else with its ctypes type.

    Reading each record through ctypes (a copy into a Structure, then an attribute access per
    field) was part of the 12.7 µs of the agent's CPU a sched-track record cost, which
    capped the capture at ~69,000 records a second (docs/performance.md). A struct reads a
    whole run of records of the same size in one call (`struct.Struct.iter_unpack`), each
    becoming a named tuple with the C fields' names, so decoders read ``record.tgid``
    either way. Differences from the ctypes values: a ``char`` or byte array is its raw
    bytes (NUL padding included: cut C strings at the first NUL, as
    `bpfdyno.core.text.shown_c_string` does). Types a format cannot say the same way
    (unions, bit fields, nested structures, pointers, arrays of wider elements) keep the
    ctypes reading.
    """

    def __init__(self, ctype: type[Any]) -> None:
        self.ctype = ctype
        #: The record's bytes (the C type's size).
        self.size = ctypes.sizeof(ctype)
        #: Where the next record starts after one of this size: header and record, 8-aligned.
        self.stride = (_HDR + self.size + 7) & ~7
        self._framed: struct.Struct | None = None
        self._payload: struct.Struct | None = None
        self._record: Any = None
        self._make: Any = None
        described = _struct_fields(ctype)
        if described is None:
            return
        fmt, names = described
        try:
            # (bcc's type names are not identifiers.)
            self._record = collections.namedtuple("RingRecord", names)  # type: ignore[misc]
        except ValueError:  # a field name a named tuple cannot have
            return
        # A named tuple from a row without its Python-level ``_make`` (a call in C).
        self._make = functools.partial(tuple.__new__, self._record)
        # Native byte order and sizes without alignment: the offsets are in the format.
        self._payload = struct.Struct(f"={fmt}")
        self._framed = struct.Struct(f"={_HDR}x{fmt}{self.stride - _HDR - self.size}x")

    @property
    def by_struct(self) -> bool:
        """Whether records are read with a struct (False: with ctypes)."""
        return self._framed is not None

    def read(self, data: bytes) -> tuple[list[Any], int]:
        """The committed records at the start of ``data`` (a ring's bytes from its consumer
        position to its producer position, headers included), and how many bytes they and
        the discarded records among them take: a record still being written, and those
        after it, are left for the next read."""
        out: list[Any] = []
        at, end = 0, len(data)
        view = memoryview(data)
        while at + _HDR <= end:
            regular = self._regular(view, at)
            if regular:
                stop = at + regular * self.stride
                assert self._framed is not None and self._record is not None
                out.extend(map(self._make, self._framed.iter_unpack(view[at:stop])))
                at = stop
                continue
            (header,) = _HEADER.unpack_from(data, at)
            if header & _BUSY:
                break  # reserved, not committed yet: the next read takes it
            size = header & ~(_BUSY | _DISCARD)
            if not header & _DISCARD:
                out.append(self.one(view[at + _HDR : at + _HDR + size]))
            at += (size + _HDR + 7) & ~7
        return out, min(at, end)

    def one(self, data: bytes | memoryview) -> Any:
        """One record from its bytes (shorter ones padded with zeros, longer ones cut)."""
        raw = bytes(data[: self.size]).ljust(self.size, b"\0")
        if self._payload is not None:
            return self._make(self._payload.unpack(raw))
        return self.ctype.from_buffer_copy(raw)

    def _regular(self, view: memoryview, at: int) -> int:
        """How many records from ``at`` are committed, not discarded and of this size: a run
        read in one call."""
        if self._framed is None:
            return 0
        n = (len(view) - at) // self.stride
        if n == 0:
            return 0
        # Each record's header word, strided out of the bytes in C.
        headers = view[at : at + n * self.stride].cast("I")[:: self.stride // 4].tolist()
        if headers.count(self.size) == n:
            return n
        return next(i for i, h in enumerate(headers) if h != self.size)


#: A ring buffer record's header word: its length and the busy and discard bits.
_HEADER = struct.Struct("=I")

#: struct codes of the integer ctypes types (by their type code), sized as ctypes sizes them.
_SIGNED, _UNSIGNED = "bhilq", "BHILQ"
_BY_SIZE = {1: "b", 2: "h", 4: "i", 8: "q"}


def _struct_fields(ctype: type[Any]) -> tuple[str, list[str]] | None:
    """A struct format (no byte order) reading ``ctype`` as ctypes lays it out, and its
    field names; None when a format cannot read it the same way."""
    if not (isinstance(ctype, type) and issubclass(ctype, ctypes.Structure)):
        return None
    if getattr(ctype, "_anonymous_", None):
        return None
    fmt: list[str] = []
    names: list[str] = []
    at = 0
    for field in ctype._fields_:
        if len(field) != 2:
            return None  # a bit field
        name, ftype = field
        offset = getattr(ctype, name).offset
        if offset < at:
            return None
        code = _code(ftype)
        if code is None:
            return None
        if offset > at:
            fmt.append(f"{offset - at}x")
        fmt.append(code)
        names.append(name)
        at = offset + ctypes.sizeof(ftype)
    size = ctypes.sizeof(ctype)
    if at > size:
        return None
    if size > at:
        fmt.append(f"{size - at}x")
    return "".join(fmt), names


def _code(ftype: type[Any]) -> str | None:
    """The struct code of one field's type: integers, floats, a char, byte arrays."""
    if issubclass(ftype, ctypes.Array):
        element = getattr(ftype, "_type_", None)
        if element in (ctypes.c_char, ctypes.c_byte, ctypes.c_ubyte):
            return f"{ftype._length_}s"
        return None
    code = getattr(ftype, "_type_", None)
    if not isinstance(code, str):
        return None
    if code in _SIGNED or code in _UNSIGNED:
        size_code = _BY_SIZE[ctypes.sizeof(ftype)]
        return size_code.upper() if code in _UNSIGNED else size_code
    if code in ("c", "?", "f", "d"):
        return code
    return None


class RingReader:
    """The consumer side of a ``BPF_MAP_TYPE_RINGBUF`` map, by mmap of its fd.

    The kernel maps a consumer-position page (ours to write), a producer-position page and
    the data twice in a row, so the records waiting read as one slice however they wrap.
    """

    def __init__(self, fd: int, size: int, layout: RecordLayout) -> None:
        page = mmap.PAGESIZE
        self._mask = size - 1
        self._layout = layout
        self._cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            self._prod = mmap.mmap(
                fd, page + 2 * size, mmap.MAP_SHARED, mmap.PROT_READ, offset=page
            )
        except BaseException:
            self._cons.close()
            raise
        self._page = page
        #: The share of the ring the records waiting at the last `consume` filled (0-1).
        self.fill = 0.0

    def consume(self) -> list[Any]:
        """Every committed record waiting now, oldest first, read by the ring's layout.

        The records are copied out in one slice and the consumer position moves past them
        at once, so the kernel can write again into all of their room before they are
        decoded.
        """
        (cons,) = struct.unpack_from("<Q", self._cons, 0)
        (prod,) = struct.unpack_from("<Q", self._prod, 0)
        self.fill = min(1.0, (prod - cons) / (self._mask + 1))
        if cons >= prod:
            return []
        at = self._page + (cons & self._mask)
        records, used = self._layout.read(self._prod[at : at + prod - cons])
        if used:
            struct.pack_into("<Q", self._cons, 0, cons + used)
        return records

    def close(self) -> None:
        self._cons.close()
        self._prod.close()


class RingDrainer:
    """The consumer side of a ``BPF_MAP_TYPE_RINGBUF`` map that keeps none of its data
    mapped between drains.

    `RingReader` maps the whole data area twice (the kernel maps its pages in all at once),
    so a big ring buffer adds twice its size to the process's resident memory for good.
    Each `drain` here maps only the pages holding the records waiting (the kernel maps the
    data twice in a row, so one window from the consumer position never wraps), copies them
    out and unmaps them: a buffer sized for seconds of a storm costs resident memory only
    while a drain reads it.
    """

    def __init__(self, fd: int, size: int) -> None:
        page = mmap.PAGESIZE
        self._fd = fd
        self._mask = size - 1
        self._page = page
        self._cons = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            self._prod = mmap.mmap(fd, page, mmap.MAP_SHARED, mmap.PROT_READ, offset=page)
        except BaseException:
            self._cons.close()
            raise

    def drain(self) -> list[bytes]:
        """Every committed record waiting now, oldest first (a record still being written
        and those after it wait for the next drain).

        Raises:
            OSError: the kernel refused to map the records' pages.
        """
        (cons,) = struct.unpack_from("<Q", self._cons, 0)
        (prod,) = struct.unpack_from("<Q", self._prod, 0)
        if cons >= prod:
            return []
        page = self._page
        at = cons & self._mask
        first = at // page
        skip = at - first * page
        length = -(-(skip + prod - cons) // page) * page
        # The data starts after the consumer and producer pages.
        window = mmap.mmap(
            self._fd, length, mmap.MAP_SHARED, mmap.PROT_READ, offset=(2 + first) * page
        )
        out: list[bytes] = []
        start = cons
        try:
            while cons < prod:
                off = skip + cons - start
                (header,) = struct.unpack_from("<I", window, off)
                if header & _BUSY:
                    break  # reserved, not committed yet: the next drain takes it
                size = header & ~(_BUSY | _DISCARD)
                if not header & _DISCARD:
                    out.append(window[off + _HDR : off + _HDR + size])
                cons += (size + _HDR + 7) & ~7
        finally:
            window.close()
        struct.pack_into("<Q", self._cons, 0, cons)
        return out

    def close(self) -> None:
        self._cons.close()
        self._prod.close()
