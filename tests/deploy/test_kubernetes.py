"""deploy/kubernetes: every manifest validates against Kubernetes' own OpenAPI schemas
(bundled by the kubernetes-validate package, offline, strict: unknown fields fail), and the
DaemonSet has what the agent needs on a node."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from bpfdyno.core import config
from bpfdyno.tracing.ipc.pod_dirs import NAME_RE, max_name_bytes

REPO = Path(__file__).resolve().parents[2]
KUBE = REPO / "deploy" / "kubernetes"
#: The oldest and the newest Kubernetes versions the manifests are checked against.
VERSIONS = ("1.28", kubernetes_validate.latest_version())


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KUBE / name).read_text()) if d]


def _by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in docs}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("name", ["bpfdyno.yaml", "trainer-example.yaml"])
def test_manifests_validate_against_the_kubernetes_schema(name: str, version: str) -> None:
    docs = _docs(name)
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_validator_rejects_a_misspelled_field() -> None:
    ds = _by_kind(_docs("bpfdyno.yaml"))["DaemonSet"]
    ds["spec"]["template"]["spec"]["hostPid"] = True  # the real field is hostPID
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[-1], strict=True)


def test_the_daemonset_has_what_the_agent_needs() -> None:
    docs = _by_kind(_docs("bpfdyno.yaml"))
    pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    assert pod["hostPID"] is True  # every process, attributed to its pod via cgroups
    assert pod["hostNetwork"] is True
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["privileged"] is False
    assert {"BPF", "PERFMON"} <= set(sc["capabilities"]["add"])
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # The kubelet's pod-resources directory, where the agent looks for its socket by default.
    pod_resources = str(Path(config.KubeletSection().pod_resources_socket).parent)
    for name, host_path in (("btf", "/sys/kernel/btf"), ("tracefs", "/sys/kernel/tracing"),
                            ("pod-resources", pod_resources)):  # fmt: skip
        assert mounts[name] == host_path
        assert volumes[name]["hostPath"]["path"] == host_path
    # The init container makes the Kineto socket directory root's and sticky.
    (init,) = pod["initContainers"]
    assert init["command"] == ["install", "-d", "-m", "1777", "/run/bpfdyno/kineto"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    kineto_dir = env["KINETO_IPC_SOCKET_DIR"]
    # The Kineto socket directory is inside the hostPath mounted at /run/bpfdyno.
    assert kineto_dir.startswith(mounts["run"] + "/")
    assert volumes["run"]["hostPath"]["path"] == mounts["run"]
    assert "k8s.pod.name=$(POD_NAME)" in env["OTEL_RESOURCE_ATTRIBUTES"]


def test_trainer_pods_get_their_own_kineto_directory(tmp_path: Path) -> None:
    """The example pod mounts its own directory under the agent's per-pod root, at the
    path it has on the host (libkineto accepts replies only from under its own directory),
    inside the agent's /run/bpfdyno mount, with a name the agent serves."""
    docs = _by_kind(_docs("bpfdyno.yaml"))
    cfg_file = tmp_path / "bpfdyno.toml"
    cfg_file.write_text(docs["ConfigMap"]["data"]["bpfdyno.toml"])
    root = config.load(cfg_file).kineto.pod_socket_root
    assert root == "/run/bpfdyno/pods"
    agent_pod = docs["DaemonSet"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in agent_pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in agent_pod["volumes"]}
    assert root.startswith(mounts["run"] + "/")
    assert volumes["run"]["hostPath"]["path"] == mounts["run"]  # same path on the host
    trainer = _by_kind(_docs("trainer-example.yaml"))["Pod"]["spec"]
    (container,) = trainer["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KINETO_USE_DAEMON"] == "1"
    (volume,) = trainer["volumes"]
    (mount,) = container["volumeMounts"]
    assert volume["hostPath"]["path"] == mount["mountPath"] == env["KINETO_IPC_SOCKET_DIR"]
    directory = env["KINETO_IPC_SOCKET_DIR"]
    assert os.path.dirname(directory) == root
    name = os.path.basename(directory)
    assert NAME_RE.fullmatch(name) and len(name) <= max_name_bytes(root) == 36


def test_the_configmap_is_a_valid_agent_config(tmp_path: Path) -> None:
    cm = _by_kind(_docs("bpfdyno.yaml"))["ConfigMap"]
    path = tmp_path / "bpfdyno.toml"
    path.write_text(cm["data"]["bpfdyno.toml"])
    cfg = config.load(path)
    assert cfg.kineto.socket_dir == "/run/bpfdyno/kineto"
    assert cfg.export.prometheus.enabled and cfg.export.prometheus.listen == "0.0.0.0:9470"
    ds = _by_kind(_docs("bpfdyno.yaml"))["DaemonSet"]
    ports = ds["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert ports[0]["containerPort"] == 9470


def test_the_docs_grant_the_daemonset_what_the_manifest_grants() -> None:
    """docs/deployment.md lists the DaemonSet's capabilities and GPU environment exactly as
    the manifest has them: an operator who follows the docs gets the manifest's pod."""
    import re

    pod = _by_kind(_docs("bpfdyno.yaml"))["DaemonSet"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    added = container["securityContext"]["capabilities"]["add"]
    text = (REPO / "docs" / "deployment.md").read_text()
    section = text.split("## Kubernetes", 1)[1].split("\n## ", 1)[0]
    line = re.search(r"Not privileged: capabilities (.*?), all others dropped", section, re.S)
    assert line is not None
    assert re.findall(r"`([A-Z_]+)`", line.group(1)) == added
    env = {e["name"]: e.get("value") for e in container["env"]}
    # The toolkit injects the driver's NVML for these (the image ships none).
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "`NVIDIA_VISIBLE_DEVICES=all`" in section
    assert "`NVIDIA_DRIVER_CAPABILITIES=compute,utility`" in section
