"""A kubelet's pod-resources endpoint for tests: the real v1 API, served by grpcio on a Unix
socket, answering List with whatever the test sets (`KubeletServer.pods`)."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from bpfdyno.sources.kubelet.v1 import api_pb2, api_pb2_grpc

#: (namespace, pod, container, resource, device ids) of one container's devices.
Devices = tuple[str, str, str, str, tuple[str, ...]]


def response(devices: Iterable[Devices]) -> api_pb2.ListPodResourcesResponse:
    """A List answer: one PodResources per pod, its containers in order."""
    pods: dict[tuple[str, str], api_pb2.PodResources] = {}
    for namespace, pod, container, resource, ids in devices:
        p = pods.setdefault((namespace, pod), api_pb2.PodResources(name=pod, namespace=namespace))
        c = next((c for c in p.containers if c.name == container), None)
        if c is None:
            c = p.containers.add(name=container)
        if ids:
            c.devices.add(resource_name=resource, device_ids=list(ids))
    return api_pb2.ListPodResourcesResponse(pod_resources=list(pods.values()))


class KubeletServer(api_pb2_grpc.PodResourcesListerServicer):
    """``v1.PodResourcesLister`` at ``socket``; `lists` counts the List calls."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.answer = api_pb2.ListPodResourcesResponse()
        self.lists = 0
        self._server: grpc.Server | None = None

    def List(self, request: Any, context: Any) -> api_pb2.ListPodResourcesResponse:
        self.lists += 1
        return self.answer

    def start(self) -> KubeletServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
