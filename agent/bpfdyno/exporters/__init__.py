"""Metric sinks: every collection round, to files and monitoring systems."""
