"""Refusals tell a user nothing she could not see herself (issue 28, finding 10).

The agent checks a log-file path with its own rights; a user naming paths behind a
directory she may not enter must not learn from the answers whether something there
exists, what type it is, where root's links point, or whose it is. Tried as a real
unprivileged user on the gRPC front (bpfdyno gputrace) and the legacy port (dyno's frames):
every answer is the same bytes but the path she gave, and still says what to do.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from security_site import Site, registered
from tracing_harness import dyno_gputrace_bytes

from bpfdyno.tracing.paths import kineto_output_path
from bpfdyno.tracing.safety import visible_to

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: uid of "another user" owning a directory behind the private one.
OTHER_UID = 65534


def hidden_paths(site: Site) -> list[str]:
    """Log-file paths behind a root-only 0700 directory, each a different case."""
    private = site.h.base / "private"
    private.mkdir(mode=0o700)
    (private / "file").write_text("x")  # the wrong type
    sub = private / "sub"  # root's, exists, right type (but not hers to write)
    sub.mkdir(mode=0o755)
    theirs = private / "theirs"  # another user's
    theirs.mkdir(mode=0o777)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    (private / "etc").symlink_to("/etc")  # root's link somewhere forbidden
    (private / "mine").symlink_to(site.user_dir)  # root's link to her own directory
    return [
        str(private / "t.json"),
        str(private / "missing" / "t.json"),
        str(private / "file" / "t.json"),
        str(private / "sub" / "t.json"),
        str(private / "sub"),
        str(private / "theirs" / "t.json"),
        str(private / "etc" / "t.json"),
        str(private / "mine" / "t.json"),
    ]


def masked(text: str, given: str, pid: int) -> str:
    return text.replace(kineto_output_path(given, pid), "<PATH>").replace(given, "<PATH>")


@pytest.mark.usefixtures("torch_ready")
async def test_refusals_behind_a_directory_she_cannot_enter_are_alike(site: Site) -> None:
    pid = await registered(site, site.spawn_user_trainer())
    paths = hidden_paths(site)

    cli: set[tuple[int, str]] = set()
    legacy: set[tuple[object, object, str]] = set()
    for given in paths:
        r = await site.user_cli("gputrace", "--pids", str(pid), "--log-file", given)
        cli.add((r.returncode, masked(r.stderr, given, pid)))
        reply = await site.user_frame(dyno_gputrace_bytes(given))
        legacy.add((reply["status"], reply.get("rule"), masked(str(reply["error"]), given, pid)))

    assert len(cli) == 1, cli
    [(code, text)] = cli  # one answer for all eight
    assert code == 1
    who = f"the traced process (pid {pid}, uid {site.user.uid} ({site.user.name}))"
    assert text == (
        "bpfdyno: permission denied: trace file rejected by rule 'directory_not_reachable': "
        f"{who} cannot reach the directory of <PATH>: one of the directories on the way does "
        "not exist, is not a directory, or may not be entered by that user. Name a file in a "
        "directory that user can write, or leave out --log-file (the agent then writes into "
        "your own trace directory, [tracing] user_dirs)\n"
    )
    [(status, rule, error)] = legacy
    assert (status, rule) == ("failed", "directory_not_reachable")
    assert error == text.removeprefix("bpfdyno: permission denied: ").rstrip("\n")
    # Nothing was handed out, nothing written anywhere.
    assert site.h.service.list_trainers()[0].trace_id == ""
    assert os.listdir(site.user_dir) == []

    # What she can see is still told in detail: her own directory's missing subdirectory.
    given = str(site.user_dir / "nope" / "t.json")
    r = await site.user_cli("gputrace", "--pids", str(pid), "--log-file", given)
    assert r.returncode == 2  # invalid argument
    assert "rule 'missing_directory'" in r.stderr and f"{site.user_dir}/nope" in r.stderr


def test_what_a_user_could_see_herself(short_tmp: Path) -> None:
    """`visible_to`: whether a user could make a lookup herself, decided as the kernel
    would (uid 65534, in none of root's groups, is "her")."""
    short_tmp.chmod(0o755)
    (short_tmp / "closed").mkdir(mode=0o700)
    (short_tmp / "closed" / "d").mkdir()
    (short_tmp / "open").mkdir(mode=0o711)
    (short_tmp / "to_closed").symlink_to(short_tmp / "closed" / "d")
    (short_tmp / "to_open").symlink_to("open")
    sees = visible_to(OTHER_UID)
    cases = {
        "closed": True,  # she may stat it, not enter it
        "closed/d": False,
        "closed/nothing": False,
        "open/nothing/x": True,  # missing: the kernel tells her so too
        "to_closed": False,
        "to_closed/x": False,
        "to_open/x": True,
        "missing/x": True,
    }
    assert {c: sees(str(short_tmp / c)) for c in cases} == cases
    assert visible_to(0)(str(short_tmp / "closed" / "d"))
