"""Attacks on the Kineto protocol's side of the agent, by real unprivileged users against a
real `bpfdyno serve` (``mallory`` attacks, ``alice`` works). After each attack alice's
legitimate trace still works and the agent is gone within 5 s of SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import re
from pathlib import Path

import pytest
from served_site import STOP_WITHIN_S, ServedSite, served_site

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]


async def trainer(site: ServedSite, user: str, *args: str, **env: str) -> int:
    """A registered PyTorch trainer of ``user``; its pid."""
    proc = site.spawn_trainer(user, *args, env=env)
    [pid] = await proc.wait_ready()
    await site.wait_registered(pid)
    return pid


async def traced(site: ServedSite, user: str, pid: int) -> None:
    """``user`` traces its trainer ``pid`` (2 iterations, ``bpfdyno gputrace --wait``): written."""
    log_file = str(site.dirs[user] / "t.json")
    r = await site.cli(user, "gputrace", "--pids", str(pid), "--iterations", "2",
                       "--log-file", log_file, "--wait", "--timeout", "60")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr + site.diagnostics()
    assert "written" in r.stdout


def stops_in_time(site: ServedSite) -> None:
    took = site.stop()
    assert took < STOP_WITHIN_S, f"stopped {took:.1f} s after SIGTERM\n{site.agent_log()[-3000:]}"


async def test_squatted_reply_socket_names_cost_another_user_no_reply(short_tmp: Path) -> None:
    """Found: every reply socket's name shared one token per run, visible in any listing;
    a user bound another user's name before that user's first poll, the agent fell back
    to its shared socket, and her trainer got no replies while status said ok. Now each
    socket's name is fresh and random, and a reply never falls back to the shared socket."""
    async with served_site(short_tmp) as site:
        alice = site.users["alice"].uid
        mallory = site.users["mallory"].uid
        squat = asyncio.create_task(
            site.client("mallory", "squat", str(site.socket_dir), str(alice), "20")
        )
        async with asyncio.timeout(30):  # she holds the name she learned for alice
            while not any(
                n.startswith(f"dynolog-reply-{alice}-")
                and os.lstat(site.socket_dir / n).st_uid == mallory
                for n in os.listdir(site.socket_dir)
            ):
                await asyncio.sleep(0.1)
        got = await site.client("alice", "polls", str(site.socket_dir), "8")
        assert isinstance(got, dict)
        assert got["replies"] == 8, got
        [sender] = set(got["senders"])  # her own reply socket, the agent's, not mallory's
        assert re.fullmatch(rf"{site.socket_dir}/dynolog-reply-{alice}-[0-9a-f]{{24}}", sender)
        assert os.lstat(sender).st_uid == 0
        squatted = await squat
        assert isinstance(squatted, dict) and squatted["bound"], squatted
        assert sender not in squatted["bound"]
        status = await site.cli("alice", "status")
        assert "replies dropped" not in status.stdout, status.stdout
        pid = await trainer(site, "alice")
        await traced(site, "alice", pid)
        stops_in_time(site)


async def test_trainers_hands_a_user_only_her_own_trainers_sockets(short_tmp: Path) -> None:
    """Found: `bpfdyno trainers` gave every user every trainer's Kineto socket, and one
    datagram there configures a trainer without the agent. Another user's trainer is still
    listed (pid, job, owner, state), without its socket."""
    async with served_site(short_tmp) as site:
        pid = await trainer(site, "alice")
        seen = {}
        for user in ("alice", "mallory"):
            r = await site.cli(user, "trainers", "--json")
            assert r.returncode == 0, r.stderr
            [t] = json.loads(r.stdout)["trainers"]
            assert (t["pid"], t["uid"]) == (pid, site.users["alice"].uid)
            seen[user] = t.get("endpoint", "")
        assert re.fullmatch(rf"{site.socket_dir}/dynoconfigclient[0-9a-f-]{{36}}", seen["alice"])
        assert seen["mallory"] == ""
        await traced(site, "alice", pid)
        stops_in_time(site)
