"""`batch_allocations`: Python's cyclic garbage collector held off while a batch is decoded.

The collector starts a collection every 700 allocations of container objects (tuples,
lists, records) beyond those freed. Decoding a ring buffer makes several such objects per
record, nearly all freed by their reference counts as soon as the batch is kept; the
collections their count starts walk objects that need none of it: 29 % of the capture's CPU
time per record at ~190,000 records a second (tests/bench/bench_capture_decode.py). Held off
for the batch, the collector runs once after it if its count says so, over what survived.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def batch_allocations() -> Iterator[None]:
    """No automatic collection inside the block (unless someone disabled the collector
    already: then it stays as it was); one, if due, right after it."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
