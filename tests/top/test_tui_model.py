"""The UI's pure model: metric history, a process's history, event log, formatting.

Sorting and filtering processes is the API's (tests/rpc/test_process_vocabulary.py).
"""

from __future__ import annotations

import math

from bpfdyno.rpc.agent import Label, MetricKind, MetricSpec, MetricsSnapshot, Point, Series
from bpfdyno.rpc.kernel import KernelEvent
from bpfdyno.rpc.processes import ProcessList, ProcessRow
from bpfdyno.rpc.traces import (
    ProcessTrace,
    ProcessTraceState,
    SkippedProcess,
    TraceStart,
    TraceStatus,
    TriggeredProcess,
)
from bpfdyno.tui.fmt import (
    bar,
    fmt_bytes,
    fmt_duration,
    fmt_ns,
    fmt_percent,
    fmt_si,
    fmt_value,
    sparkline,
    unit_from_name,
)
from bpfdyno.tui.model import EventLog, MetricsModel, ProcessHistory, TraceLine, TraceProgress

NAN = float("nan")


def _round(ts: float, *values: tuple[str, tuple[tuple[str, str], ...], float]) -> MetricsSnapshot:
    series = tuple(
        Series(n, tuple(Label(*pair) for pair in lab), (Point(ts, v),)) for n, lab, v in values
    )
    return MetricsSnapshot(ts, "host", series)


def test_metrics_latest_history_and_label_order() -> None:
    m = MetricsModel(history_points=3)
    for i in range(5):
        m.apply_round(_round(100.0 + i, ("x_ratio", (("a", "1"), ("b", "2")), i / 10)))
    # Label order does not matter for lookups; only the last 3 points are kept.
    assert m.latest("x_ratio", (("b", "2"), ("a", "1"))) == 0.4
    assert m.history("x_ratio", (("a", "1"), ("b", "2"))) == [0.2, 0.3, 0.4]
    assert math.isnan(m.latest("x_ratio", (("a", "9"), ("b", "2"))))
    assert m.history("missing") == []


def test_metrics_nan_is_not_stored_and_stale_series_disappear() -> None:
    m = MetricsModel(stale_after_s=10.0)
    m.apply_round(_round(100.0, ("net_rx_bytes_per_second", (("interface", "eth1"),), 5.0)))
    m.apply_round(_round(101.0, ("net_rx_bytes_per_second", (("interface", "eth1"),), NAN)))
    assert m.history("net_rx_bytes_per_second", (("interface", "eth1"),)) == [5.0]
    for ts in range(102, 112):
        m.apply_round(_round(float(ts), ("net_rx_bytes_per_second", (("interface", "eth0"),), 1.0)))
    # eth1's last point (t=100) is 11 s older than the newest round (t=111): gone.
    assert m.label_values("net_rx_bytes_per_second", "interface") == ["eth0"]
    assert math.isnan(m.latest("net_rx_bytes_per_second", (("interface", "eth1"),)))


def test_metrics_window_then_stream_keeps_each_timestamp_once() -> None:
    m = MetricsModel()
    m.apply_window([Series("load_average_1m", (), (Point(10.0, 1.0), Point(11.0, 2.0)))])
    m.apply_round(_round(11.0, ("load_average_1m", (), 2.0)))
    m.apply_round(_round(12.0, ("load_average_1m", (), 3.0)))
    assert m.history("load_average_1m") == [1.0, 2.0, 3.0]
    assert m.now == 12.0


def test_an_estimated_stretch_stays_in_its_series_and_shows_marked() -> None:
    # The budget samples the byte programs: the agent's host-wide rate becomes a series of its
    # own, labelled estimate="sampled", for as long as the step holds; the view keeps one
    # series and marks the values that are estimates.
    m = MetricsModel(stale_after_s=10.0)
    m.set_specs([MetricSpec("net_udp_sent_bytes_per_second", MetricKind.RATE, "bytes/s", "")])
    udp = "net_udp_sent_bytes_per_second"
    m.apply_round(_round(100.0, (udp, (), 1000.0)))
    m.apply_round(_round(101.0, (udp, (("estimate", "sampled"),), 8000.0)))
    assert m.history(udp) == [1000.0, 8000.0]
    assert m.estimated(udp) and m.show(udp) == "~7.8K/s"
    for ts in range(102, 115):  # still fresh after the exact series' own last point aged out
        m.apply_round(_round(float(ts), (udp, (("estimate", "sampled"),), 8000.0)))
    assert m.latest(udp) == 8000.0
    m.apply_round(_round(115.0, (udp, (), 2048.0)))
    assert not m.estimated(udp) and m.show(udp) == "2.0K/s"
    # A window brings the exact series first, then the estimated one: one ordered history.
    w = MetricsModel()
    w.apply_window(
        [
            Series(udp, (), (Point(10.0, 1.0), Point(13.0, 4.0))),
            Series(udp, (Label("estimate", "sampled"),), (Point(11.0, 2.0), Point(12.0, 3.0))),
        ]
    )
    assert w.history(udp) == [1.0, 2.0, 3.0, 4.0]
    assert not w.estimated(udp)


def test_label_values_natural_order_and_units() -> None:
    m = MetricsModel()
    m.set_specs([MetricSpec("cpu_utilization_ratio", MetricKind.RATIO, "ratio", labels=("cpu",))])
    m.apply_round(
        _round(
            1.0,
            *(("cpu_utilization_ratio", (("cpu", c),), 0.5) for c in ("10", "2", "total", "0")),
        )
    )
    assert m.label_values("cpu_utilization_ratio", "cpu") == ["0", "2", "10", "total"]
    assert m.unit("cpu_utilization_ratio") == "ratio"
    assert m.unit("disk_read_bytes_per_second") == "bytes/s"  # no spec: from the name


def test_metrics_series_cap() -> None:
    m = MetricsModel(max_series=2)
    m.apply_round(_round(1.0, *(("m", (("k", str(i)),), 1.0) for i in range(5))))
    assert m.label_values("m", "k") == ["0", "1"]


ROWS = [
    ProcessRow(10, comm="p", cpu_ratio=0.5, rss_bytes=300, cmdline="python train.py"),
    ProcessRow(11, comm="kworker", cpu_ratio=NAN),
    ProcessRow(12, comm="p", cpu_ratio=0.9, rss_bytes=100, cmdline="/bin/sleep 5"),
]


def test_event_log_bounded_counts_and_kinds() -> None:
    log = EventLog(maxlen=3)
    log.add(KernelEvent(i, kind) for i, kind in enumerate(["exec", "tcp_reset", "exec", "exit"]))
    assert [e.unix_ns for e in log.newest_first()] == [3, 2, 1]
    assert [e.unix_ns for e in log.newest_first(["tcp_"])] == [1]
    assert dict(log.counts) == {"exec": 2, "tcp_reset": 1, "exit": 1}


def test_process_history_follows_one_pid_and_marks_absence() -> None:
    h = ProcessHistory(12)
    h.add(ProcessList(tuple(ROWS), 1.0, 4))
    h.add(ProcessList(tuple(ROWS), 1.0, 4))  # the same table again: ignored
    h.add(ProcessList((ROWS[0],), 2.0, 4))
    first, second = h.cpu
    assert first == 0.9
    assert math.isnan(second)
    assert len(h.rss) == 2


def test_a_trace_request_followed_from_its_start_to_its_files() -> None:
    start = TraceStart(
        "t1",
        processes_matched=(10, 11, 12),
        triggered=(TriggeredProcess(10, 7, "/t/a_10.json"),),
        busy=(SkippedProcess(11, 7, "busy: its profiler is tracing"),),
        over_limit=(SkippedProcess(12, 7, "over the process limit of 1"),),
        not_matched=(SkippedProcess(13, 8, "its job id is 8"),),
    )
    started = TraceProgress(start)
    assert (started.state, started.message, started.finished) == (
        "started",
        "1 triggered, 1 busy, 1 over the process limit",
        False,
    )
    skipped = [
        TraceLine(11, "busy", message="busy: its profiler is tracing"),
        TraceLine(12, "over limit", message="over the process limit of 1"),
    ]
    assert started.lines() == [TraceLine(10, "pending", "/t/a_10.json"), *skipped]
    late = ProcessTrace(10, 7, "/t/a_10.json", ProcessTraceState.TIMED_OUT, "no file after 60 s")
    done = TraceProgress(start, TraceStatus("t1", processes=(late,), done=True))
    assert (done.state, done.message, done.finished) == ("failed", "0 written, 1 failed", True)
    # The watch reports the triggered process only; who was skipped stays listed.
    assert done.lines() == [
        TraceLine(10, "timed out", "/t/a_10.json", None, "no file after 60 s"),
        *skipped,
    ]
    nothing = TraceProgress(TraceStart("t2", not_matched=start.not_matched))
    assert (nothing.state, nothing.finished) == ("nothing traced", True)
    assert nothing.message == "0 triggered, no registered process matched"
    assert nothing.lines() == [TraceLine(13, "not matched", message="its job id is 8")]


def test_formatting_by_unit() -> None:
    assert fmt_bytes(512) == "512B"
    assert fmt_bytes(1536) == "1.5K"
    assert fmt_bytes(200 * 1024**2) == "200M"
    assert fmt_bytes(None) == "-"
    assert fmt_si(950) == "950"
    assert fmt_si(1234) == "1.2k"
    assert fmt_si(2.5) == "2.5"
    assert fmt_si(NAN, "/s") == "-"
    assert fmt_percent(0.456) == "46%"
    assert fmt_duration(3725) == "1h02m"
    assert fmt_duration(3 * 86400 + 4 * 3600) == "3d04h"
    assert fmt_duration(59) == "59s"
    assert fmt_ns(87.4) == "87ns"
    assert fmt_ns(1500) == "1.5us"
    assert fmt_value(1_500_000, "bytes/s") == "1.4M/s"
    assert fmt_value(0.25, "ratio") == "25%"
    assert fmt_value(12_345, "1/s") == "12.3k/s"
    assert fmt_value(64.4, "celsius") == "64°C"
    assert fmt_value(512, "watts") == "512W"
    assert fmt_value(1.41e9, "hertz") == "1.4GHz"
    assert fmt_value(NAN, "bytes") == "-"
    assert unit_from_name("gpu_power_watts") == "watts"


def test_sparkline_and_bar() -> None:
    assert sparkline([0.0, 0.5, 1.0], 3, top=1.0) == "▁▅█"
    assert sparkline([1.0, NAN], 4, top=1.0) == "  █ "
    assert sparkline([], 3) == "   "
    assert sparkline([0.0, 0.0], 2) == "▁▁"  # all zero: a flat floor, not blanks
    assert bar(0.5, 4) == "██  "
    assert bar(0.3, 10) == "███       "
    assert bar(NAN, 3) == "   "
