"""On Kubernetes, each GPU's series name the pod and container holding it (the kubelet
collector's lookup), and the processes on it are that container's (for the process table)."""

from __future__ import annotations

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
