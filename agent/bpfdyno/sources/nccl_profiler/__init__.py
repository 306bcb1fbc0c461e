"""NCCL's own profiler interface as a signal: a plugin library for the trainer (plugin.c, built
by build.py) and the agent's receiver of what it publishes (receiver.py). docs/nccl.md."""
