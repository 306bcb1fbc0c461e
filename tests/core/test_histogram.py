"""Decoding the BPF programs' log2 histograms (``bpfdyno_log2`` in ``bpf/common.h``)."""

from __future__ import annotations

import importlib.resources
import math
import re

import pytest

from bpfdyno.core import histogram


def test_log2_bucket_decoding() -> None:
    assert histogram.log2_bucket_bounds(0) == (0.0, 2.0)
    assert histogram.log2_bucket_bounds(1) == (2.0, 4.0)
    assert histogram.log2_bucket_bounds(10) == (1024.0, 2048.0)
    with pytest.raises(ValueError):
        histogram.log2_bucket_bounds(64)
    counts = [0] * 64
    counts[3] = 4  # four values in [8, 16)
    assert histogram.histogram_quantile(counts, 0.5) == 12.0
    assert histogram.histogram_quantile(counts, 1.0) == 16.0
    counts[10] = 4  # four more in [1024, 2048)
    assert histogram.histogram_quantile(counts, 0.75) == 1536.0
    assert math.isnan(histogram.histogram_quantile([0] * 64, 0.5))


def test_slot_count_matches_the_c_header() -> None:
    header = (importlib.resources.files("bpfdyno.bpf") / "common.h").read_text()
    m = re.search(r"#define BPFDYNO_LOG2_SLOTS (\d+)", header)
    assert m is not None
    assert int(m[1]) == histogram.LOG2_SLOTS
