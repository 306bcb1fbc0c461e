"""The command line's structure: every command registered the same way, and doctor's status."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from bpfdyno.app import doctor
from bpfdyno.cli.main import COMMAND_GROUPS, build_parser, main

COMMANDS = [
    "serve",
    "status",
    "version",
    "metrics",
    "doctor",
    "ps",
    "events",
    "trainers",
    "kineto-dir",
    "gputrace",
    "dcgm-pause",
    "dcgm-resume",
    "trace-summary",
    "timeline",
    "audit",
    "top",
    "run",
]


def test_every_command_has_its_handler_from_its_groups_register() -> None:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == COMMANDS
    for name, command in sub.choices.items():
        handler = command.get_default("handler")
        assert callable(handler), name
        # Each handler lives in the module of the group that registered it.
        assert handler.__module__ in {g.__name__ for g in COMMAND_GROUPS}, name


def test_doctor_exit_status_is_the_doctors_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = doctor.Check("bpf-syscall", False, "no BPF", "run as root")
    optional = doctor.Check("nvml", False, "no GPU", "install the driver", required=False)
    monkeypatch.setattr(doctor, "run_checks", lambda cfg: [missing, optional])
    config = ["doctor", "--config", str(tmp_path / "none.toml")]
    (tmp_path / "none.toml").write_text("")
    assert main(config) == doctor.exit_code([missing, optional]) == 1
    assert "no BPF" in capsys.readouterr().out
    monkeypatch.setattr(doctor, "run_checks", lambda cfg: [optional])
    assert main(config) == doctor.exit_code([optional]) == 0
    monkeypatch.setattr(doctor, "exit_code", lambda checks: 7)  # the CLI has no rule of its own
    assert main(config) == 7
