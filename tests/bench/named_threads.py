"""``python named_threads.py ARGS...``: ``bpfdyno ARGS...`` with every Python thread's name
given to the kernel, so ``/proc/PID/task/*/comm`` says which thread is which (Python threads
carry no name there; the benchmarks' per-thread breakdown reads it)."""

from __future__ import annotations

import ctypes
import runpy
import sys
import threading

_PR_SET_NAME = 15
_libc = ctypes.CDLL(None)
_start = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]


def _named(self: threading.Thread) -> None:
    _libc.prctl(_PR_SET_NAME, self.name[:15].encode(), 0, 0, 0)
    _start(self)


threading.Thread._bootstrap_inner = _named  # type: ignore[attr-defined]
sys.argv = ["bpfdyno", *sys.argv[1:]]
runpy.run_module("bpfdyno", run_name="__main__")
