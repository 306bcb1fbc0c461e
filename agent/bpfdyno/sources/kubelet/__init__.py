"""Kubernetes: which pod and container holds each device, from the kubelet."""
