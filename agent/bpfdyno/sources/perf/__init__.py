"""Per-CPU perf counters: hardware (PMU) and software."""
