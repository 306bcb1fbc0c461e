"""The one way bpfdyno reads BPF maps: whole maps in batches, per-CPU arrays by slot.

Keys and values of scalar types come back as Python ints, structs as bcc's ctypes structs;
a per-CPU map's value is bcc's array of one value per *possible* CPU.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import Any

#: errnos of a kernel (< 5.6) or map type without BPF_MAP_LOOKUP_BATCH.
_NO_BATCH = (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS)


def map_items(table: Any, chunk: int = 1024) -> list[tuple[Any, Any]]:
    """All (key, value) pairs of a bcc hash or array map (per-CPU ones too), in batches.

    One ``BPF_MAP_LOOKUP_BATCH`` syscall per ``chunk`` entries instead of two per entry.
    bcc's own ``items_lookup_batch`` allocates ``max_entries``-sized arrays on every call and
    shares one variable between the in and out cursors, hence this. Falls back to key-by-key
    iteration on kernels without batch operations (< 5.6).

    Args:
        table: a bcc table (``BpfProgram.table(name)``).
        chunk: entries per syscall (at most the map's size is allocated).

    Returns:
        Every entry, in the kernel's order.

    Raises:
        OSError: the batch lookup failed for another reason.
    """
    from bcc.libbcc import lib

    chunk = max(1, min(chunk, int(table.max_entries)))
    out: list[tuple[Any, Any]] = []
    in_tok = ctypes.c_uint32(0)
    out_tok = ctypes.c_uint32(0)
    count = ctypes.c_uint32(0)
    first = True
    while True:
        # Fresh buffers per chunk: the returned values are views into them.
        keys = (table.Key * chunk)()
        vals = (table.Leaf * chunk)()
        count.value = chunk
        res = lib.bpf_lookup_batch(
            table.map_fd,
            None if first else ctypes.byref(in_tok),
            ctypes.byref(out_tok),
            ctypes.byref(keys),
            ctypes.byref(vals),
            ctypes.byref(count),
        )
        err = ctypes.get_errno()
        out.extend(zip(keys[: count.value], vals[: count.value], strict=True))
        if res == 0:
            in_tok.value = out_tok.value
            first = False
            continue
        if err == errno.ENOENT:  # the last batch
            return out
        if first and err in _NO_BATCH:
            return [(_plain(k), _plain(v)) for k, v in table.items()]
        raise OSError(err, f"BPF_MAP_LOOKUP_BATCH failed: {os.strerror(err)}")


def percpu_values(table: Any, index: int = 0) -> list[Any]:
    """Slot ``index`` of a per-CPU array, one value per possible CPU (one syscall)."""
    return list(table.getvalue(table.Key(index)))


def percpu_sums(table: Any) -> list[int]:
    """Every slot of a per-CPU array of integers, summed over the CPUs (batched reads)."""
    out = [0] * int(table.max_entries)
    for key, per_cpu in map_items(table):
        out[int(key)] = sum(int(v) for v in per_cpu)
    return out


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, ctypes._SimpleCData) else value
