"""Host telemetry from procfs, and the agent's own footprint."""
