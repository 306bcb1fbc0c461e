"""Data sources (collectors): host, scheduler, network, perf counters, GPU, processes."""
