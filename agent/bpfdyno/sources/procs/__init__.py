"""The process table: the most active processes joined across /proc, BPF and NVML."""
