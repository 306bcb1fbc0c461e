"""``--pod`` on a node laid out as the kubelet lays it out: `bpfdyno serve`, the kubelet's
pod-resources API (the test server, answering as the kubelet does), processes in real cgroups
named as the kubelet and containerd name them, a real PyTorch trainer in its own pid
namespace in a pod holding a GPU (the fake NVML reports it there), another trainer outside
any pod, and a pod without a device.

``ps``, ``trainers`` and ``gputrace`` pick the pod's processes by ``NAMESPACE/NAME`` (known
from the kubelet for the pods holding a GPU, for each of their containers) or by the pod's uid
(from the cgroup paths, with no kubelet); with no kubelet answering, the name gives a clear
error and the uid still works.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from kubelet_server import KubeletServer, response

from bpfdyno.tui.datasource import AgentDataSource

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "sources" / "gpu"))
from gpu_fake_nvml import DEFAULT_VALUES, H100_UUID, build_fake_nvml  # noqa: E402

pytestmark = [pytest.mark.root, pytest.mark.slow]

TRAINER = REPO / "tests" / "tracing" / "trainers" / "linear.py"
KINETO_CONF = REPO / "tests" / "tracing" / "trainers" / "kineto.conf"
UNIFIED = Path("/sys/fs/cgroup/unified")
TRAIN_UID = "5f0c2a9e-1b3d-4e6f-8a7b-9c0d1e2f3a4b"
NB_UID = "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"
TRAINER_CTR, SIDECAR_CTR, NB_CTR = "a1" * 32, "b2" * 32, "c3" * 32


def container_cgroup(qos: str, pod_uid: str, container: str) -> Path:
    """A container's cgroup as the kubelet (systemd driver) and containerd name it."""
    pod = f"kubepods-{qos}-pod{pod_uid.replace('-', '_')}.slice"
    return (
        UNIFIED / "kubepods.slice" / f"kubepods-{qos}.slice" / pod
        / f"cri-containerd-{container}.scope"
    )  # fmt: skip


def in_cgroup(cgroup: Path, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` inside ``cgroup`` (it moves itself there, then execs)."""
    script = f'echo $$ > {cgroup}/cgroup.procs && exec "$@"'
    return subprocess.Popen(
        ["sh", "-c", script, "sh", *argv], start_new_session=True, stdout=subprocess.DEVNULL, **kw
    )


def wait_for(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


class Site:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.sock = str(base / "agent.sock")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("BPFDYNO_")}

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bpfdyno", *args, "--socket", self.sock],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )

    def json(self, *args: str) -> Any:
        r = self.cli(*args, "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)


@pytest.fixture
def node() -> Iterator[tuple[Site, KubeletServer, dict[str, int]]]:
    # Short: the Kineto socket directory's paths must fit a Unix socket address.
    tmp_path = Path(tempfile.mkdtemp(prefix="bdpod-"))
    made: list[Path] = []
    procs: list[subprocess.Popen[bytes]] = []
    kubelet = KubeletServer(tmp_path / "kubelet.sock")
    agent: subprocess.Popen[bytes] | None = None
    try:
        cgroups = {
            "trainer": container_cgroup("besteffort", TRAIN_UID, TRAINER_CTR),
            "sidecar": container_cgroup("besteffort", TRAIN_UID, SIDECAR_CTR),
            "nb": container_cgroup("burstable", NB_UID, NB_CTR),
        }
        for cg in cgroups.values():
            for d in reversed([cg, *cg.parents]):
                if d.is_relative_to(UNIFIED) and d != UNIFIED and not d.exists():
                    d.mkdir()
                    made.append(d)
        socket_dir = tmp_path / "kineto"
        socket_dir.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "KINETO_"))}
        env.update(
            KINETO_USE_DAEMON="1",
            KINETO_CONFIG=str(KINETO_CONF),
            KINETO_IPC_SOCKET_DIR=str(socket_dir),
            OMP_NUM_THREADS="1",
        )
        trainer_argv = [sys.executable, str(TRAINER), "--seconds=300", "--step-sleep=0.02"]
        # The pod's trainer in a pid namespace of its own, as in every pod; its sidecar; a
        # notebook pod without a device; a trainer on the host, in no pod.
        unshare = in_cgroup(
            cgroups["trainer"],
            ["unshare", "--pid", "--fork", "--mount-proc", *trainer_argv],
            env=env,
        )
        procs.append(unshare)
        procs.append(in_cgroup(cgroups["sidecar"], ["sleep", "600"]))
        procs.append(in_cgroup(cgroups["nb"], ["sleep", "600"]))
        procs.append(
            subprocess.Popen(
                trainer_argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL
            )
        )
        pids = {
            "unshare": unshare.pid,
            "trainer": wait_for(
                "the pod's trainer", lambda: [c.pid for c in psutil.Process(unshare.pid).children()]
            )[0],
            "sidecar": procs[1].pid,
            "nb": procs[2].pid,
            "host_trainer": procs[3].pid,
        }
        # The node's GPU: the fake NVML sees the pod's trainer on it; the kubelet says the
        # pod's trainer container holds it (its device plugin's UUID).
        library = build_fake_nvml(tmp_path / "driver")
        control = tmp_path / "nvml.ctl"
        values = {**DEFAULT_VALUES, "gpu.0.procs": f"{pids['trainer']}:{1 << 30}"}
        control.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        kubelet.answer = response(
            [("ml", "train-0", "trainer", "nvidia.com/gpu", (H100_UUID,)),
             ("ml", "nb-0", "lab", "", ())]
        )  # fmt: skip
        kubelet.start()
        site = Site(tmp_path)
        light = [
            f"collectors.{name}.enabled=false"
            for name in ("sched", "net", "pmu", "perf_sw", "dcgm", "fabric", "irq")
        ]
        argv = [
            sys.executable, "-m", "bpfdyno", "serve", "--config", str(tmp_path / "none.toml"),
            "--socket", site.sock,
            f"--set=kineto.socket_dir={json.dumps(str(socket_dir))}",
            f"--set=tracing.allowed_dirs={json.dumps([str(tmp_path)])}",
            f"--set=tracing.user_dirs={json.dumps(str(tmp_path / 'user-dirs'))}",
            "--set=legacy_rpc.listen=[]",
            f"--set=gpu.library_path={json.dumps(str(library))}",
            f"--set=kubelet.pod_resources_socket={json.dumps(str(kubelet.socket))}",
            "--set=collectors.kubelet.interval_s=0.5",
            "--set=capture.enabled=false",
            *(f"--set={s}" for s in light),
        ]  # fmt: skip
        (tmp_path / "none.toml").write_text("")
        log = open(tmp_path / "agent.log", "wb")  # noqa: SIM115 (closed with the agent)
        agent = subprocess.Popen(
            argv, stderr=log, env={**site.env, "FAKE_NVML_CONTROL": str(control)}
        )
        log.close()
        wait_for(
            "the agent", lambda: agent.poll() is not None or site.cli("status").returncode == 0
        )
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()
        yield site, kubelet, pids
    finally:
        if agent is not None:
            agent.kill()
            agent.wait()
        kubelet.stop()
        for p in procs:
            for kid in psutil.Process(p.pid).children(recursive=True) if p.poll() is None else []:
                kid.kill()
            p.kill()
            p.wait()
        shutil.rmtree(tmp_path, ignore_errors=True)
        for d in reversed(made):
            for _ in range(50):  # the killed processes leave their cgroup as they are reaped
                try:
                    d.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


def rows(site: Site, pod: str) -> dict[int, tuple[str, str, str, int]]:
    table = site.json("ps", "--pod", pod, "--limit", "0")
    return {
        r["pid"]: (r["k8s_namespace"], r["k8s_pod"], r["k8s_container"], r["ns_pid"])
        for r in table["processes"]
    }


def test_pod_by_name_and_by_uid_for_ps_trainers_and_gputrace(
    node: tuple[Site, KubeletServer, dict[str, int]],
) -> None:
    site, kubelet, pids = node
    expected = {
        pids["unshare"]: ("ml", "train-0", "trainer", 0),
        pids["trainer"]: ("ml", "train-0", "trainer", 1),
        pids["sidecar"]: ("ml", "train-0", "", 0),
    }

    # The GPU collector's round names the trainer's pod; every process of the pod gets it.
    # Until that round (and the kubelet's) has run, the name matches nothing: exit 1.
    def named_rows() -> bool:
        if site.cli("ps", "--pod", "ml/train-0", "--limit", "0").returncode != 0:
            return False
        return rows(site, "ml/train-0") == expected

    wait_for("the pod's processes", named_rows)
    assert rows(site, TRAIN_UID) == expected
    assert rows(site, NB_UID) == {pids["nb"]: ("", "", "", 0)}
    r = site.cli("ps", "--pod", "ml/nb-0")
    assert r.returncode == 1
    assert "no process of pod ml/nb-0 on this node: the kubelet names here only the pods " in (
        r.stderr
    )
    r = site.cli("ps", "--pod", "nb-0")
    assert r.returncode == 2 and "write NAMESPACE/NAME" in r.stderr

    # Both trainers registered; --pod picks the pod's by its pid here, never by its pid 1.
    everyone = wait_for(
        "two trainers", lambda: len(t := site.json("trainers")["trainers"]) == 2 and t
    )
    assert sorted(t["host_pid"] or t["pid"] for t in everyone) == sorted(
        [pids["trainer"], pids["host_trainer"]]
    )
    [ours] = site.json("trainers", "--pod", "ml/train-0")["trainers"]
    assert (ours["pid"], ours["host_pid"]) == (1, pids["trainer"])
    assert site.json("trainers", "--pod", NB_UID)["trainers"] == []

    # bpfdyno top --pod: the UI's source shows the pod's processes and trainer only.
    async def top_view() -> tuple[set[int], list[int]]:
        source = AgentDataSource(site.sock, pod="ml/train-0")
        try:
            table = await source.processes(0)
            return {r.pid for r in table.processes}, [t.pid for t in await source.trainers()]
        finally:
            await source.close()

    assert asyncio.run(top_view()) == (set(expected), [1])

    out = site.json(
        "gputrace", "--pod", "ml/train-0", "--log-file", str(site.base / "t.json"),
        "--iterations", "2", "--kernel-tracks", "none", "--wait", "--timeout", "60",
    )  # fmt: skip
    assert [(p["pid"], p["output_path"]) for p in out["request"]["triggered"]] == [
        (1, str(site.base / "t_1.json"))
    ]
    [written] = out["trace"]["processes"]
    assert written["state"] == "PROCESS_TRACE_STATE_WRITTEN"
    assert (site.base / "t_1.json").stat().st_size > 0

    # The kubelet stops answering: names are unknown, and the error says why; uids still work.
    kubelet.stop()
    wait_for(
        "the kubelet part to see it", lambda: site.cli("ps", "--pod", "ml/train-0").returncode == 1
    )
    r = site.cli("ps", "--pod", "ml/train-0")
    assert (
        "no kubelet answers it (its kubelet part is degraded: RuntimeError: the kubelet at "
        f"{kubelet.socket} did not answer List: UNAVAILABLE"
    ) in r.stderr, r.stderr
    assert "give the pod's uid instead (kubectl get pod" in r.stderr
    r = site.cli("gputrace", "--pod", "ml/train-0")
    assert r.returncode == 1 and "no kubelet answers it" in r.stderr
    assert {pid: row[3] for pid, row in rows(site, TRAIN_UID).items()} == {
        pid: row[3] for pid, row in expected.items()
    }
