"""The one error type of bpfdyno's BPF plumbing."""

from __future__ import annotations


class BpfLoadError(Exception):
    """A BPF program could not be compiled, loaded or attached; says why and what to do."""
