"""The per-user Kineto socket directories over real sockets and directories (as root; the
attacks by real users are in test_attacks_kineto)."""

from __future__ import annotations

import asyncio
import os
import re
import stat
from pathlib import Path

import pytest
from tracing_harness import KinetoClient

from bpfdyno.services.tracing import TracingService
from bpfdyno.tracing.ipc import wire
from bpfdyno.tracing.ipc.endpoint import EndpointUnavailable
from bpfdyno.tracing.ipc.user_dirs import UserSocketDirs
from bpfdyno.tracing.trainers import TrainerRegistry

pytestmark = pytest.mark.root

UID = 4242


def _dirs(root: Path) -> UserSocketDirs:
    return UserSocketDirs(str(root), TracingService([str(root)], 60.0, TrainerRegistry()))


def _mode(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


async def _poll(directory: Path) -> str:
    """One poll through ``directory``; the reply's sender."""
    client = KinetoClient(str(directory))
    try:
        await client.send(wire.encode_request(3, 0, [7100]))
        _, sender = await client.recv()
    finally:
        client.close()
    return str(sender)


async def test_a_users_directory_is_made_served_and_adopted_after_a_restart(
    short_tmp: Path,
) -> None:
    root = short_tmp / "k"
    dirs = _dirs(root)
    dirs.open(asyncio.get_running_loop())
    assert _mode(root) == (0, 0o711)
    path = dirs.open_for(UID)
    assert path == str(root / str(UID))
    assert dirs.open_for(UID) == path  # once
    assert _mode(Path(path)) == (UID, 0o700)
    assert _mode(Path(path) / "dynolog")[0] == 0
    sender = await _poll(Path(path))
    assert re.fullmatch(rf"{path}/dynolog-reply-0-[0-9a-f]{{24}}", sender)
    assert dirs.totals().replied == 1
    dirs.close()
    assert os.listdir(path) == []  # our sockets go; the directory stays for the next run
    again = _dirs(root)
    again.open(asyncio.get_running_loop())
    try:
        assert again.totals().users == 1  # adopted without being asked
        assert (await _poll(Path(path))).startswith(f"{path}/dynolog-reply-0-")
    finally:
        again.close()


async def test_a_directory_opened_up_by_its_user_is_not_served_until_asked_again(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = short_tmp / "k"
    dirs = _dirs(root)
    dirs.open(asyncio.get_running_loop())
    path = Path(dirs.open_for(UID))
    dirs.close()
    os.chmod(path, 0o755)  # its user made it reachable by others
    (root / "notes").mkdir()  # not a uid: left alone
    again = _dirs(root)
    again.open(asyncio.get_running_loop())
    try:
        assert again.totals().users == 0
        assert f"must be uid {UID}'s with mode 0700 (it is uid {UID}'s, mode 0755)" in caplog.text
        assert again.open_for(UID) == str(path)  # asked again: made private again
        assert _mode(path) == (UID, 0o700)
    finally:
        again.close()


async def test_a_root_someone_else_could_replace_is_refused(short_tmp: Path) -> None:
    loop = asyncio.get_running_loop()
    shared = short_tmp / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # anyone could rename the root away and put theirs
    with pytest.raises(EndpointUnavailable, match="is not safe"):
        _dirs(shared / "k").open(loop)
    theirs = short_tmp / "theirs"
    theirs.mkdir()
    os.chown(theirs, 4343, 4343)  # a user made the root before the agent did
    with pytest.raises(EndpointUnavailable, match="must be a directory of the agent's user"):
        _dirs(theirs).open(loop)
