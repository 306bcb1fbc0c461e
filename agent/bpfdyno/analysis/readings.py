"""How a summary's numbers are said in words: the thresholds the words rest on.

Kept apart from `bpfdyno.analysis.summary` (which reads files) so that a client printing a
summary it got from the agent does not load the file reader.
"""

from __future__ import annotations

#: A process whose GPUs ran kernels at least this share of its window is GPU-bound: its GPU
#: work, not its CPU, data or network, sets the pace.
GPU_BOUND_SHARE = 0.8


def gpu_bound(gpu_busy_seconds: float, window_seconds: float) -> bool:
    """Whether a process's GPUs were busy enough of its window to call it GPU-bound."""
    return window_seconds > 0 and gpu_busy_seconds >= GPU_BOUND_SHARE * window_seconds
