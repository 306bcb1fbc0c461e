"""On Kubernetes, each GPU's series name the pod and container holding it (the kubelet
collector's lookup), and the processes on it are that container's (for the process table)."""

from __future__ import annotations

import pytest
from gpu_fake_nvml import A100_UUID, H100_UUID, FakeNvml

from bpfdyno.sources.gpu.collector import GpuCollector
from bpfdyno.sources.kubelet.podresources import Allocation, DeviceOwners, PodRef

pytest_plugins = ("gpu_fake_nvml",)

TRAINER = PodRef("ml", "train-0", "trainer")


def gpu_labels(collector: GpuCollector) -> dict[str, dict[str, str]]:
    """uuid -> the labels of its gpu_up series."""
    return {
        dict(s.labels)["uuid"]: dict(s.labels)
        for s in collector.collect()
        if s.spec.name == "gpu_up"
    }


def test_gpu_series_carry_the_pod_holding_the_gpu(fake: FakeNvml) -> None:
    # The H100 is the trainer's; the A100 is time-sliced between two notebooks.
    owners = DeviceOwners(
        (
            Allocation(TRAINER, "nvidia.com/gpu", H100_UUID),
            Allocation(PodRef("ml", "nb-a", "lab"), "nvidia.com/gpu", f"{A100_UUID}::0"),
            Allocation(PodRef("dev", "nb-b", "lab"), "nvidia.com/gpu", f"{A100_UUID}::1"),
        )
    )
    latest = [DeviceOwners()]  # what the kubelet collector has said so far: nothing
    c = GpuCollector(str(fake.library), events_enabled=False, device_owners=lambda: latest[0])
    c.start()
    try:
        assert gpu_labels(c)[H100_UUID] == {
            "gpu": "0", "uuid": H100_UUID, "namespace": "", "pod": "", "container": "",
        }  # fmt: skip
        assert c.pods_by_pid() == {}
        latest[0] = owners  # the kubelet answered
        samples = list(c.collect())
        by_gpu = {
            dict(s.labels)["uuid"]: dict(s.labels) for s in samples if s.spec.name == "gpu_up"
        }
        assert by_gpu == {
            H100_UUID: {"gpu": "0", "uuid": H100_UUID, "namespace": "ml", "pod": "train-0",
                        "container": "trainer"},
            A100_UUID: {"gpu": "1", "uuid": A100_UUID, "namespace": "", "pod": "", "container": ""},
        }  # fmt: skip
        # Every per-GPU series of the H100 says whose it is, whatever labels it adds.
        h100 = [dict(s.labels) for s in samples if dict(s.labels).get("uuid") == H100_UUID]
        assert len(h100) > 20 and all(lab["pod"] == "train-0" for lab in h100)
        info = next(s for s in samples if s.spec.name == "gpu_info" and s.labels[0][1] == "0")
        assert dict(info.labels)["container"] == "trainer"
        # Processes on the H100 (4242; 4343 holds most of its memory there) are the trainer's.
        assert c.pods_by_pid() == {4242: TRAINER, 4343: TRAINER}
        latest[0] = DeviceOwners()  # the pod ended
        assert gpu_labels(c)[H100_UUID]["pod"] == ""
        assert c.pods_by_pid() == {}
    finally:
        c.close()


NB_A, NB_B = PodRef("ml", "nb-a", "lab"), PodRef("dev", "nb-b", "lab")


@pytest.mark.parametrize(
    ("h100_id", "a100_ids"),
    [
        # NVIDIA's plugin with DEVICE_ID_STRATEGY=index: NVML's index (time-sliced replicas).
        ("0", ("1::0", "1::1")),
        # GKE's plugin: the device node (the fake's H100 is /dev/nvidia3, its index is 0).
        ("nvidia3", ("nvidia1::0", "nvidia1::1")),
        # MIG: older NVIDIA plugins name a slice by its GPU's UUID, the index strategy by
        # "<gpu index>:<slice>"; two containers on slices of the A100 share it.
        (f"MIG-{H100_UUID}/1/0", ("1:0", "1:1")),
    ],
    ids=["index", "gke", "mig"],
)
def test_every_way_device_plugins_name_a_gpu_finds_its_pod(
    fake: FakeNvml, h100_id: str, a100_ids: tuple[str, str]
) -> None:
    owners = DeviceOwners(
        (
            Allocation(TRAINER, "nvidia.com/gpu", h100_id),
            Allocation(NB_A, "nvidia.com/gpu", a100_ids[0]),
            Allocation(NB_B, "nvidia.com/gpu", a100_ids[1]),
        )
    )
    c = GpuCollector(str(fake.library), events_enabled=False, device_owners=lambda: owners)
    c.start()
    try:
        labels = gpu_labels(c)
        assert {k: labels[H100_UUID][k] for k in ("namespace", "pod", "container")} == {
            "namespace": "ml", "pod": "train-0", "container": "trainer",
        }  # fmt: skip
        assert labels[A100_UUID]["pod"] == ""  # shared: no single holder
        assert c.pods_by_pid() == {4242: TRAINER, 4343: TRAINER}
    finally:
        c.close()


def test_a_newer_plugins_mig_uuid_is_not_mistaken_for_a_gpu(fake: FakeNvml) -> None:
    # "MIG-<uuid>" names a slice by its own UUID: which GPU it is on is not known here, so no
    # GPU is attributed (rather than a wrong one).
    owners = DeviceOwners(
        (Allocation(TRAINER, "nvidia.com/gpu", "MIG-8a2f0c1e-1111-2222-3333-444455556666"),)
    )
    c = GpuCollector(str(fake.library), events_enabled=False, device_owners=lambda: owners)
    c.start()
    try:
        assert {lab["pod"] for lab in gpu_labels(c).values()} == {""}
        assert c.pods_by_pid() == {}
    finally:
        c.close()
