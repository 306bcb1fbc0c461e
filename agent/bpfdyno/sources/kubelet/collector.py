"""The ``kubelet`` collector: which pod and container holds each device, from the kubelet.

On a Kubernetes node the kubelet serves its pod-resources API (``v1.PodResourcesLister``) on
``/var/lib/kubelet/pod-resources/kubelet.sock`` — what dcgm-exporter reads to put
``namespace``, ``pod`` and ``container`` on GPU metrics. Each round calls ``List`` and
replaces the lookup (`DeviceOwners`) the GPU collector and the process table consult; the
round's samples are one ``k8s_container_device_info`` per allocated device.

No socket at start means this is not a Kubernetes node (or, in a pod, the kubelet's
directory is not mounted): the collector is unavailable with that reason, said once. A
kubelet that stops answering makes it degraded and empties the lookup (no attribution is
better than a stale one); the next answer restores it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import grpc

from bpfdyno.core.metrics import Sample, sample
from bpfdyno.sources.base import Collector, CollectorUnavailable
from bpfdyno.sources.kubelet.metrics import DEVICE_INFO
from bpfdyno.sources.kubelet.podresources import DeviceOwners
from bpfdyno.sources.kubelet.v1 import api_pb2, api_pb2_grpc

log = logging.getLogger(__name__)

#: Where the kubelet serves its pod-resources API (its --root-dir is /var/lib/kubelet).
DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
#: How long one List may take; the kubelet answers from memory.
LIST_TIMEOUT_S = 5.0


class PodResourcesCollector(Collector):
    """Device allocations from the kubelet's pod-resources API.

    Args:
        socket_path: the kubelet's pod-resources socket.
    """

    name = "kubelet"

    def __init__(self, socket_path: str = DEFAULT_SOCKET) -> None:
        self.socket_path = socket_path
        #: The latest answer as a lookup; replaced whole, so readers on other threads need
        #: no lock.
        self.owners = DeviceOwners()
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    def start(self) -> None:
        """Connect to the kubelet's socket.

        Raises:
            CollectorUnavailable: there is no socket: not a Kubernetes node.
        """
        if not os.path.exists(self.socket_path):
            raise CollectorUnavailable(
                f"no kubelet pod-resources socket at {self.socket_path}: not a Kubernetes "
                "node, so devices are not attributed to pods (in a pod, mount the kubelet's "
                "pod-resources directory there; elsewhere disable [collectors.kubelet])",
                absent=True,
            )
        self._connect()

    def _connect(self) -> api_pb2_grpc.PodResourcesListerStub:
        self._channel = grpc.insecure_channel(f"unix://{self.socket_path}")
        self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)
        return self._stub

    def collect(self) -> Sequence[Sample]:
        """List the pods' devices: the new lookup, and one info sample per device."""
        stub = self._stub or self._connect()
        try:
            response = stub.List(api_pb2.ListPodResourcesRequest(), timeout=LIST_TIMEOUT_S)
        except grpc.RpcError as e:
            self.owners = DeviceOwners()
            # A new channel next round: the kubelet makes a new socket when it restarts, and
            # a fresh channel tries it at once rather than after gRPC's reconnect back-off.
            self.close()
            raise RuntimeError(
                f"the kubelet at {self.socket_path} did not answer List: {e.code().name} "
                f"{e.details()}"
            ) from None
        self.owners = owners = DeviceOwners.from_response(response)
        return [
            sample(DEVICE_INFO, 1, {**a.owner.labels(), "resource": a.resource, "device": a.device})
            for a in owners.allocations
        ]

    def close(self) -> None:
        """Close the channel to the kubelet. Idempotent."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._stub = None
        self.owners = DeviceOwners()
