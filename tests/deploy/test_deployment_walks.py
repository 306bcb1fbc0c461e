"""docs/deployment.md's walks from zero to a trace: every ``bpfdyno`` command in them is one
the command line takes as written (its options exist, their values are of the right form),
and every test a walk names exists. (What the commands do is what those tests run.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from bpfdyno.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
#: What the walks' shell variables stand for, as the commands before them set them.
VARIABLES = {
    "$PID": "4242",
    "$POD_UID": "5f0c2a9e-1b3d-4e6f-8a7b-9c0d1e2f3a4b",
    "$(podman inspect -f '{{.State.Pid}}' trainer)": "4242",
    "JOBID": "1234",
}


def walks() -> str:
    text = (REPO / "docs" / "deployment.md").read_text()
    start = text.index("## From zero to a trace")
    return text[start : text.index("\n## ", start + 1)]


def commands() -> list[str]:
    """Each ``bpfdyno ...`` command of the walks' shell blocks, continuation lines joined,
    comments and what runs it (sudo, kubectl exec) left out."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", walks(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip().rstrip("&").strip()
            m = re.search(r"(?:^|sudo |-- )(bpfdyno .*)$", line)
            if m:
                out.append(m.group(1))
    return out


def test_the_walks_have_their_commands() -> None:
    assert len(commands()) == 10


@pytest.mark.parametrize("command", commands())
def test_each_command_is_taken_as_written(command: str) -> None:
    for name, value in VARIABLES.items():
        command = command.replace(name, value)
    argv = shlex.split(command)[1:]
    build_parser().parse_args(argv)  # exits 2 (a failure here) on an option it does not take


def test_every_test_a_walk_names_exists() -> None:
    named = set(re.findall(r"`(tests/[\w/]+\.py)`", walks()))
    assert len(named) == 6
    assert {n for n in named if not (REPO / n).is_file()} == set()
