"""The [kineto], [tracing] and [legacy_rpc] config sections: defaults and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from bpfdyno.app.tracing import allowed_dirs
from bpfdyno.core.config import ConfigError, load


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KINETO_IPC_SOCKET_DIR", raising=False)
    cfg = load(None)
    assert cfg.kineto.socket_dir == ""  # the abstract name @dynolog@
    assert (cfg.kineto.registry_max_entries, cfg.kineto.expire_after_s) == (4096, 60.0)
    assert cfg.tracing.allowed_dirs == ["/tmp"]
    assert cfg.legacy_rpc.enabled
    assert cfg.legacy_rpc.listen == ["127.0.0.1:1778", "[::1]:1778"]
    monkeypatch.setenv("KINETO_IPC_SOCKET_DIR", "/run/kineto")
    assert load(None).kineto.socket_dir == "/run/kineto"


def test_trace_dir_is_allowed_too(tmp_path: Path) -> None:
    f = tmp_path / "c.toml"
    f.write_text('[tracing]\ntrace_dir = "/data/traces"\nallowed_dirs = ["/tmp", "/scratch"]\n')
    assert allowed_dirs(load(f)) == ["/tmp", "/scratch", "/data/traces"]


@pytest.mark.parametrize(
    ("toml", "line", "message"),
    [
        ('[kineto]\nsocket_dir = "relative"\n', 2, "'kineto.socket_dir' must be an absolute"),
        ('[kineto]\nsocket_dir = "/' + "d" * 60 + '"\n', 2, "too long for a Unix socket"),
        ("[kineto]\nregistry_max_entries = 0\n", 2, "'kineto.registry_max_entries' must be"),
        ("[kineto]\nexpire_after_s = 1\n", 2, "'kineto.expire_after_s' must be at least 5"),
        ('[tracing]\nallowed_dirs = ["/tmp/../etc"]\n', 2, "without '..'"),
        ('[tracing]\ntrace_dir = "traces"\n', 2, "'tracing.trace_dir' must hold absolute"),
        ("[tracing]\ndefault_timeout_s = 0\n", 2, "'tracing.default_timeout_s'"),
        ('[legacy_rpc]\nlisten = ["1778"]\n', 2, "must be host:port"),
        ('[legacy_rpc]\nlisten = ["127.0.0.1:99999"]\n', 2, "must be host:port"),
        ("[legacy_rpc]\ntimeout_s = -1\n", 2, "'legacy_rpc.timeout_s'"),
        ("[legacy_rpc]\nenabled = 1\n", 2, "must be true or false"),
    ],
)
def test_bad_values_name_file_line_and_key(
    tmp_path: Path, toml: str, line: int, message: str
) -> None:
    f = tmp_path / "bpfdyno.toml"
    f.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load(f)
    assert str(info.value).startswith(f"{f}:{line}: ")
    assert message in str(info.value)
