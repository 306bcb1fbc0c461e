"""Network telemetry from BPF."""
