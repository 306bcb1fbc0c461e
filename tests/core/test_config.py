"""Config file loading, overrides and the errors users see."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bpfdyno.core.config import ConfigError, load


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bpfdyno.toml"
    p.write_text(text)
    return p


def test_defaults() -> None:
    cfg = load(None)
    assert cfg.daemon.interval_s == 1.0
    assert cfg.daemon.history_s == 900.0
    assert cfg.grpc.socket == "/run/bpfdyno/bpfdyno.sock"
    assert cfg.grpc.tcp == ""
    assert cfg.collector_interval("host") == 1.0


def test_file_values_and_per_collector_interval(tmp_path: Path) -> None:
    p = write(
        tmp_path,
        "[daemon]\ninterval_s = 2\nhistory_s = 60\n\n[collectors.host]\ninterval_s = 0.5\n"
        '[export.jsonl]\nenabled = true\npath = "/tmp/x.jsonl"\n',
    )
    cfg = load(p)
    assert cfg.daemon.interval_s == 2.0
    assert cfg.collector_interval("host") == 0.5
    assert cfg.collector_interval("self") == 2.0
    assert cfg.export.jsonl.enabled and cfg.export.jsonl.path == "/tmp/x.jsonl"
    assert cfg.source == str(p)


def test_overrides_beat_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "[daemon]\ninterval_s = 2\n")
    cfg = load(p, [("daemon.interval_s", "5"), ("grpc.socket", "/tmp/a.sock")])
    assert cfg.daemon.interval_s == 5.0
    assert cfg.grpc.socket == "/tmp/a.sock"


@pytest.mark.parametrize(
    ("text", "line", "fragment"),
    [
        ("[daemon]\n\ninterval_sec = 2\n", 3, "unknown key 'daemon.interval_sec'"),
        ('[daemon]\ninterval_s = "fast"\n', 2, "'daemon.interval_s' must be a float"),
        ("[grpc]\nsocket_mode = true\n", 2, "'grpc.socket_mode' must be an integer"),
        ('[daemon]\nlog_level = "loud"\n', 2, "'daemon.log_level' must be one of"),
        ("[daemon]\ninterval_s = 0.001\n", 2, "at least 0.05"),
        ("[collectors.nope]\nenabled = false\n", 1, "unknown key 'collectors.nope'"),
        ("[daemon\ninterval_s = 1\n", 1, "TOML syntax error"),
        ('[grpc]\ntcp = "localhost"\n', 2, "must be host:port"),
        ("daemon = 3\n", 1, "'daemon' must be a table"),
    ],
)
def test_errors_name_file_line_and_key(tmp_path: Path, text: str, line: int, fragment: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert fragment in msg
    assert ei.value.line == line


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read the config file .*leave out --config"):
        load(tmp_path / "missing.toml")


def test_bad_override_names_the_command_line() -> None:
    with pytest.raises(ConfigError, match=r"command line: unknown key 'daemon.bogus'"):
        load(None, [("daemon.bogus", "1")])


def test_serve_with_bad_config_exits_2_and_starts_nothing(tmp_path: Path) -> None:
    p = write(tmp_path, "[daemon]\ninterval_s = -1\n")
    sock = tmp_path / "agent.sock"
    r = subprocess.run(
        [sys.executable, "-m", "bpfdyno", "serve", "--config", str(p), "--socket", str(sock)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert f"{p}:2: 'daemon.interval_s' must be at least 0.05" in r.stderr
    assert not sock.exists()


def test_bpf_sizes_are_read() -> None:
    cfg = load(
        None,
        [
            ("sched.max_exits", "300"),
            ("sched.ringbuf_pages", "4"),
            ("net.max_socks", "2000"),
            ("net.max_procs", "400"),
            ("net.ringbuf_pages", "8"),
            ("net.probe_sample_every", "1"),
            ("net.byte_source", "syscalls"),
        ],
    )
    assert (cfg.sched.max_exits, cfg.sched.ringbuf_pages) == (300, 4)
    assert (cfg.net.max_socks, cfg.net.max_procs, cfg.net.ringbuf_pages) == (2000, 400, 8)
    assert (cfg.net.probe_sample_every, cfg.net.byte_source) == (1, "syscalls")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[sched]\nmax_exits = 0\n", "'sched.max_exits' must be in 1..4194304, got 0"),
        ("[sched]\nmax_exits = 5000000\n", "'sched.max_exits' must be in 1..4194304"),
        ("[sched]\nringbuf_pages = 3\n", "'sched.ringbuf_pages' must be a power of two"),
        ("[net]\nmax_socks = 0\n", "'net.max_socks' must be in 1..16777216, got 0"),
        ("[net]\nmax_procs = -1\n", "'net.max_procs' must be in 1..4194304"),
        ("[net]\nringbuf_pages = 131072\n", "'net.ringbuf_pages' must be a power of two in"),
        ("[net]\nprobe_sample_every = 0\n", "'net.probe_sample_every' must be in 1..4294967295"),
        ('[net]\nbyte_source = "tcp"\n', "'net.byte_source' must be one of auto, sock, syscalls"),
        ('[net]\nmax_socks = "many"\n', "'net.max_socks' must be an integer"),
    ],
)
def test_bpf_size_errors_name_file_line_and_key(tmp_path: Path, text: str, fragment: str) -> None:
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as ei:
        load(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:2: "), msg
    assert fragment in msg


def test_capture_defaults_and_overrides() -> None:
    c = load(None).capture
    assert (c.enabled, c.default_tracks, c.pre_window_s) == (
        True,
        ["net", "sched", "nccl", "gpu", "fabric"],
        5.0,
    )
    c = load(None, [("capture.default_tracks", '["sched"]'), ("capture.pre_window_s", "0")]).capture
    assert (c.default_tracks, c.pre_window_s) == (["sched"], 0.0)


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("capture.default_tracks", '["net", "disk"]', "names an unknown track 'disk'"),
        ("capture.pre_window_s", "-1", "must be in 0..3600 seconds"),
        ("capture.ringbuf_pages", "3", "must be a power of two"),
        ("capture.max_events_per_process", "10", "must be in 100..100000000"),
        ("capture.max_processes", "0", "must be in 1..65536"),
        ("capture.net_coalesce_gap_us", "-5", "must be in 0..10000000"),
        ("capture.gpu_sample_hz", "0", "must be in 0.1..1000"),
        ("capture.fabric_sample_hz", "2000", "must be in 0.1..1000, got 2000"),
    ],
)
def test_capture_section_errors(key: str, value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        load(None, [(key, value)])
    assert f"'{key}'" in str(e.value) and fragment in str(e.value)


def test_fabric_and_irq_defaults_and_errors() -> None:
    cfg = load(None)
    assert (cfg.fabric.nic_interfaces, cfg.fabric.nic_queue_stats) == (["*"], False)
    assert (cfg.fabric.max_stats_per_interface, cfg.irq.max_irq_cpu_series) == (1024, 4096)
    assert cfg.capture.fabric_sample_hz == 10.0
    assert {"fabric", "irq"} <= set(cfg.collectors)
    for key, value, fragment in (
        ("fabric.nic_interfaces", '["eth*", " "]', "must hold interface names or shell patterns"),
        ("fabric.max_stats_per_interface", "-1", "must be in 0..65536, got -1"),
        ("irq.max_irq_cpu_series", "2000000", "must be in 0..1000000, got 2000000"),
    ):
        with pytest.raises(ConfigError) as e:
            load(None, [(key, value)])
        assert f"'{key}'" in str(e.value) and fragment in str(e.value), str(e.value)
