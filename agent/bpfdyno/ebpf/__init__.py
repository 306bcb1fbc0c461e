"""BPF programs: kernel headers, loading, attaching, ring buffers, map reads, run stats."""
