"""gloo's peer waits: how long a process's threads waited for its peers' data in gloo
(``bpf/gloo.bpf.c``, read by `waits.GlooWaits`). docs/detection.md."""
