"""Per-pod Kineto socket directories (Kubernetes): a real `bpfdyno serve` with
``[kineto] pod_socket_root`` and a real PyTorch trainer that sees only its own pod's
directory, bind-mounted at the path it has on the host as a hostPath volume is (the
kubelet's part is played by root: it makes the directory, 0755, and mounts it)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from served_site import ServedSite, served_site, stops_in_time, traced
from tracing_harness import TRAINERS, TrainerProc, trainer_env

from bpfdyno.tracing.ipc.pod_dirs import max_name_bytes

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.usefixtures("torch_ready")]

#: What a pod's mount namespace holds of the root: its own directory only (as a hostPath
#: volume mounted at the same path). $1 is that directory.
_POD_MOUNTS = """set -e
pod=$1; shift
stash=$(mktemp -d -p "$(dirname "$(dirname "$pod")")")
mount --bind "$pod" "$stash"
mount -t tmpfs -o mode=755 tmpfs "$(dirname "$pod")"
mkdir "$pod"
mount --bind "$stash" "$pod"
exec "$@"
"""

_REACH = """
import errno, json, os, socket, sys
from bpfdyno.tracing.ipc import wire
out = {}
for what, act in (("list", lambda: os.listdir(sys.argv[1])),
                  ("send", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(
                      wire.encode_config_reply("ACTIVITIES_DURATION_MSECS=600000"),
                      sys.argv[2]))):
    try:
        act()
        out[what] = "ok"
    except OSError as e:
        out[what] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def pod_trainer(site: ServedSite, user: str, pod_dir: Path) -> TrainerProc:
    """A PyTorch trainer of ``user`` in a "pod": a mount namespace where the pod root holds
    only ``pod_dir``, which is its KINETO_IPC_SOCKET_DIR."""
    u = site.users[user]
    env = trainer_env(str(pod_dir))
    env.update({k: v for k, v in u.env().items() if k in ("HOME", "TMPDIR", "USER")})
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _POD_MOUNTS, "sh",
           str(pod_dir), *u.wrap([sys.executable, str(TRAINERS / "linear.py")])]  # fmt: skip
    log = open(site.base / f"trainer-{len(site.trainers)}.log", "w")  # noqa: SIM115
    popen = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True,
        cwd=u.home,
    )  # fmt: skip
    log.close()
    proc = TrainerProc(popen, Path(log.name))
    proc.start_reader()
    site.trainers.append(proc)
    return proc


async def test_a_pods_trainer_is_served_in_its_own_directory(short_tmp: Path) -> None:
    root = short_tmp / "run" / "pods"  # in the agent's own directory, as /run/bpfdyno/pods
    async with served_site(short_tmp, sets=[f'kineto.pod_socket_root="{root}"']) as site:
        st = os.lstat(root)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (site.agent_uid, 0o700)
        pod_dir = root / "job-a"
        pod_dir.mkdir(mode=0o755)  # as the kubelet makes a DirectoryOrCreate hostPath
        async with asyncio.timeout(10):  # the agent serves it, writable for any uid
            while not (pod_dir / "dynolog").exists():
                await asyncio.sleep(0.1)
        assert stat.S_IMODE(os.lstat(pod_dir).st_mode) == 0o1777
        proc = pod_trainer(site, "alice", pod_dir)
        [pid] = await proc.wait_ready()
        await site.wait_registered(pid)
        r = await site.cli("alice", "trainers", "--json")
        [t] = json.loads(r.stdout)["trainers"]
        assert t["endpoint"].startswith(f"{pod_dir}/dynoconfigclient"), t
        # Outside the pod, nobody but root reaches its directory: not even listing the root.
        reach = await site.run("mallory", sys.executable, "-c", _REACH, str(root), t["endpoint"])
        assert json.loads(reach.stdout) == {"list": "EACCES", "send": "EACCES"}, reach.stderr
        status = await site.cli("alice", "status")
        assert re.search(r"protection: [^;\n]*per-pod directories", status.stdout), status.stdout
        assert "open layout" not in status.stdout, status.stdout
        assert f"{root}/<pod> (one per trainer pod, the root 0700): 1 pods" in status.stdout
        await traced(site, "alice", pid)  # through its pod's directory
        # A name the agent cannot serve (its trainers' socket paths would not fit) is said.
        (root / ("x" * 40)).mkdir()
        async with asyncio.timeout(10):
            while "1 not served" not in (status := await site.cli("alice", "status")).stdout:
                await asyncio.sleep(0.2)
        limit = max_name_bytes(str(root))
        assert f"{'x' * 40}: the name is not a Kubernetes name of at most {limit} " in status.stdout
        # A pod's directory that goes (its pod deleted, the hostPath removed): its endpoint
        # is closed, the others keep theirs.
        other = root / "job-b"
        other.mkdir()
        async with asyncio.timeout(10):
            while not (other / "dynolog").exists():
                await asyncio.sleep(0.1)
        shutil.rmtree(other)
        async with asyncio.timeout(10):
            while " 1 pods;" not in (status := await site.cli("alice", "status")).stdout:
                await asyncio.sleep(0.2)
        assert (pod_dir / "dynolog").exists()
        stops_in_time(site)
    assert not (pod_dir / "dynolog").exists()  # the agent's socket went with it


def test_a_root_too_long_for_the_pods_socket_paths_is_refused(tmp_path: Path) -> None:
    """<root>/<name>/dynoconfigclient<uuid> must fit in sun_path with room for a name."""
    from bpfdyno.core.config import ConfigError, load

    path = tmp_path / "bpfdyno.toml"
    path.write_text('[kineto]\npod_socket_root = "/run/bpfdyno/pods"\n')
    assert load(path).kineto.pod_socket_root == "/run/bpfdyno/pods"
    path.write_text(f'[kineto]\npod_socket_root = "/{"r" * 37}"\n')
    with pytest.raises(ConfigError, match="keep it under 38 bytes"):
        load(path)
    path.write_text('[kineto]\npod_socket_root = "pods"\n')
    with pytest.raises(ConfigError, match="must be an absolute directory"):
        load(path)
