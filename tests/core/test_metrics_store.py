"""Metric registry and bounded store."""

from __future__ import annotations

import math

import pytest

from bpfdyno.core.catalog import Catalog
from bpfdyno.core.metrics import MetricKind, MetricTable, sample
from bpfdyno.core.store import MetricStore

TABLE = MetricTable("t")
TEMP = TABLE.declare(
    "t_temperature_celsius", MetricKind.GAUGE, "celsius", "A temperature.", ("dev",)
)
LOAD = TABLE.declare("t_load_ratio", MetricKind.RATIO, "ratio", "A load.")
REG = Catalog([TABLE])


def test_declare_twice_is_an_error() -> None:
    reg = MetricTable("x")
    reg.declare("x_bytes", MetricKind.GAUGE, "bytes", "x")
    with pytest.raises(ValueError, match="declared twice"):
        reg.declare("x_bytes", MetricKind.GAUGE, "bytes", "x")


def test_two_tables_declaring_one_name_is_an_error() -> None:
    a, b = MetricTable("a"), MetricTable("b")
    a.declare("x_bytes", MetricKind.GAUGE, "bytes", "x")
    b.declare("x_bytes", MetricKind.GAUGE, "bytes", "x")
    with pytest.raises(ValueError, match="declared by both 'a' and 'b'"):
        Catalog([a, b])


def test_registry_iterates_sorted_and_answers_membership() -> None:
    assert [s.name for s in REG] == ["t_load_ratio", "t_temperature_celsius"]
    assert "t_load_ratio" in REG and "nope" not in REG
    assert REG.get("t_load_ratio") is LOAD


def test_sample_checks_labels() -> None:
    s = sample(TEMP, 41, {"dev": "0"})
    assert s.value == 41.0 and s.labels == (("dev", "0"),)
    with pytest.raises(ValueError, match="declares labels"):
        sample(TEMP, 1, {"gpu": "0"})
    with pytest.raises(ValueError, match="needs labels"):
        sample(TEMP, 1)


def test_store_bounds_points_per_series() -> None:
    store = MetricStore(history_s=10, interval_s=1)
    assert store.points_per_series == 11
    for i in range(30):
        store.append(1000.0 + i, [sample(LOAD, i / 100)])
    (view,) = store.window(0, 1e12)
    assert len(view.points) == 11
    assert view.points[0].ts == 1019.0 and view.points[-1].value == pytest.approx(0.29)


def test_store_latest_window_and_filters() -> None:
    store = MetricStore(history_s=60, interval_s=1)
    store.append(100.0, [sample(TEMP, 40, {"dev": "0"}), sample(TEMP, 50, {"dev": "1"})])
    store.append(101.0, [sample(TEMP, 41, {"dev": "0"}), sample(LOAD, 0.5)])
    latest = {(v.spec.name, v.labels): v.points[0] for v in store.latest()}
    assert latest[("t_temperature_celsius", (("dev", "0"),))].value == 41
    assert latest[("t_temperature_celsius", (("dev", "1"),))].ts == 100.0
    assert [v.spec.name for v in store.latest(["t_load*"])] == ["t_load_ratio"]
    # dev=1 stopped reporting at 100: a horizon after that leaves it out
    assert len(store.latest(["t_temperature_celsius"], newer_than=100.5)) == 1
    win = store.window(100.5, 101.0, ["t_temperature_celsius"])
    assert [(v.labels, [p.value for p in v.points]) for v in win] == [((("dev", "0"),), [41.0])]


def test_store_skips_not_available_values() -> None:
    store = MetricStore(history_s=60, interval_s=1)
    store.append(1.0, [sample(LOAD, math.nan)])
    assert store.latest() == []
    store.append(2.0, [sample(LOAD, 0.25)])
    assert [p.value for p in store.window(0, 10)[0].points] == [0.25]


def test_store_caps_series_count_evicting_least_recently_updated() -> None:
    store = MetricStore(history_s=60, interval_s=1, max_series=3)
    for dev in range(3):
        store.append(1.0, [sample(TEMP, dev, {"dev": str(dev)})])
    store.append(2.0, [sample(TEMP, 9, {"dev": "0"})])  # dev 0 is now the freshest
    store.append(3.0, [sample(TEMP, 3, {"dev": "3"})])  # evicts dev 1
    devs = sorted(v.labels[0][1] for v in store.latest())
    assert devs == ["0", "2", "3"]
    assert store.evicted_series == 1
    assert len(store) == 3


def test_name_filter_matches_names_and_prefixes_as_the_patterns_say() -> None:
    from bpfdyno.core.store import NameFilter, name_filter

    f = NameFilter(["sched_runqueue_latency_seconds", "net_*", "net_tcp_*", "gpu_util*"])
    assert [
        f.matches(n)
        for n in (
            "sched_runqueue_latency_seconds",
            "sched_runqueue_latency_seconds_bucket",
            "net_tcp_rx_bytes",
            "net_udp_tx_bytes",
            "gpu_utilization_ratio",
            "gpu_memory_used_bytes",
            "ne",
        )
    ] == [True, False, True, True, True, False, False]
    assert f.matches("net_udp_tx_bytes")  # the second answer, from what it kept
    assert NameFilter([]).matches("anything")
    # One index per distinct set, whatever the order or repeats.
    assert name_filter(["b", "a*", "b"]) is name_filter(["a*", "b"])
    assert name_filter(["a*"]) is not name_filter(["b*"])
