"""A BPF map the daemon holds only by its fd: `MapTable`, and `RingReader` and `RingDrainer` for
ring buffers.

`MapTable` offers what the collectors use of a map — ``Key`` and ``Leaf`` ctypes types,
``table[key]``, assignment, ``del``, ``items()``, ``getvalue`` — with the key and value types
the compile helper described (`bpfdyno.ebpf.ctypedesc`). A per-CPU map's ``Leaf`` is an array
of one value per possible CPU, as the kernel returns it. `bpfdyno.ebpf.maps` reads whole maps
in batches through ``map_fd``.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
from collections.abc import Callable, Iterator
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

    def event(self, data: bytes) -> Any:
        """One ring buffer record as its C type.

        Raises:
            TypeError: the map is not a ring buffer with a known record type.
        """
        if self._event is None:
            raise TypeError(f"map {self.name} has no record type (not a ring buffer)")
        size = ctypes.sizeof(self._event)
        return self._event.from_buffer_copy(data[:size].ljust(size, b"\0"))


#: Ring buffer record header bits (kernel/bpf/ringbuf.c).
_BUSY = 1 << 31
_DISCARD = 1 << 30
_HDR = 8


class RingReader:
    """The consumer side of a ``BPF_MAP_TYPE_RINGBUF`` map, by mmap of its fd.

    The kernel maps a consumer-position page (ours to write), a producer-position page and
    the data twice in a row, so a record that wraps reads as one slice.
    """

    def __init__(self, fd: int, size: int, on_record: Callable[[bytes], None]) -> None:
        page = mmap.PAGESIZE
        self._mask = size - 1
        self._on_record = on_record
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

    def consume(self) -> int:
        """Hand every committed record to ``on_record``; returns how many."""
        (cons,) = struct.unpack_from("<Q", self._cons, 0)
        (prod,) = struct.unpack_from("<Q", self._prod, 0)
        self.fill = min(1.0, (prod - cons) / (self._mask + 1))
        n = 0
        while cons < prod:
            at = self._page + (cons & self._mask)
            (length,) = struct.unpack_from("<I", self._prod, at)
            if length & _BUSY:
                break  # reserved, not committed yet: the next consume takes it
            size = length & ~(_BUSY | _DISCARD)
            if not length & _DISCARD:
                self._on_record(self._prod[at + _HDR : at + _HDR + size])
                n += 1
            cons += (size + _HDR + 7) & ~7
            struct.pack_into("<Q", self._cons, 0, cons)
        return n

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
