"""Which container holds each device: the kubelet's pod-resources answer, as a lookup.

The kubelet says, per pod and container, which devices its device plugins allocated
(``v1.PodResourcesLister/List``, `bpfdyno.sources.kubelet.v1`). Device plugins name a GPU in
several ways, all understood here:

- NVIDIA's plugin by default: the UUID NVML reports (``GPU-<uuid>``);
- NVIDIA's plugin with ``DEVICE_ID_STRATEGY=index``: NVML's index (``0``, ``1``...);
- GKE's plugin: the device node's name, ``nvidia<minor>`` (NVML's minor number);
- MIG slices: ``MIG-GPU-<uuid>/<gi>/<ci>`` (older NVIDIA plugins) or ``<index>:<slice>``
  (index strategy) — a slice belongs to its GPU; newer plugins' ``MIG-<uuid>`` names the
  slice by its own UUID, which this module cannot tie to its GPU (not attributed);
- time-slicing replicas: any of the above with ``::<n>``.

Several containers may hold one GPU (replicas, MIG slices). `DeviceOwners` answers "who holds
this GPU" only when exactly one container does: a shared GPU's series carry no pod (its
holders are each listed by ``k8s_container_device_info``). Devices allocated through Dynamic
Resource Allocation (claims) carry no device plugin id and are not attributed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bpfdyno.sources.kubelet.v1 import api_pb2

#: A device plugin's replica suffix (NVIDIA time-slicing: "<UUID>::<n>").
REPLICA_SEPARATOR = "::"
#: MIG slice ids of NVIDIA's plugin: "MIG-GPU-<uuid>/<gi>/<ci>" and "<index>:<slice>".
_MIG_OF_UUID = re.compile(r"MIG-(GPU-[0-9A-Fa-f-]+)/\d+/\d+")
_MIG_OF_INDEX = re.compile(r"(\d+):\d+")


def gpu_id(device: str) -> str:
    """The id of the whole GPU a device plugin's id names (replica and MIG slice removed)."""
    device = device.split(REPLICA_SEPARATOR)[0]
    if m := (_MIG_OF_UUID.fullmatch(device) or _MIG_OF_INDEX.fullmatch(device)):
        return m.group(1)
    return device


def gpu_aliases(uuid: str, index: int, minor: int | None) -> tuple[str, ...]:
    """Every id a device plugin may give this GPU: UUID, NVML index, ``nvidia<minor>``."""
    return (uuid, str(index)) + ((f"nvidia{minor}",) if minor is not None else ())


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
        self._holders: dict[str, frozenset[PodRef]] = {}
        for a in allocations:
            gpu = gpu_id(a.device)
            self._holders[gpu] = self._holders.get(gpu, frozenset()) | {a.owner}

    @classmethod
    def from_response(cls, response: api_pb2.ListPodResourcesResponse) -> DeviceOwners:
        """The lookup for a List answer."""
        return cls(tuple(_allocations(response)))

    def owner(self, aliases: Iterable[str]) -> PodRef | None:
        """The container holding the GPU known by ``aliases`` (`gpu_aliases`: a plugin uses
        one of them), None if none or several do."""
        holders: frozenset[PodRef] = frozenset()
        for alias in aliases:
            holders |= self._holders.get(alias, frozenset())
        return next(iter(holders)) if len(holders) == 1 else None

    def labels(self, aliases: Iterable[str]) -> dict[str, str]:
        """``namespace``, ``pod``, ``container`` of the GPU's holder; empty without one."""
        owner = self.owner(aliases)
        return owner.labels() if owner is not None else dict(NO_POD)


def _allocations(response: api_pb2.ListPodResourcesResponse) -> Iterator[Allocation]:
    for pod in response.pod_resources:
        for container in pod.containers:
            ref = PodRef(pod.namespace, pod.name, container.name)
            for devices in container.devices:
                for device in devices.device_ids:
                    yield Allocation(ref, devices.resource_name, device)
