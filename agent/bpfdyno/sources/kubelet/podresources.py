"""Which container holds each device: the kubelet's pod-resources answer, as a lookup.

The kubelet says, per pod and container, which devices its device plugins allocated
(``v1.PodResourcesLister/List``, `bpfdyno.sources.kubelet.v1`). NVIDIA's device plugin names
a GPU by its UUID, the UUID NVML reports; with time-slicing it hands out replicas named
``<UUID>::<n>``, so several containers may hold one GPU. `DeviceOwners` answers "who holds
this GPU" only when exactly one container does: a shared GPU's series carry no pod (its
holders are each listed by ``k8s_container_device_info``). Devices allocated through Dynamic
Resource Allocation (claims) carry no device plugin id and are not attributed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from bpfdyno.sources.kubelet.v1 import api_pb2

#: A device plugin's replica suffix (NVIDIA time-slicing: "<UUID>::<n>").
REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    """A container of a pod, as the kubelet names it."""

    namespace: str
    pod: str
    container: str

    def labels(self) -> dict[str, str]:
        """The labels dcgm-exporter and the Kubernetes instrumentation guidelines use."""
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container}


#: The labels of a device no single container holds.
NO_POD = {"namespace": "", "pod": "", "container": ""}


@dataclass(frozen=True, slots=True)
class Allocation:
    """One device of one container (a row of ``k8s_container_device_info``)."""

    owner: PodRef
    resource: str
    device: str


class DeviceOwners:
    """Device id -> the container that holds it, from one List answer (immutable).

    Args:
        allocations: every (container, resource, device) the kubelet reported.
    """

    def __init__(self, allocations: tuple[Allocation, ...] = ()) -> None:
        self.allocations = allocations
        holders: dict[str, set[PodRef]] = {}
        for a in allocations:
            holders.setdefault(a.device.split(REPLICA_SEPARATOR)[0], set()).add(a.owner)
        self._sole = {dev: next(iter(refs)) for dev, refs in holders.items() if len(refs) == 1}
        self.shared = frozenset(dev for dev, refs in holders.items() if len(refs) > 1)

    @classmethod
    def from_response(cls, response: api_pb2.ListPodResourcesResponse) -> DeviceOwners:
        """The lookup for a List answer."""
        return cls(tuple(_allocations(response)))

    def owner(self, device: str) -> PodRef | None:
        """The container holding ``device`` (a GPU UUID), None if none or several do."""
        return self._sole.get(device)

    def labels(self, device: str) -> dict[str, str]:
        """``namespace``, ``pod``, ``container`` of the device's holder; empty without one."""
        owner = self._sole.get(device)
        return owner.labels() if owner is not None else dict(NO_POD)


def _allocations(response: api_pb2.ListPodResourcesResponse) -> Iterator[Allocation]:
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                for device in devices.device_ids:
                    yield Allocation(ref, devices.resource_name, device)
