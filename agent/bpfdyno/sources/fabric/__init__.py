"""Fabric telemetry: RDMA ports (InfiniBand, RoCE) from sysfs, NIC driver statistics."""
