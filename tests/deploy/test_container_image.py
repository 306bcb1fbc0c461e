"""deploy/image: the container image is built without a registry and runs, in podman, with
exactly what deploy/kubernetes grants the DaemonSet's pod; a trainer in a second container
(trainer-example.yaml's pod, sharing only its own Kineto socket directory) is traced on demand
and its file is written in its own file system; `status` inside shows every collector up.

On these machines podman needs runc (cgroups in hybrid mode) and explicit ulimits (root
lacks CAP_SYS_RESOURCE): `PODMAN` sets both.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

import bpfdyno.version

#: The session's builds run in the first test's set-up: the package and the image (from
#: Debian's archive) take minutes on a slow machine.
pytestmark = pytest.mark.timeout(2400)
REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "sources" / "kubelet"))
from kubelet_server import KubeletServer, response  # noqa: E402

KUBE = REPO / "deploy" / "kubernetes"
TRAINERS = REPO / "tests" / "tracing" / "trainers"
#: Files the agent may hold open: the unit's limit, or this machine's hard limit if lower.
NOFILE = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
PODMAN = ["podman", "--runtime", "runc"]
#: What every `podman run` of the test adds: never a registry; the ulimits (4096 processes:
#: the unit allows the agent 256 tasks).
RUN_LIMITS = [
    "--pull=never", "--ulimit", f"nofile={NOFILE}:{NOFILE}", "--ulimit", "nproc=4096:4096",
]  # fmt: skip
#: Host paths of the node that the test replaces by directories of its own, so as not to
#: touch this machine's (a node agent may use them).
PRIVATE_HOST_PATHS = ("/run/bpfdyno", "/var/cache/bpfdyno", "/var/lib/kubelet/pod-resources")
#: Collectors that need hardware this machine does not have (a PMU, a GPU, DCGM).
HARDWARE = {"pmu", "gpu", "dcgm"}


def podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout)


def kube(name: str) -> dict[str, dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all((KUBE / name).read_text()) if d]
    return {d["kind"]: d for d in docs}


@dataclass(frozen=True)
class Image:
    """The image built for this session: its archive and its name in podman."""

    archive: Path
    ref: str


@pytest.fixture(scope="session")
def image(debian_package: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    out = tmp_path_factory.mktemp("image")
    started = time.monotonic()
    r = subprocess.run(
        [REPO / "deploy" / "image" / "build.sh", "--deb", debian_package, "--out", out],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert r.returncode == 0, r.stderr
    version = bpfdyno.version.__version__
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True)
    archive = out / f"bpfdyno-image_{version}_{arch.stdout.strip()}.tar"
    assert r.stdout == f"{archive}\n"
    print(f"image built in {time.monotonic() - started:.0f} s: {archive}")
    ref = f"localhost/bpfdyno:{version}"
    image_id = podman("image", "inspect", "--format", "{{.Id}}", ref).stdout.strip()
    try:
        yield Image(archive, ref)
    finally:
        podman("rmi", "--force", image_id)


def test_the_image_is_the_package_on_debian_and_loads_from_its_archive(image: Image) -> None:
    version = bpfdyno.version.__version__
    config = json.loads(podman("image", "inspect", image.ref).stdout)[0]["Config"]
    assert config["Entrypoint"] == ["/usr/bin/bpfdyno"]
    assert config["Cmd"] == ["serve"]
    assert config["Labels"]["org.opencontainers.image.version"] == version
    r = podman("run", "--rm", *RUN_LIMITS, "--network", "none", image.ref, "--version")
    assert (r.returncode, r.stdout) == (0, f"bpfdyno {version}\n"), r.stderr
    r = podman("run", "--rm", *RUN_LIMITS, "--network", "none", "--entrypoint", "dpkg-query",
               image.ref, "-W", "-f", "${Version}", "bpfdyno")  # fmt: skip
    assert r.stdout == version, r.stdout + r.stderr
    # What reads the routes behind pod addresses (detection peers on a pod network).
    for tool in ("ip", "bridge"):
        r = podman("run", "--rm", *RUN_LIMITS, "--network", "none", "--entrypoint", tool,
                   image.ref, "-V")  # fmt: skip
        assert r.returncode == 0 and f"{tool} utility" in r.stdout, (tool, r.stdout + r.stderr)
    # The archive is a complete image: podman loads it under its name.
    r = podman("load", "--input", str(image.archive), timeout=600)
    assert r.returncode == 0 and f"Loaded image: {image.ref}" in r.stdout, r.stdout + r.stderr
    # Every image the manifests name is this one.
    daemonset = kube("bpfdyno.yaml")["DaemonSet"]["spec"]["template"]["spec"]
    for c in (*daemonset["initContainers"], *daemonset["containers"]):
        assert c["image"] == f"bpfdyno:{version}", c["name"]


def test_doctor_in_a_container_without_the_capabilities_says_to_add_them(image: Image) -> None:
    """Root inside a container started without the DaemonSet's capabilities: the fix is
    --cap-add (securityContext) at the container's start, not "run as root"."""
    r = podman("run", "--rm", *RUN_LIMITS, "--network", "none", image.ref, "doctor")
    assert r.returncode == 1, r.stdout + r.stderr
    privileges = next(ln for ln in r.stdout.splitlines() if " privileges: " in ln)
    assert privileges.startswith("missing privileges: running as root without CAP_BPF"), privileges
    assert privileges.endswith(
        "— fix: start the container with the capabilities the agent needs: podman/docker run "
        "--cap-add BPF --cap-add PERFMON --cap-add SYS_ADMIN --cap-add SYS_PTRACE --cap-add "
        "DAC_READ_SEARCH --pid host (Kubernetes: securityContext.capabilities.add and hostPID, "
        "as deploy/kubernetes/bpfdyno.yaml does); root inside a container has only what it was "
        "given"
    ), privileges


def _env(container: dict[str, Any], field_values: dict[str, str]) -> list[str]:
    """The container's env as podman flags: fieldRef values given, $(VAR) expanded."""
    env: dict[str, str] = {}
    for e in container.get("env", ()):
        if "valueFrom" in e:
            value = field_values[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            value = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], e["value"])
        env[e["name"]] = value
    return [f"--env={k}={v}" for k, v in env.items()]


def _mounts(
    container: dict[str, Any], volumes: dict[str, dict[str, Any]], sources: dict[str, str]
) -> list[str]:
    """The container's volumeMounts as podman flags; ``sources`` is each volume's host dir."""
    flags = []
    for m in container.get("volumeMounts", ()):
        assert set(m) <= {"name", "mountPath", "readOnly"}, m
        ro = ":ro" if m.get("readOnly") else ""
        flags.append(f"--volume={sources[m['name']]}:{m['mountPath']}{ro}")
        assert m["name"] in volumes
    return flags


def _security(sc: dict[str, Any]) -> list[str]:
    """A container securityContext as podman flags (Kubernetes applies no seccomp profile
    unless asked: Unconfined, as here)."""
    assert set(sc) <= {"privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem",
                       "capabilities"}, sc  # fmt: skip
    flags = ["--security-opt=seccomp=unconfined"]
    if sc.get("privileged"):
        flags.append("--privileged")
    if sc.get("allowPrivilegeEscalation") is False:
        flags.append("--security-opt=no-new-privileges")
    if sc.get("readOnlyRootFilesystem"):
        flags += ["--read-only", "--read-only-tmpfs=false"]  # no tmpfs Kubernetes would not add
    caps = sc.get("capabilities", {})
    flags += [f"--cap-drop={c.lower()}" for c in caps.get("drop", ())]
    flags += [f"--cap-add={c.lower()}" for c in caps.get("add", ())]
    return flags


def _resources(resources: dict[str, Any]) -> list[str]:
    limits = resources.get("limits", {})
    flags = []
    if "cpu" in limits:
        flags.append(f"--cpus={limits['cpu']}")
    if "memory" in limits:
        m = re.fullmatch(r"(\d+)Mi", limits["memory"])
        assert m is not None, limits
        flags.append(f"--memory={m.group(1)}m")
    return flags


#: Pod and container fields the translation knows; anything new must be taught to it.
POD_FIELDS = {"serviceAccountName", "automountServiceAccountToken", "hostPID", "hostNetwork",
              "dnsPolicy", "tolerations", "terminationGracePeriodSeconds", "initContainers",
              "containers", "volumes", "restartPolicy"}  # fmt: skip
CONTAINER_FIELDS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports",
                    "securityContext", "resources", "startupProbe", "livenessProbe",
                    "volumeMounts"}  # fmt: skip


def pod_flags(pod: dict[str, Any]) -> list[str]:
    """What a pod spec grants every container, as podman flags."""
    assert set(pod) <= POD_FIELDS, set(pod) - POD_FIELDS
    flags = []
    if pod.get("hostPID"):
        flags.append("--pid=host")
    flags.append("--network=host" if pod.get("hostNetwork") else "--network=none")
    return flags


def container_flags(
    pod: dict[str, Any],
    container: dict[str, Any],
    sources: dict[str, str],
    field_values: dict[str, str],
) -> list[str]:
    """``podman run`` flags for one container of ``pod``, up to the image."""
    assert set(container) <= CONTAINER_FIELDS, set(container) - CONTAINER_FIELDS
    volumes = {v["name"]: v for v in pod.get("volumes", ())}
    flags = [*pod_flags(pod), *_security(container.get("securityContext", {}))]
    flags += _resources(container.get("resources", {}))
    flags += _env(container, field_values)
    flags += _mounts(container, volumes, sources)
    if "command" in container:
        flags.append(f"--entrypoint={container['command'][0]}")
    return flags


def volume_sources(
    pod: dict[str, Any], scratch: Path, files: dict[str, dict[str, str]]
) -> dict[str, str]:
    """A host directory for each volume: the node's own for /sys, a private one in
    ``scratch`` for the others (hostPaths in `PRIVATE_HOST_PATHS`, emptyDirs, ConfigMaps
    with their ``files``)."""
    sources = {}
    for v in pod.get("volumes", ()):
        name = v["name"]
        if "hostPath" in v and v["hostPath"]["path"].startswith("/sys/"):
            sources[name] = v["hostPath"]["path"]
            continue
        path = scratch / name
        path.mkdir()
        path.chmod(0o755)
        if "hostPath" in v:
            assert v["hostPath"]["path"] in PRIVATE_HOST_PATHS, v
        elif "configMap" in v:
            for file, text in files[v["configMap"]["name"]].items():
                (path / file).write_text(text)
        else:
            assert "emptyDir" in v, v
            path.chmod(0o777)  # an emptyDir is writable by the pod's users
        sources[name] = str(path)
    return sources


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def agent_json(name: str, *args: str) -> Any:
    """``bpfdyno ARGS --json`` in container ``name``, on the agent's API socket there."""
    r = podman("exec", name, "bpfdyno", *args, "--socket", "/run/bpfdyno/bpfdyno.sock", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    return orjson.loads(r.stdout)


def started_as_the_kubelet_sees_it(name: str, spec: dict[str, Any]) -> None:
    """Run container ``name``'s startupProbe as the kubelet does, until it passes."""
    probe = spec["startupProbe"]
    for _ in range(probe["failureThreshold"]):
        r = podman("exec", name, *probe["exec"]["command"])
        if r.returncode == 0:
            return
        time.sleep(probe["periodSeconds"])
    raise AssertionError(r.stderr + podman("logs", name).stderr)


@pytest.mark.root
@pytest.mark.slow
def test_the_daemonset_pod_traces_a_trainer_in_another_container(image: Image) -> None:
    objects = kube("bpfdyno.yaml")
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (agent_spec,) = pod["containers"]
    (init_spec,) = pod["initContainers"]
    configmaps = {objects["ConfigMap"]["metadata"]["name"]: objects["ConfigMap"]["data"]}
    trainer_pod = kube("trainer-example.yaml")["Pod"]["spec"]
    (trainer_spec,) = trainer_pod["containers"]
    suffix = f"{os.getpid()}-{time.monotonic_ns()}"
    agent, trainer = f"bd-agent-{suffix}", f"bd-trainer-{suffix}"
    scratch = Path(tempfile.mkdtemp(prefix="bd-pod-"))
    scratch.chmod(0o755)
    fields = {"metadata.name": agent, "metadata.namespace": "bpfdyno", "spec.nodeName": "node"}
    kubelet: KubeletServer | None = None
    try:
        sources = volume_sources(pod, scratch, configmaps)
        # The node's kubelet, at its pod-resources socket in the directory the pod mounts.
        kubelet = KubeletServer(Path(sources["pod-resources"]) / "kubelet.sock").start()
        kubelet.answer = response([("ml", "trainer-example", "trainer", "nvidia.com/gpu",
                                    ("GPU-11111111-2222-3333-4444-555555555555",))])  # fmt: skip
        # The init container, then the agent. Only the endpoints on the node's network differ
        # from the manifest's, so as not to take a node agent's ports on this machine.
        r = podman("run", "--rm", *RUN_LIMITS, *container_flags(pod, init_spec, sources, fields),
                   image.ref, *init_spec["command"][1:])  # fmt: skip
        assert r.returncode == 0, r.stderr
        kineto = Path(sources["run"]) / "kineto"
        assert (kineto.stat().st_mode & 0o7777, kineto.stat().st_uid) == (0o1777, 0)
        prometheus = f"127.0.0.1:{free_port()}"
        r = podman(
            "run", "--detach", "--name", agent, *RUN_LIMITS,
            f"--stop-timeout={pod['terminationGracePeriodSeconds']}",
            *container_flags(pod, agent_spec, sources, fields), image.ref, *agent_spec["args"],
            "--set", 'legacy_rpc.listen=["127.0.0.1:0"]',
            "--set", f'export.prometheus.listen="{prometheus}"',
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        started_as_the_kubelet_sees_it(agent, agent_spec)

        # The trainer: trainer-example.yaml's pod (its environment, the Kineto directory and
        # nothing else of the agent's); the image is this one with PyTorch from the test's
        # environment, read-only, and the test's trainer as its command, in a job.
        site = next(p for p in sys.path if p.endswith("site-packages"))
        # Its own Kineto directory under the agent's per-pod root, made as the kubelet makes
        # a DirectoryOrCreate hostPath (root's, 0755); the agent serves it.
        (trainer_volume,) = trainer_pod["volumes"]
        host_dir = trainer_volume["hostPath"]["path"]
        assert host_dir == "/run/bpfdyno/pods/trainer-example"
        pod_dir = Path(sources["run"]) / host_dir.removeprefix("/run/bpfdyno/")
        pod_dir.mkdir(mode=0o755)
        trainer_sources = {trainer_volume["name"]: str(pod_dir)}
        r = podman(
            "run", "--detach", "--name", trainer, *RUN_LIMITS,
            *container_flags(trainer_pod, {**trainer_spec, "command": ["/bin/sh"]},
                             trainer_sources, fields),
            f"--volume={site}:/opt/torch:ro", f"--volume={TRAINERS}:/trainers:ro",
            "--env=PYTHONPATH=/opt/torch", "--env=KINETO_CONFIG=/trainers/kineto.conf",
            "--env=OMP_NUM_THREADS=1", "--env=SLURM_JOB_ID=4242",
            image.ref, "-c", "mkdir -m 700 /tmp/traces && exec python3 /trainers/linear.py",
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 120
        trainers: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not trainers:
            time.sleep(1)
            trainers = agent_json(agent, "trainers").get("trainers", [])
        assert trainers, podman("logs", trainer).stderr
        trainer_pid = int(podman("inspect", "--format", "{{.State.Pid}}", trainer).stdout)
        (t,) = trainers
        assert (t["pid"], t["job_id"], t["host_pid"]) == (1, 4242, trainer_pid)

        result = agent_json(
            agent, "gputrace", "--job-id", "4242", "--iterations", "2",
            "--log-file", "/tmp/traces/t.json", "--wait", "--timeout", "120",
        )  # fmt: skip
        (proc,) = result["trace"]["processes"]
        assert proc["state"] == "PROCESS_TRACE_STATE_WRITTEN", proc
        assert proc["kernel_tracks"]["state"] == "merged", proc
        # Kineto adds the pid it knows, the one of the trainer's own PID namespace.
        assert proc["output_path"] == "/tmp/traces/t_1.json"
        # The file is in the trainer's container only.
        assert not Path(sources["tmp"], "traces").exists()
        r = podman("exec", trainer, "python3", "-c",
                   "import json, os; p = '/tmp/traces/t_1.json'; "
                   "print(os.stat(p).st_size, len(json.load(open(p))['traceEvents']))")  # fmt: skip
        size, events = (int(x) for x in r.stdout.split())
        assert size == proc["size_bytes"] and events > 0, r.stderr

        status = agent_json(agent, "status")
        states = {c["name"]: c["state"] for c in status["collectors"]}
        up = {name for name, state in states.items() if state == "COLLECTOR_STATE_OK"}
        assert set(states) - up == HARDWARE, [
            c for c in status["collectors"] if c["name"] not in up
        ]
        assert {"sched", "net", "perf_sw", "procs", "host", "kineto_ipc", "capture",
                "export_prometheus", "kubelet"} <= up  # fmt: skip
        # The kubelet's answer, through the pod's hostPath: who holds which device.
        r = podman("exec", agent, "bpfdyno", "metrics", "k8s_container_device_info",
                   "--socket", "/run/bpfdyno/bpfdyno.sock", "--json")  # fmt: skip
        (series,) = orjson.loads(r.stdout)["series"]
        assert series["labels"] == {
            "namespace": "ml", "pod": "trainer-example", "container": "trainer",
            "resource": "nvidia.com/gpu", "device": "GPU-11111111-2222-3333-4444-555555555555",
        }  # fmt: skip
    finally:
        if kubelet is not None:
            kubelet.stop()
        for name in (trainer, agent):
            podman("rm", "--force", "--time", "5", name)
        shutil.rmtree(scratch, ignore_errors=True)


#: The toolkit's createContainer hook, as `nvidia-ctk hook create-symlinks` and
#: `update-ldcache` do it: in the runtime's namespace, on the container's root before it
#: starts (read from the bundle's config.json), make the library's link and its loader cache.
TOOLKIT_HOOK = """#!/usr/bin/python3
import json, os, subprocess, sys
state = json.load(sys.stdin)
bundle = state["bundle"]
root = json.load(open(os.path.join(bundle, "config.json")))["root"]["path"]
root = root if os.path.isabs(root) else os.path.join(bundle, root)
libdir = os.path.join(root, "usr/lib/x86_64-linux-gnu")
link = os.path.join(libdir, "libnvidia-ml.so.1")
if os.path.lexists(link):
    os.unlink(link)
os.symlink("libnvidia-ml.so.{version}", link)
subprocess.run(["ldconfig", "-r", root], check=True)
"""


@pytest.mark.root
@pytest.mark.slow
def test_the_daemonset_sees_the_gpus_the_nvidia_toolkit_injects(image: Image) -> None:
    """The agent's container started as the manifest starts it, on a node whose runtime
    injects the driver's NVML the way the NVIDIA toolkit's CDI spec does (the versioned
    library bind-mounted, a createContainer hook making libnvidia-ml.so.1 and the loader's
    cache): GPU metrics, and a host process's GPU memory under its host pid."""
    if platform.machine() != "x86_64":
        pytest.fail("this test knows the x86_64 library directory only")
    sys.path.insert(0, str(REPO / "tests" / "sources" / "gpu"))
    from gpu_fake_nvml import DEFAULT_VALUES, build_fake_nvml

    objects = kube("bpfdyno.yaml")
    pod = objects["DaemonSet"]["spec"]["template"]["spec"]
    (agent_spec,) = pod["containers"]
    (init_spec,) = pod["initContainers"]
    configmaps = {objects["ConfigMap"]["metadata"]["name"]: objects["ConfigMap"]["data"]}
    env = {e["name"]: e.get("value") for e in agent_spec["env"]}
    # What makes the toolkit hand a monitor every GPU and the NVML library.
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["NVIDIA_DRIVER_CAPABILITIES"]) == (
        "all", "compute,utility"
    )  # fmt: skip
    suffix = f"{os.getpid()}-{time.monotonic_ns()}"
    agent = f"bd-gpu-{suffix}"
    scratch = Path(tempfile.mkdtemp(prefix="bd-gpu-"))
    scratch.chmod(0o755)
    fields = {"metadata.name": agent, "metadata.namespace": "bpfdyno", "spec.nodeName": "node"}
    spec_file = Path("/var/run/cdi") / f"bpfdyno-test-{suffix}.yaml"
    holder = subprocess.Popen(["sleep", "600"])  # a process on the node that holds GPU memory
    kubelet: KubeletServer | None = None
    try:
        # The node's driver: the fake NVML under the real library's versioned name.
        version = DEFAULT_VALUES["driver_version"]
        driver = scratch / "driver"
        library = build_fake_nvml(driver).rename(driver / f"libnvidia-ml.so.{version}")
        control = scratch / "nvml"
        control.mkdir()
        control.chmod(0o755)
        values = {**DEFAULT_VALUES, "gpu.0.procs": f"{holder.pid}:{3 << 30}"}
        (control / "nvml.ctl").write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        hook = scratch / "toolkit-hook"
        hook.write_text(TOOLKIT_HOOK.format(version=version))
        hook.chmod(0o755)
        libdir = "/usr/lib/x86_64-linux-gnu"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_text(
            yaml.safe_dump(
                {
                    "cdiVersion": "0.5.0",
                    "kind": "test.bpfdyno/gpu",
                    "devices": [{"name": "all", "containerEdits": {"env": ["NVIDIA_CDI=1"]}}],
                    "containerEdits": {
                        "mounts": [{"hostPath": str(library),
                                    "containerPath": f"{libdir}/{library.name}",
                                    "options": ["ro", "nosuid", "nodev", "bind"]}],
                        "hooks": [{"hookName": "createContainer", "path": str(hook),
                                   "args": ["toolkit-hook"]}],
                    },
                }
            )
        )  # fmt: skip
        sources = volume_sources(pod, scratch, configmaps)
        kubelet = KubeletServer(Path(sources["pod-resources"]) / "kubelet.sock").start()
        kubelet.answer = response([])
        r = podman("run", "--rm", *RUN_LIMITS, *container_flags(pod, init_spec, sources, fields),
                   image.ref, *init_spec["command"][1:])  # fmt: skip
        assert r.returncode == 0, r.stderr
        r = podman(
            "run", "--detach", "--name", agent, *RUN_LIMITS,
            *container_flags(pod, agent_spec, sources, fields),
            # The runtime's part (the toolkit's CDI device) and the fake driver's control file.
            "--device=test.bpfdyno/gpu=all", f"--volume={control}:/run/fake-nvml:ro",
            "--env=FAKE_NVML_CONTROL=/run/fake-nvml/nvml.ctl",
            image.ref, *agent_spec["args"],
            "--set", 'legacy_rpc.listen=["127.0.0.1:0"]',
            "--set", f'export.prometheus.listen="127.0.0.1:{free_port()}"',
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        started_as_the_kubelet_sees_it(agent, agent_spec)
        states = {c["name"]: (c["state"], c.get("reason", "")) for c in
                  agent_json(agent, "status")["collectors"]}  # fmt: skip
        assert states["gpu"][0] == "COLLECTOR_STATE_OK", states["gpu"]
        deadline = time.monotonic() + 60
        up: dict[str, float] = {}
        while time.monotonic() < deadline and len(up) < 2:
            series = agent_json(agent, "metrics", "gpu_up")["series"]
            up = {s["labels"]["uuid"]: s["value"] for s in series}
            time.sleep(0.5)
        assert up == {DEFAULT_VALUES["gpu.0.uuid"]: 1.0, DEFAULT_VALUES["gpu.1.uuid"]: 1.0}
        # The host process on GPU 0, by the pid the node knows it by (the pod has hostPID).
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            table = agent_json(agent, "ps", "--sort", "gpu_memory", "--limit", "5")
            rows = [p for p in table["processes"] if p["pid"] == holder.pid]
            if rows and rows[0].get("gpu_memory_bytes"):
                break
            time.sleep(0.5)
        assert rows and rows[0]["gpu_memory_bytes"] == 3 << 30, rows
        assert rows[0]["comm"] == "sleep", rows
    finally:
        if kubelet is not None:
            kubelet.stop()
        podman("rm", "--force", "--time", "5", agent)
        spec_file.unlink(missing_ok=True)
        holder.kill()
        holder.wait()
        shutil.rmtree(scratch, ignore_errors=True)
