"""The kernel tracks a trace can carry: the names every client and the agent use.

A request names them as a comma-separated list (``net,sched``), ``all``, or ``none``; an
empty text means "the agent's default" (``[capture] default_tracks``). What each track holds
is in docs/tracing.md.
"""

from __future__ import annotations

#: Every kernel track, in the order they are listed.
KERNEL_TRACKS = ("net", "sched", "nccl", "gpu", "fabric")
#: The words a request may use besides the track names.
ALL = "all"
NONE = "none"

# The categories of the kernel tracks' events in a merged trace: the contract between the
# writer (`bpfdyno.tracing.capture.tracks`) and the readers (`bpfdyno.analysis`), so both
# import them from here.
CAT_NET = "bpfdyno.net"
CAT_SCHED = "bpfdyno.sched"
CAT_NCCL = "bpfdyno.nccl"
CAT_GPU = "bpfdyno.gpu"
CAT_FABRIC = "bpfdyno.fabric"
#: The ``cause`` of a sched slice that is a thread's time in direct memory reclaim (on a CPU,
#: around the off-CPU slices inside it), not an off-CPU interval.
SCHED_RECLAIM = "memory reclaim"
CAT_INFO = "bpfdyno.info"
#: NCCL's profiler plugin's rows of the nccl track (`bpfdyno.sources.nccl_profiler.track`).
CAT_NCCL_PROFILER = "bpfdyno.nccl_profiler"


def parse_kernel_tracks(text: str) -> tuple[str, ...] | None:
    """The tracks a request's text names, in canonical order; None for "" (the default).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    words = [w.strip().lower() for w in text.split(",") if w.strip()]
    if not words:
        return None
    if words == [ALL]:
        return KERNEL_TRACKS
    if words == [NONE]:
        return ()
    unknown = [w for w in words if w not in KERNEL_TRACKS]
    if unknown:
        raise ValueError(
            f"unknown kernel track(s) {', '.join(repr(w) for w in unknown)}: name some of "
            f"{','.join(KERNEL_TRACKS)}, or '{ALL}', or '{NONE}'"
        )
    return tuple(t for t in KERNEL_TRACKS if t in words)
