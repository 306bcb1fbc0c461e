"""Scheduler telemetry from BPF."""
