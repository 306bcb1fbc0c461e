"""The kubelet collector against a real gRPC server implementing the kubelet's v1
pod-resources API on a Unix socket: the lookup (who holds which GPU), its info samples, a
node without the socket, and a kubelet that stops answering and comes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubelet_server import KubeletServer, response

from bpfdyno.core.metrics import Sample
from bpfdyno.sources.base import CollectorUnavailable
from bpfdyno.sources.kubelet.collector import PodResourcesCollector
from bpfdyno.sources.kubelet.podresources import NO_POD, PodRef

GPU0 = "GPU-11111111-2222-3333-4444-555555555555"
GPU1 = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
GPU2 = "GPU-99999999-8888-7777-6666-555555555555"
#: A training pod with GPU 0 in its trainer container, a sidecar without devices, and GPU 1
#: time-sliced (NVIDIA's replicas "<UUID>::<n>") between two pods; GPU 2 is free.
ALLOCATED = [
    ("ml", "train-0", "trainer", "nvidia.com/gpu", (GPU0,)),
    ("ml", "train-0", "sidecar", "", ()),
    ("ml", "notebook-a", "lab", "nvidia.com/gpu", (f"{GPU1}::0",)),
    ("dev", "notebook-b", "lab", "nvidia.com/gpu", (f"{GPU1}::3",)),
    ("kube-system", "sriov", "cni", "intel.com/sriov", ("0000:3b:02.1",)),
]


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[KubeletServer]:
    server = KubeletServer(tmp_path / "kubelet.sock").start()
    server.answer = response(ALLOCATED)
    yield server
    server.stop()


@pytest.fixture
def collector(kubelet: KubeletServer) -> Iterator[PodResourcesCollector]:
    c = PodResourcesCollector(str(kubelet.socket))
    c.start()
    yield c
    c.close()


def rows(samples: list[Sample] | tuple[Sample, ...]) -> list[dict[str, str]]:
    assert all(s.spec.name == "k8s_container_device_info" and s.value == 1 for s in samples)
    return [dict(s.labels) for s in samples]


def test_who_holds_each_gpu(collector: PodResourcesCollector, kubelet: KubeletServer) -> None:
    assert collector.owners.owner([GPU0]) is None  # nothing asked yet
    samples = list(collector.collect())
    assert kubelet.lists == 1
    assert rows(samples) == [
        {"namespace": "ml", "pod": "train-0", "container": "trainer",
         "resource": "nvidia.com/gpu", "device": GPU0},
        {"namespace": "ml", "pod": "notebook-a", "container": "lab",
         "resource": "nvidia.com/gpu", "device": f"{GPU1}::0"},
        {"namespace": "dev", "pod": "notebook-b", "container": "lab",
         "resource": "nvidia.com/gpu", "device": f"{GPU1}::3"},
        {"namespace": "kube-system", "pod": "sriov", "container": "cni",
         "resource": "intel.com/sriov", "device": "0000:3b:02.1"},
    ]  # fmt: skip
    owners = collector.owners
    assert owners.owner([GPU0]) == PodRef("ml", "train-0", "trainer")
    assert owners.labels([GPU0]) == {"namespace": "ml", "pod": "train-0", "container": "trainer"}
    # Shared by two containers: no single holder, so no pod on its series.
    assert owners.owner([GPU1]) is None and owners.labels([GPU1]) == NO_POD
    assert owners.owner([GPU2]) is None and owners.labels([GPU2]) == NO_POD


def test_a_pod_that_ends_frees_its_gpu(
    collector: PodResourcesCollector, kubelet: KubeletServer
) -> None:
    collector.collect()
    assert collector.owners.owner([GPU0]) is not None
    kubelet.answer = response([a for a in ALLOCATED if a[1] != "train-0"])
    assert len(collector.collect()) == 3
    assert collector.owners.owner([GPU0]) is None


def test_no_socket_means_not_kubernetes(tmp_path: Path) -> None:
    with pytest.raises(CollectorUnavailable) as e:
        PodResourcesCollector(str(tmp_path / "kubelet.sock")).start()
    assert str(e.value) == (
        f"no kubelet pod-resources socket at {tmp_path}/kubelet.sock: not a Kubernetes node, "
        "so devices are not attributed to pods (in a pod, mount the kubelet's pod-resources "
        "directory there; elsewhere disable [collectors.kubelet])"
    )


def test_a_kubelet_that_stops_answering_leaves_no_stale_attribution(
    collector: PodResourcesCollector, kubelet: KubeletServer
) -> None:
    collector.collect()
    kubelet.stop()  # a kubelet restart: the socket goes away for a while
    with pytest.raises(RuntimeError, match=r"did not answer List: UNAVAILABLE"):
        collector.collect()
    assert collector.owners.owner([GPU0]) is None
    kubelet.start()
    assert len(collector.collect()) == 4  # the daemon's retry finds it again
    assert collector.owners.owner([GPU0]) == PodRef("ml", "train-0", "trainer")
