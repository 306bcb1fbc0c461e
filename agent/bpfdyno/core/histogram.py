"""Log2 histograms as the BPF programs fill them (``bpfdyno_log2`` in ``bpf/common.h``).

Slot k counts values v with floor(log2(v)) == k, i.e. [2**k, 2**(k+1)); slot 0 also counts
0, so it is [0, 2). Dependency-free, so exporters can decode histograms too.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

#: Slots of a log2 histogram of u64 values (``BPFDYNO_LOG2_SLOTS``; a test checks the header).
LOG2_SLOTS = 64


def log2_bucket_bounds(slot: int) -> tuple[float, float]:
    """The value range [low, high) of log2 histogram slot ``slot`` (the one decoder).

    Raises:
        ValueError: ``slot`` is outside 0..`LOG2_SLOTS` - 1.
    """
    if not 0 <= slot < LOG2_SLOTS:
        raise ValueError(f"log2 slot {slot} outside 0..{LOG2_SLOTS - 1}")
    return (0.0 if slot == 0 else float(2**slot), float(2 ** (slot + 1)))


def histogram_quantile(counts: Sequence[int], q: float) -> float:
    """The ``q`` quantile of a log2 histogram, interpolated linearly within its bucket.

    Args:
        counts: the count of each slot, from slot 0.
        q: the quantile, 0..1.

    Returns:
        The estimated value; NaN for an empty histogram.
    """
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    seen = 0
    for slot, n in enumerate(counts):
        if n <= 0:
            continue
        if seen + n >= rank:
            low, high = log2_bucket_bounds(slot)
            return low + (high - low) * max(rank - seen, 0.0) / n
        seen += n
    return log2_bucket_bounds(len(counts) - 1)[1]


def log2_export_buckets(
    counts: Sequence[int], scale: float, last_slot: int
) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """A log2 histogram as exporters want it: fixed finite bounds plus an overflow bucket.

    Exporters need the same buckets in every export (Prometheus' ``histogram_quantile`` and
    OTLP consumers compare them across time), so the bounds are fixed by ``last_slot``, not
    by where values happen to fall.

    Args:
        counts: the count of each slot, from slot 0.
        scale: multiplies the bounds into the exported unit (1e-9 for ns -> seconds).
        last_slot: the last slot exported on its own; later slots go to the overflow bucket.

    Returns:
        (upper bounds of slots 0..last_slot, their counts plus one overflow count). Slot k's
        bound is its exclusive upper end 2**(k+1) (see `log2_bucket_bounds`).

    Raises:
        ValueError: ``last_slot`` is outside 0..`LOG2_SLOTS` - 2.
    """
    bounds = _export_bounds(scale, last_slot)
    padded = list(counts[: last_slot + 1]) + [0] * max(0, last_slot + 1 - len(counts))
    overflow = sum(counts[last_slot + 1 :])
    return bounds, (*padded, overflow)


@functools.lru_cache(maxsize=16)
def _export_bounds(scale: float, last_slot: int) -> tuple[float, ...]:
    """The fixed bounds of `log2_export_buckets` (the same every round: computed once)."""
    if not 0 <= last_slot < LOG2_SLOTS - 1:
        raise ValueError(f"last_slot {last_slot} outside 0..{LOG2_SLOTS - 2}")
    return tuple(log2_bucket_bounds(k)[1] * scale for k in range(last_slot + 1))
