"""Naming a job's nodes by hand, job ids as SLURM writes them, and the common start time.

SLURM itself is exercised in tests/cluster (a real cluster); these are the pure rules.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bpfdyno.client.cluster import (
    ClockOffset,
    JobRef,
    Node,
    NodeResolutionError,
    parse_hosts,
    plan_start_time_ms,
    read_hosts_file,
)
from bpfdyno.client.cluster.clock import offset_from_times
from bpfdyno.rpc.traces import KINETO_WARMUP_S


def test_hosts_with_and_without_ports() -> None:
    nodes = parse_hosts("node1, node2:50052 10.0.0.5,[fd00::5]:7000,[::1],node1", port=50051)
    assert nodes == [
        Node("node1", "node1:50051"),
        Node("node2", "node2:50052"),
        Node("10.0.0.5", "10.0.0.5:50051"),
        Node("fd00::5", "[fd00::5]:7000"),
        Node("::1", "[::1]:50051"),
    ]  # the second node1 is the same agent: asked once


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no hosts given"),
        ("node1,no/slash", "'no/slash' is not a host"),
        ("node1:0", "the port must be in 1..65535"),
        ("node1:99999", "the port must be in 1..65535"),
    ],
)
def test_bad_hosts_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(NodeResolutionError, match=message):
        parse_hosts(text)


def test_hosts_file_with_comments_and_blank_lines(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("# rack 1\nnode1\n\nnode2:50052  # the odd one\nnode3, node4\n")
    assert [n.target for n in read_hosts_file(f, port=9)] == [
        "node1:9",
        "node2:50052",
        "node3:9",
        "node4:9",
    ]
    with pytest.raises(NodeResolutionError, match=r"cannot read the hosts file .*/missing"):
        read_hosts_file(tmp_path / "missing")
    (tmp_path / "empty").write_text("# nobody\n")
    with pytest.raises(NodeResolutionError, match=r"empty: no hosts given"):
        read_hosts_file(tmp_path / "empty")


def test_job_ids_as_slurm_writes_them() -> None:
    assert JobRef.parse("1234") == JobRef("1234", 1234)
    assert JobRef.parse(" 1234_5 ") == JobRef("1234_5", 1234, array_task=5)
    assert JobRef.parse("1234+1") == JobRef("1234+1", 1234, het_offset=1)
    assert JobRef.parse("1234").plain and not JobRef.parse("1234_5").plain
    for bad in ("", "abc", "12_", "1+2+3", "12_[1-3]"):
        with pytest.raises(NodeResolutionError, match="is not a SLURM job id"):
            JobRef.parse(bad)


def test_clock_offset_from_ntp_times() -> None:
    # Sent at 100.0, the agent (2.5 s ahead) got it at 102.6 and answered at 102.7, back at
    # 100.3: 0.2 s on the wire, 0.1 s in the agent.
    c = offset_from_times(100.0, 102.6, 102.7, 100.3)
    assert c.round_trip_s == pytest.approx(0.2)
    assert c.offset_s == pytest.approx(2.5)
    assert c.uncertainty_s == pytest.approx(0.1)


def test_common_start_leaves_room_for_the_slowest_host() -> None:
    now = 1_800_000_000.0
    # No clock ahead, a 50 ms round trip: poll interval + warm-up + 2 s margin + 0.05 s,
    # rounded up to the next 0.1 s.
    assert KINETO_WARMUP_S == 5.0
    start = plan_start_time_ms(now, [ClockOffset(-1.0, 0.05)], poll_interval_s=5)
    assert start == 1_800_000_012_100
    # A host 3 s ahead would otherwise see the start 3 s sooner: it sets the pace.
    start = plan_start_time_ms(
        now + 0.0123, [ClockOffset(3.0, 0.01), ClockOffset(0.0, 0.2), None], poll_interval_s=1
    )
    assert start == 1_800_000_011_100  # now + 0.0123 + 3.01 + 1 + 5 + 2 = +11.0223 s
