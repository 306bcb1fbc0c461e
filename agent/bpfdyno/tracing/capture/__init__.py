"""The kernel tracks of on-demand traces: what the agent records of each traced process
(network and scheduler from BPF, NCCL calls from uprobes, GPU counters from NVML) while its
trace runs, and how it becomes trace events (see docs/tracing.md)."""
