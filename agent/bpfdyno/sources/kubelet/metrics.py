"""The kubelet source's metrics, declared once."""

from __future__ import annotations

from bpfdyno.core.metrics import MetricKind, MetricTable

TABLE = MetricTable("kubelet")

DEVICE_INFO = TABLE.declare(
    "k8s_container_device_info",
    MetricKind.GAUGE,
    "info",
    "Always 1; the labels say which container the kubelet gave a device to: its namespace, "
    "pod and container, the device plugin's resource name and the device's id (a GPU's "
    "UUID for NVIDIA's plugin) (pod-resources API, List).",
    ("namespace", "pod", "container", "resource", "device"),
)
