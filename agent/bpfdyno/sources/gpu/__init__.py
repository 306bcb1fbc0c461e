"""GPU telemetry: NVML (+ GPM) and DCGM."""
