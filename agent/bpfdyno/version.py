"""bpfdyno: eBPF-based monitoring and on-demand PyTorch tracing agent."""

__version__ = "0.1.0"
