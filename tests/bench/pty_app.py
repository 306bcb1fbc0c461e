"""A terminal UI run on a pseudo-terminal for the UI benchmarks: its CPU and its output.

`PtyApp` starts the command on a pty of a given size, reads (and counts) everything it
writes so it never blocks on a full terminal, and at the end types ``q`` and reaps it
(killed after 5 s). A `Window` measures one stretch: the app's share of one core (its
utime + stime from /proc) and the bytes per second it wrote.
"""

from __future__ import annotations

import fcntl
import os
import pty
import signal
import struct
import sys
import termios
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType


@dataclass(frozen=True, slots=True)
class Window:
    """What the app used over one measured stretch."""

    core_share: float  # of one core
    bytes_per_s: float  # written to the terminal


class PtyApp:
    """``argv`` (a Python module run by this interpreter) on a ``cols`` x ``rows`` pty.

    Args:
        argv: the arguments after ``python``, e.g. ``["-m", "bpfdyno", "top"]``.
        env: the app's environment (``TERM`` is set to xterm-256color).
    """

    def __init__(self, argv: Sequence[str], cols: int, rows: int, env: dict[str, str]) -> None:
        self._argv = [sys.executable, *argv]
        self._size = struct.pack("HHHH", rows, cols, 0, 0)
        self._env = {**env, "TERM": "xterm-256color"}
        self._hz = os.sysconf("SC_CLK_TCK")
        self._written = 0
        self._stop = threading.Event()
        self.pid = 0
        self._fd = -1

    def __enter__(self) -> PtyApp:
        self.pid, self._fd = pty.fork()
        if self.pid == 0:  # the child: the UI, on the pty's slave side
            fcntl.ioctl(0, termios.TIOCSWINSZ, self._size)
            os.execve(sys.executable, self._argv, self._env)
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        os.write(self._fd, b"q")
        self._stop.set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.1)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

    def type(self, keys: str) -> None:
        os.write(self._fd, keys.encode())

    def measure(self, seconds: float) -> Window:
        """Sleep ``seconds`` and say what the app used meanwhile."""
        t0, c0, b0 = time.monotonic(), self._cpu_ticks(), self._written
        time.sleep(seconds)
        t1, c1, b1 = time.monotonic(), self._cpu_ticks(), self._written
        return Window((c1 - c0) / self._hz / (t1 - t0), (b1 - b0) / (t1 - t0))

    def _cpu_ticks(self) -> int:
        with open(f"/proc/{self.pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rfind(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                return
            if not data:
                return
            self._written += len(data)
