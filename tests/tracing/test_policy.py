"""Who may trace what, and how much a request may ask: the rules of bpfdyno.tracing.policy."""

from __future__ import annotations

import pytest

from bpfdyno.core.errors import PermissionDenied
from bpfdyno.core.identity import Requester, unattributed
from bpfdyno.tracing.config_text import ConfigRejected, check_config
from bpfdyno.tracing.policy import (
    TraceLimits,
    check_limits,
    ownership_problem,
    refuse_not_owner,
    require_attributed,
)

NOW = 1_800_000_000.0
LIMITS = TraceLimits(max_duration_ms=30_000, max_iterations=100, max_start_delay_s=120.0)
ALICE = Requester(uid=51001, transport="legacy-rpc", peer="127.0.0.1:40000")
ROOT = Requester(uid=0, transport="grpc-unix", peer="pid 1")


def limits_rule(text: str) -> str:
    try:
        check_limits(check_config(text, ["/tmp"], now_s=NOW), LIMITS, NOW)
    except ConfigRejected as e:
        return e.rule
    return ""


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        # The memory attack: 24 days of recording with stacks and shapes.
        (
            "ACTIVITIES_DURATION_MSECS=2147483647\nPROFILE_WITH_STACK=true\n"
            "PROFILE_REPORT_INPUT_SHAPES=true",
            "duration_too_long",
        ),
        ("ACTIVITIES_DURATION_MSECS=30001", "duration_too_long"),
        ("ACTIVITIES_DURATION_SECS=31", "duration_too_long"),
        ("PROFILE_MEMORY_DURATION_MSECS=30001", "duration_too_long"),
        ("ACTIVITIES_ITERATIONS=101", "too_many_iterations"),
        ("ACTIVITIES_WARMUP_ITERATIONS=101", "too_many_iterations"),
        ("PROFILE_START_ITERATION_ROUNDUP=10001", "start_too_late"),
        ("PROFILE_START_ITERATION=10001", "start_too_late"),
        ("ACTIVITIES_WARMUP_PERIOD_SECS=121", "start_too_late"),
        # Found on main: a start a year ahead kept the trainer busy until the daemon gave up.
        (f"PROFILE_START_TIME={int(NOW * 1000) + 365 * 86400 * 1000}", "start_too_late"),
        (f"PROFILE_START_TIME={int(NOW * 1000) + 121_000}", "start_too_late"),
        # At the limits: accepted.
        ("ACTIVITIES_DURATION_MSECS=30000", ""),
        ("ACTIVITIES_DURATION_SECS=30", ""),
        ("ACTIVITIES_ITERATIONS=100", ""),
        (f"PROFILE_START_TIME={int(NOW * 1000) + 120_000}", ""),
        ("PROFILE_START_ITERATION=0\nPROFILE_START_ITERATION_ROUNDUP=1000", ""),
    ],
)
def test_limits(text: str, rule: str) -> None:
    assert limits_rule(text) == rule


def test_refusal_names_the_key_and_the_limit() -> None:
    with pytest.raises(ConfigRejected) as info:
        check_limits(
            check_config("ACTIVITIES_DURATION_MSECS=2147483647", ["/tmp"], now_s=NOW), LIMITS, NOW
        )
    assert str(info.value).startswith("config rejected by rule 'duration_too_long'")
    assert "[tracing] max_duration_ms" in str(info.value)
    assert "limit of 30 s" in str(info.value)


def test_span_of_a_duration_trace() -> None:
    # Start 60 s ahead, 10 s long: the trace must be over 70 s from now.
    text = f"PROFILE_START_TIME={int(NOW * 1000) + 60_000}\nACTIVITIES_DURATION_MSECS=10000"
    assert check_limits(check_config(text, ["/tmp"], now_s=NOW), LIMITS, NOW) == 70.0
    # Start 0: ~7 s after delivery, 500 ms by default.
    assert check_limits(check_config("A=1", ["/tmp"], now_s=NOW), LIMITS, NOW) == 7.5
    assert (
        check_limits(check_config("ACTIVITIES_ITERATIONS=3", ["/tmp"], now_s=NOW), LIMITS, NOW) == 0
    )


def test_ownership() -> None:
    assert ownership_problem(ROOT, 51002) == ""
    assert ownership_problem(ROOT, None) == ""
    assert ownership_problem(ALICE, 51001) == ""
    assert "rule 'not_process_owner'" in ownership_problem(ALICE, 0)
    assert "belongs to uid 0 (root)" in ownership_problem(ALICE, 0)
    assert "rule 'unknown_process_owner'" in ownership_problem(ALICE, None)
    with pytest.raises(PermissionDenied) as info:
        refuse_not_owner(ALICE, [(4242, 0)])
    assert info.value.rule == "not_process_owner"
    assert "pid 4242 (uid 0 (root))" in str(info.value)
    assert "uid 51001 may trace only its own processes" in str(info.value)


def test_unattributed_requester_may_not_act() -> None:
    require_attributed(ALICE)
    who = unattributed("legacy-rpc", "10.0.0.9:5000", "the peer is not on this host")
    with pytest.raises(PermissionDenied) as info:
        require_attributed(who)
    assert info.value.rule == "unattributed_requester"
    assert "the peer is not on this host" in str(info.value)
