"""Deltas of cumulative hardware and kernel counters that may wrap.

Drivers keep their counters in fields of different widths: InfiniBand port counters of 16,
32 or 64 bits, mlx5 queue counters of 32 bits, /proc/interrupts of 32 bits, most others of
64. A reading lower than the previous one is a wrap when, read as a wrap of the narrowest
width that holds the previous value (32 or 64 bits), the counter advanced by less than half
that range; otherwise it was reset (a driver reload, a device replaced, counters cleared)
and there is no delta for that interval. A 32-bit counter that wraps twice between two
readings cannot be told from one that wrapped once: read such counters faster than
2**31 events per interval.

(InfiniBand PMA error counters saturate at their maximum instead of wrapping, as the
specification says: they then stop moving, which this reads as no change.)
"""

from __future__ import annotations

_WIDTHS = (32, 64)


def counter_delta(before: int, after: int) -> int | None:
    """How much a cumulative counter advanced from ``before`` to ``after``.

    Returns:
        The advance (a wrap of a 32- or 64-bit counter accounted for), or None when the
        counter was reset (see the module docstring).
    """
    if after >= before:
        return after - before
    for bits in _WIDTHS:
        if before < 1 << bits:
            advanced = (after - before) % (1 << bits)
            return advanced if advanced < 1 << (bits - 1) else None
    return None
