"""The one way bpfdyno reads BPF maps: whole maps in batches, per-CPU arrays by slot.

Keys and values of scalar types come back as Python ints, structs as the map's ctypes structs
(`bpfdyno.ebpf.fdmap.MapTable`); a per-CPU map's value is an array of one value per
*possible* CPU. Maps that the kernel
fills and user space empties are drained with batch lookup-and-delete (`map_pop_all`), never
read-then-cleared.
"""

from __future__ import annotations

import ctypes
import errno
import os
from array import array
from typing import Any

from bpfdyno.ebpf.fdops import BPF_MAP_LOOKUP_AND_DELETE_BATCH, BPF_MAP_LOOKUP_BATCH, map_batch

#: errnos of a kernel (< 5.6) or map type without BPF_MAP_LOOKUP_BATCH.
_NO_BATCH = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def map_items(table: Any, chunk: int = 1024) -> list[tuple[Any, Any]]:
    """All (key, value) pairs of a hash or array map (per-CPU ones too), in batches.

    One ``BPF_MAP_LOOKUP_BATCH`` syscall per ``chunk`` entries instead of two per entry.
    Falls back to key-by-key
    iteration on kernels without batch operations (< 5.6).

    Args:
        table: a map (``BpfProgram.table(name)``).
        chunk: entries per syscall (at most the map's size is allocated).

    Returns:
        Every entry, in the kernel's order.

    Raises:
        OSError: the batch lookup failed for another reason.
    """
    return _batched(table, BPF_MAP_LOOKUP_BATCH, chunk)


def map_pop_all(table: Any, chunk: int = 1024) -> list[tuple[Any, Any]]:
    """Remove and return every entry of a hash map (BPF_MAP_LOOKUP_AND_DELETE_BATCH).

    An entry the kernel adds meanwhile is either returned now or left for the next call,
    never lost. Falls back to lookup-then-delete key by key on kernels without batch
    operations (< 5.6).

    Raises:
        OSError: the batch operation failed for another reason.
    """
    return _batched(table, BPF_MAP_LOOKUP_AND_DELETE_BATCH, chunk, delete=True)


def _batched(table: Any, op: int, chunk: int, delete: bool = False) -> list[tuple[Any, Any]]:
    chunk = max(1, min(chunk, int(table.max_entries)))
    out: list[tuple[Any, Any]] = []
    cursor: ctypes.c_uint32 | None = None
    while True:
        keys, vals, n, err, cursor_out = _one_batch(table, op, chunk, cursor)
        out.extend(zip(keys[:n], vals[:n], strict=True))
        if err == 0:
            cursor = cursor_out
            continue
        if err == errno.ENOENT:  # the last batch
            return out
        if cursor is None and err in _NO_BATCH:
            return _one_by_one(table, delete)
        raise OSError(err, f"BPF map batch operation failed: {os.strerror(err)}")


def _one_batch(
    table: Any, op: int, chunk: int, cursor: ctypes.c_uint32 | None
) -> tuple[Any, Any, int, int, ctypes.c_uint32]:
    """One batch syscall from ``cursor`` (None: the start) into fresh buffers.

    Returns:
        (keys, values, how many were filled, errno — 0 when more may follow, ENOENT after
        the last —, the cursor to continue from). The buffers are fresh on every call: the
        entries handed out are views into them.
    """
    keys = (table.Key * chunk)()
    vals = (table.Leaf * chunk)()
    cursor_out = ctypes.c_uint32(0)
    filled, err = map_batch(
        op,
        table.map_fd,
        0 if cursor is None else ctypes.addressof(cursor),
        ctypes.addressof(cursor_out),
        ctypes.addressof(keys),
        ctypes.addressof(vals),
        chunk,
    )
    return keys, vals, filled, err, cursor_out


def _one_by_one(table: Any, delete: bool) -> list[tuple[Any, Any]]:
    out = []
    for k, v in table.items():
        if delete:
            try:
                del table[k]
            except KeyError:
                continue  # removed meanwhile
        out.append((_plain(k), _plain(v)))
    return out


def percpu_values(table: Any, index: int = 0) -> list[Any]:
    """Slot ``index`` of a per-CPU array, one value per possible CPU (one syscall)."""
    return list(table.getvalue(table.Key(index)))


def percpu_flat(table: Any, index: int = 0) -> tuple[array[int], int]:
    """Slot ``index`` of a per-CPU array of 64-bit-only structs as one flat array of words.

    Returns (the words of every possible CPU's value back to back, words per CPU): field f
    of every CPU is ``words[f::per_cpu]``, which sums or copies in C without an object per
    CPU — what keeps a round's decoding flat on a node with hundreds of CPUs.
    """
    values = table.getvalue(table.Key(index))
    words: array[int] = array("Q")
    words.frombytes(memoryview(values).cast("B"))
    return words, len(words) // max(1, len(values))


def percpu_words(table: Any, index: int = 0) -> list[array[int]]:
    """Slot ``index`` of a per-CPU array of 64-bit-only structs, as raw words per CPU.

    One syscall, then each possible CPU's value as an ``array("Q")`` of its 64-bit fields
    in declaration order (signed fields come back as their two's complement): for structs
    with many fields or many CPUs, far cheaper than reading ctypes fields one by one.
    """
    values = table.getvalue(table.Key(index))
    words: array[int] = array("Q")
    words.frombytes(memoryview(values).cast("B"))
    per_cpu = len(words) // max(1, len(values))
    return [words[i * per_cpu : (i + 1) * per_cpu] for i in range(len(values))]


def percpu_sums(table: Any) -> list[int]:
    """Every slot of a per-CPU array of 64-bit integers, summed over the CPUs.

    One batch read of the whole array, summed as raw words (``array("Q")`` strides) rather
    than through a ctypes object per slot and CPU: collectors call this every round on arrays
    of hundreds of slots, where the per-object way was a visible share of an idle agent's CPU.

    Raises:
        TypeError: the map's values are not 64-bit integers.
    """
    size = int(table.max_entries)
    leaf = ctypes.sizeof(table.Leaf)
    if leaf % 8 or ctypes.sizeof(getattr(table.Leaf, "_type_", ctypes.c_char)) != 8:
        raise TypeError(f"percpu_sums reads per-CPU arrays of 64-bit integers, not {table.Leaf}")
    ncpu = leaf // 8
    _, vals, n, err, _ = _one_batch(table, BPF_MAP_LOOKUP_BATCH, size, None)
    if err not in (0, errno.ENOENT) or n != size:
        # No batch operations on this kernel, or a partial read: the general way.
        out = [0] * size
        for key, per_cpu in map_items(table):
            out[int(key)] = sum(per_cpu)
        return out
    # An array map's batch returns every index in order: vals[i] is slot i.
    words: array[int] = array("Q")
    words.frombytes(bytes(vals))
    if ncpu == 1:
        return list(words)
    # Slot i's value of every CPU, back to back: one slice and one C-level sum per slot.
    return [sum(words[i * ncpu : (i + 1) * ncpu]) for i in range(size)]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, ctypes._SimpleCData) else value
