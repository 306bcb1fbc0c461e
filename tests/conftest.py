"""Fixtures shared by more than one test directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bpfdyno.sources.irq.collector import IrqCollector


@pytest.fixture
def fresh_irq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IrqCollector]:
    """The interrupt collector with its BPF program in the kernel, for one test (a test that
    takes or holds its budget step leaves nothing behind for the next)."""
    c = IrqCollector(header_cache=tmp_path_factory.mktemp("kheaders"))
    c.start()
    try:
        yield c
    finally:
        c.close()
