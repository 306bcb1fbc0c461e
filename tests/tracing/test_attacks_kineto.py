"""Attacks on the Kineto protocol's side of the agent, by real unprivileged users against a
real `bpfdyno serve` (``mallory`` attacks, ``alice`` works), run as root and as the packaged
unit runs it (``run_mode``). After each attack alice's legitimate trace still works and the
agent is gone within 5 s of SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from served_site import ServedSite, served_site, stops_in_time, traced, trainer
from tracing_harness import TRAINERS, TrainerProc, trainer_env

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]


async def test_squatted_reply_socket_names_cost_another_user_no_reply(
    short_tmp: Path, run_mode: str
) -> None:
    """Found: every reply socket's name shared one token per run, visible in any listing;
    a user bound another user's name before that user's first poll, the agent fell back
    to its shared socket, and her trainer got no replies while status said ok. Now each
    socket's name is fresh and random, and a reply never falls back to the shared socket."""
    async with served_site(short_tmp, mode=run_mode) as site:
        alice = site.users["alice"].uid
        mallory = site.users["mallory"].uid
        # She holds the names 10 s: alice's 8 polls (~2 s, started once the names are held)
        # come while she does, even on a slow machine.
        squat = asyncio.create_task(
            site.client("mallory", "squat", str(site.socket_dir), str(alice), "10")
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
        assert os.lstat(sender).st_uid == site.agent_uid
        squatted = await squat
        assert isinstance(squatted, dict) and squatted["bound"], squatted
        assert sender not in squatted["bound"]
        status = await site.cli("alice", "status")
        assert "replies dropped" not in status.stdout, status.stdout
        pid = await trainer(site, "alice")
        await traced(site, "alice", pid)
        stops_in_time(site)


async def test_trainers_hands_a_user_only_her_own_trainers_sockets(
    short_tmp: Path, run_mode: str
) -> None:
    """Found: `bpfdyno trainers` gave every user every trainer's Kineto socket, and one
    datagram there configures a trainer without the agent. Another user's trainer is still
    listed (pid, job, owner, state), without its socket."""
    async with served_site(short_tmp, mode=run_mode) as site:
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


def _spawn_with_run(site: ServedSite, user: str, socket_dir: str | None = "shared") -> TrainerProc:
    """``bpfdyno run -- linear.py`` as ``user``, the environment a job step has (the shared
    socket directory set, as a site may have set it for everyone; None: abstract names)."""
    u = site.users[user]
    env = trainer_env(str(site.socket_dir) if socket_dir else None)
    env.update({k: v for k, v in u.env().items() if k in ("HOME", "TMPDIR", "USER")})
    cmd = [sys.executable, "-m", "bpfdyno", "run", "--node-socket", site.sock, "--",
           sys.executable, str(TRAINERS / "linear.py")]  # fmt: skip
    log = open(site.base / f"trainer-{len(site.trainers)}.log", "w")  # noqa: SIM115
    popen = subprocess.Popen(
        u.wrap(cmd), env=env, stdout=subprocess.PIPE, stderr=log, text=True,
        start_new_session=True, cwd=u.home,
    )  # fmt: skip
    log.close()
    proc = TrainerProc(popen, Path(log.name))
    proc.start_reader()
    site.trainers.append(proc)
    return proc


#: What mallory tries against a trainer's socket in alice's directory.
_REACH = """
import errno, json, os, socket, sys
from bpfdyno.tracing.ipc import wire
out = {}
try:
    os.listdir(sys.argv[1])
    out["list"] = "ok"
except OSError as e:
    out["list"] = errno.errorcode[e.errno]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
# The config that made a trainer write its trace over a file of mallory's choosing.
config = "ACTIVITIES_LOG_FILE=/etc/owned.json\\nACTIVITIES_DURATION_MSECS=600000"
try:
    s.sendto(wire.encode_config_reply(config), sys.argv[2])
    out["send"] = "ok"
except OSError as e:
    out["send"] = errno.errorcode[e.errno]
print(json.dumps(out))
"""

_ASK = """
import asyncio, json, sys
from bpfdyno.client.agent import AgentClient
from bpfdyno.client.errors import AgentError
async def main():
    async with AgentClient(sys.argv[1]) as a:
        try:
            print(json.dumps({"path": await a.kineto_socket_dir(int(sys.argv[2]))}))
        except AgentError as e:
            print(json.dumps({"error": e.kind.value, "details": e.details}))
asyncio.run(main())
"""


async def test_per_user_socket_directories_keep_other_users_off_a_trainer(
    short_tmp: Path, run_mode: str
) -> None:
    """Found: any user configured any trainer directly, without the agent (its file, its
    duration): libkineto takes a config from any datagram that reaches its socket. With
    [kineto] user_socket_root, `bpfdyno run` gives a job its user's own 0700 directory,
    where the agent binds an endpoint of its own; nobody else can reach a socket there."""
    root = short_tmp / "run" / "k"  # in the agent's own directory, as /run/bpfdyno/kineto
    async with served_site(
        short_tmp, sets=[f'kineto.user_socket_root="{root}"'], mode=run_mode
    ) as site:
        alice = site.users["alice"].uid
        proc = _spawn_with_run(site, "alice")
        [pid] = await proc.wait_ready()
        await site.wait_registered(pid)
        own = root / str(alice)
        st = os.lstat(own)
        # As root 0700; the unit's agent (no CAP_DAC_OVERRIDE) needs its own group's access
        # to bind its sockets there, a group that holds no one else.
        mode = 0o700 if site.agent_uid == 0 else 0o770
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice, mode)
        if site.agent_uid:
            assert st.st_gid == pwd.getpwuid(site.agent_uid).pw_gid
        assert stat.S_IMODE(os.lstat(root).st_mode) == 0o711
        r = await site.cli("alice", "trainers", "--json")
        [t] = json.loads(r.stdout)["trainers"]
        endpoint = t["endpoint"]
        assert re.fullmatch(rf"{own}/dynoconfigclient[0-9a-f-]{{36}}", endpoint), (
            f"{t}{site.diagnostics()}"
        )
        # Mallory can neither list the directories nor send alice's trainer a config.
        reach = await site.run("mallory", sys.executable, "-c", _REACH, str(root), endpoint)
        assert json.loads(reach.stdout) == {"list": "EACCES", "send": "EACCES"}, reach.stderr
        # Nor have the agent open alice's directory for her; her own she may.
        mallory = site.users["mallory"].uid
        asked = []
        for uid in (alice, mallory):
            r = await site.run("mallory", sys.executable, "-c", _ASK, site.sock, str(uid))
            asked.append(json.loads(r.stdout))
        assert asked[0]["error"] == "permission_denied", asked
        assert "may open only its own socket directory" in asked[0]["details"]
        assert asked[1] == {"path": str(root / str(mallory))}
        status = await site.cli("alice", "status")
        assert re.search(r"protection: [^;\n]*per-user directories", status.stdout), status.stdout
        each = rf"{root}/<uid> \({mode:04o} each\): 2 users"
        assert re.search(each, status.stdout), status.stdout
        await traced(site, "alice", pid)
        stops_in_time(site)
    assert not (root / str(alice) / "dynolog").exists()  # the agent's socket went with it


_SEND_ALL = """
import errno, json, socket
# Every trainer's abstract name is listed here ('@' stands for a NUL).
names = [line.split()[-1] for line in open("/proc/net/unix") if "@dynoconfigclient" in line]
out = {}
for name in names:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # unbound: its datagram once
    address = name.replace("@", "\\0").encode()              # aborted the trainer
    config = b"ACTIVITIES_LOG_FILE=/etc/owned.json\\nACTIVITIES_DURATION_MSECS=600000"
    try:
        s.sendto(len(config).to_bytes(8, "little") + b"req".ljust(32, b"\\0") + config, address)
        out[name] = "sent"
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
    try:
        s.connect(address)
        out[name] += " connected"
    except OSError as e:
        out[name] += " " + errno.errorcode[e.errno]
print(json.dumps(out))
"""


async def test_the_kernel_guard_refuses_other_users_datagrams_to_abstract_sockets(
    short_tmp: Path, run_mode: str
) -> None:
    """Found: with abstract names (the default), any user sent any trainer a config
    directly — its file, its duration — and a datagram from an unbound socket killed it
    (SIGABRT). Where the kernel has cgroup hooks for Unix sockets, the agent's guard refuses
    datagrams and connects to a registered trainer's name from anyone but its user."""
    async with served_site(short_tmp, sets=['kineto.socket_dir=""'], mode=run_mode) as site:
        proc = _spawn_with_run(site, "alice", socket_dir=None)
        [pid] = await proc.wait_ready()
        await site.wait_registered(pid)
        r = await site.cli("alice", "trainers", "--json")
        [t] = json.loads(r.stdout)["trainers"]
        assert t["endpoint"].startswith("@dynoconfigclient"), t
        reach = await site.run("mallory", sys.executable, "-c", _SEND_ALL)
        # (/proc/net/unix shows the name's trailing NUL too.)
        assert json.loads(reach.stdout) == {t["endpoint"] + "@": "EPERM EPERM"}, reach.stderr
        status = await site.cli("alice", "status")
        assert "protection: kernel guard (1 abstract sockets)" in status.stdout, status.stdout
        assert "open layout" not in status.stdout
        await traced(site, "alice", pid)  # alive, and traced through the agent
        stops_in_time(site)
