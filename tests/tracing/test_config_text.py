"""Output file names, log-file safety rules, and the Kineto config text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bpfdyno.rpc.traces import TraceSpec
from bpfdyno.tracing.config_text import (
    ConfigRejected,
    build_config,
    check_config,
    with_trace_id,
)
from bpfdyno.tracing.paths import PathRejected, check_log_file, kineto_output_path


@pytest.mark.parametrize(
    ("log_file", "expected"),
    [
        ("/tmp/t.pt.trace.json", "/tmp/t_42.pt.trace.json"),
        ("/tmp/t.json", "/tmp/t_42.json"),
        ("/tmp/t.json.gz", "/tmp/t_42.json.gz"),
        ("/tmp/a.json.pt.trace.json", "/tmp/a.json_42.pt.trace.json"),
        ("/tmp/trace", "/tmp/trace"),
    ],
)
def test_kineto_pid_rule(log_file: str, expected: str) -> None:
    assert kineto_output_path(log_file, 42) == expected


def test_dyno_cli_rule_was_wrong_for_pt_trace_json() -> None:
    # dyno prints replace(".json", "_<pid>.json"); Kineto writes something else.
    assert "/tmp/t.pt.trace.json".replace(".json", "_42.json") != kineto_output_path(
        "/tmp/t.pt.trace.json", 42
    )


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    (tmp_path / "ok").mkdir()
    (tmp_path / "x.json.d").mkdir()
    return tmp_path


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("", "empty"),
        ("{d}/ok/t.json\nPROFILE_START_TIME=1", "control_character"),
        ("{d}/ok/a=b.json", "equals_sign"),
        ("{d}/ok/a#b.json", "hash_sign"),
        ("ok/t.json", "not_absolute"),
        ("{d}/ok/../../etc/t.json", "dot_dot"),
        ("{d}/ok/", "not_a_file"),
        ("/etc/t.json", "outside_allowed_dirs"),
        ("{d}/x.json.d/t.json", "json_in_directory"),
        ("{d}/ok/" + "a" * 1100 + ".json", "too_long"),
        # Found on main: these passed the "printable" check.
        ("{d}/ok/t\u202egnp.json", "control_character"),  # right-to-left override
        ("{d}/ok/t\u2028x.json", "control_character"),  # line separator
        ("{d}/ok/t\u200bx.json", "control_character"),  # zero-width space
        # Found on main: an allowed directory itself was "outside the allowed dirs".
        ("{d}", "not_a_file"),
        ("{d}/ok", "not_a_file"),
    ],
)
def test_log_file_rules(allowed: Path, path: str, rule: str) -> None:
    with pytest.raises(PathRejected) as info:
        check_log_file(path.format(d=allowed), [str(allowed)])
    assert info.value.rule == rule
    assert rule in str(info.value)


def test_symlink_out_of_allowed_dir_is_rejected(
    allowed: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside")
    os.symlink(outside, allowed / "link")
    with pytest.raises(PathRejected) as info:
        check_log_file(f"{allowed}/link/t.json", [str(allowed)])
    assert info.value.rule == "outside_allowed_dirs"


def test_a_directory_only_the_writer_sees_is_left_to_the_placement_check(allowed: Path) -> None:
    """A trainer in a container writes in its own file system: its directory is checked there,
    once the writer is known (tracing/safety.py), not here where it may not exist."""
    path = f"{allowed}/only-in-the-container/t.json"
    assert check_log_file(path, [str(allowed)]) == path


def test_good_log_file_passes(allowed: Path) -> None:
    path = f"{allowed}/ok/t.pt.trace.json"
    assert check_log_file(path, [str(allowed)]) == path


def test_leading_double_slash_is_the_same_directory(allowed: Path) -> None:
    """Found on main: //tmp/x.json was refused as outside /tmp (normpath keeps '//')."""
    path = f"/{allowed}/ok/t.json"
    assert path.startswith("//")
    assert check_log_file(path, [str(allowed)]) == path
    assert check_log_file(f"{allowed}/ok/t.json", [f"/{allowed}"]) == f"{allowed}/ok/t.json"


def test_dyno_duration_config_text() -> None:
    text = build_config(TraceSpec(log_file="/tmp/t.json"))
    assert text == (
        "ACTIVITIES_LOG_FILE=/tmp/t.json\n"
        "PROFILE_START_TIME=0\n"
        "ACTIVITIES_DURATION_MSECS=500\n"
        "PROFILE_REPORT_INPUT_SHAPES=false\n"
        "PROFILE_WITH_STACK=false\n"
        "PROFILE_WITH_FLOPS=false\n"
        "PROFILE_WITH_MODULES=false"
    )


def test_dyno_iteration_config_text_with_options() -> None:
    opts = TraceSpec(
        log_file="/tmp/t.json",
        iterations=5,
        profile_start_iteration_roundup=100,
        record_shapes=True,
        with_stacks=True,
        with_flops=True,
        with_modules=True,
    )
    assert build_config(opts) == (
        "ACTIVITIES_LOG_FILE=/tmp/t.json\n"
        "PROFILE_START_ITERATION=0\n"
        "PROFILE_START_ITERATION_ROUNDUP=100\n"
        "ACTIVITIES_ITERATIONS=5\n"
        "PROFILE_REPORT_INPUT_SHAPES=true\n"
        "PROFILE_WITH_STACK=true\n"
        "PROFILE_WITH_FLOPS=true\n"
        "PROFILE_WITH_MODULES=true"
    )


def test_dyno_memory_config_text() -> None:
    text = build_config(TraceSpec(log_file="/tmp/t.json", duration_ms=2000, profile_memory=True))
    assert text.splitlines()[3:7] == [
        "PROFILE_REPORT_INPUT_SHAPES=false",
        "PROFILE_PROFILE_MEMORY=true",
        "PROFILE_MEMORY=true",
        "PROFILE_MEMORY_DURATION_MSECS=2000",
    ]
    with pytest.raises(ConfigRejected) as info:
        build_config(TraceSpec(log_file="/tmp/t.json", iterations=3, profile_memory=True))
    assert info.value.rule == "memory_needs_duration"


@pytest.mark.parametrize(
    ("opts", "rule"),
    [
        (TraceSpec(log_file="/tmp/t.json", duration_ms=0), "bad_option"),
        (
            TraceSpec(log_file="/tmp/t.json", iterations=2, profile_start_iteration_roundup=0),
            "bad_option",
        ),
        (TraceSpec(log_file="/tmp/t.json", profile_start_time_ms=-5), "bad_option"),
    ],
)
def test_bad_options(opts: TraceSpec, rule: str) -> None:
    with pytest.raises(ConfigRejected) as info:
        build_config(opts)
    assert info.value.rule == rule


NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("A=1\n" * 10_000, "too_large"),
        ("ACTIVITIES_DURATION_MSECS=500\r", "control_character"),
        ("ACTIVITIES_DURATION_MSECS 500", "line_syntax"),
        ("lower_key=1", "bad_key"),
        ("ACTIVITIES_LOG_FILE=/tmp/a=b.json", "bad_value_character"),
        ("REQUEST_TRACE_ID=abc", "trace_id_reserved"),
        ("ACTIVITIES_ITERATIONS=-1", "bad_integer"),
        ("ACTIVITIES_DURATION_MSECS=5s", "bad_integer"),
        ("ACTIVITIES_DURATION_MSECS=4294967296", "bad_integer"),
        ("PROFILE_WITH_STACK=maybe", "bad_boolean"),
        ("PROFILE_WITH_STACK=on", "bad_boolean"),
        (f"PROFILE_START_TIME={int(NOW * 1000) - 20_000}", "start_time_too_early"),
        (f"PROFILE_START_TIME={int(NOW * 1000) + 2_000}", "start_time_too_early"),
        ("ACTIVITIES_LOG_FILE=/etc/t.json", "outside_allowed_dirs"),
        ("ACTIVITIES_LOG_FILE=t.json", "not_absolute"),
        ("REQUEST_X=a\u2029b", "bad_value_character"),  # paragraph separator
    ],
)
def test_config_rules(text: str, rule: str) -> None:
    with pytest.raises(ConfigRejected) as info:
        check_config(text, ["/tmp"], now_s=NOW)
    assert info.value.rule == rule


def test_config_is_normalised_and_described() -> None:
    text = (
        "# a comment\n\n  ACTIVITIES_LOG_FILE = /tmp/t.json  # trailing comment\n"
        f"PROFILE_START_TIME={int(NOW * 1000) + 10_000}\nACTIVITIES_ITERATIONS=3\n"
        "PROFILE_MEMORY=T\n"
    )
    checked = check_config(text, ["/tmp"], now_s=NOW)
    assert checked.text == (
        f"ACTIVITIES_LOG_FILE=/tmp/t.json\nPROFILE_START_TIME={int(NOW * 1000) + 10_000}\n"
        "ACTIVITIES_ITERATIONS=3\nPROFILE_MEMORY=T"
    )
    assert checked.log_file == "/tmp/t.json"
    assert checked.iteration_mode
    assert checked.memory_snapshot
    assert with_trace_id("A=1", "ff") == "A=1\nREQUEST_TRACE_ID=ff"
