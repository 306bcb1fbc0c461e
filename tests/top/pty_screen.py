"""A command on a real pseudo-terminal, its screen kept as text by a terminal emulator (pyte),
so a test can press keys and read what a person would see.

`PtyScreen` forks the command onto a pty of a given size, feeds everything it writes into a
``pyte`` screen of the same size (on a reader thread, so the app never blocks on a full
terminal), and at the end types ``q`` and reaps it (killed after 5 s).
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
from collections.abc import Callable, Sequence
from types import TracebackType

import pyte


class PtyScreen:
    """``argv`` (a command line) on a ``cols`` x ``rows`` pty, its screen as text.

    Args:
        argv: the command and its arguments.
        env: its environment (``TERM`` is set to xterm-256color, ``COLUMNS``/``LINES`` to the
            size).
    """

    def __init__(self, argv: Sequence[str], cols: int, rows: int, env: dict[str, str]) -> None:
        self._argv = list(argv)
        self._size = struct.pack("HHHH", rows, cols, 0, 0)
        self._env = {**env, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(rows)}
        self._screen = pyte.Screen(cols, rows)
        self._stream = pyte.ByteStream(self._screen)
        self._lock = threading.Lock()
        self._raw = bytearray()
        self.pid = 0
        self._fd = -1
        self.exit_status: int | None = None

    def __enter__(self) -> PtyScreen:
        self.pid, self._fd = pty.fork()
        if self.pid == 0:  # the child: the command, on the pty's slave side
            fcntl.ioctl(0, termios.TIOCSWINSZ, self._size)
            os.execvpe(self._argv[0], self._argv, self._env)
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.exit_status is None:
            self.type("q")
            self.wait_exit(5.0)
        if self.exit_status is None:
            os.kill(self.pid, signal.SIGKILL)
            self.wait_exit(5.0)

    def type(self, keys: str) -> None:
        """Type ``keys`` (escape sequences included) into the terminal."""
        os.write(self._fd, keys.encode())

    def text(self) -> str:
        """The screen now, one line per row (trailing spaces kept: each is ``cols`` wide)."""
        with self._lock:
            return "\n".join(self._screen.display)

    def raw(self) -> bytes:
        """Everything the command wrote so far."""
        with self._lock:
            return bytes(self._raw)

    def wait_for(
        self, what: str | Callable[[str], bool], timeout: float = 60.0, why: str = ""
    ) -> str:
        """The screen once it shows ``what`` (a substring, or a test of the screen's text).

        Raises:
            AssertionError: not within ``timeout`` seconds (with the screen as it was).
        """
        test = what if callable(what) else (lambda text: what in text)
        deadline = time.monotonic() + timeout
        while True:
            text = self.text()
            if test(text):
                return text
            if time.monotonic() > deadline or self._exited():
                raise AssertionError(
                    f"the screen never showed {why or what!r} in {timeout:g} s "
                    f"(exit status {self.exit_status}):\n{text}\n"
                    f"output tail: {self.raw()[-1500:]!r}"
                )
            time.sleep(0.1)

    def wait_exit(self, timeout: float) -> int | None:
        """The command's exit status once it ends (None: still running after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while not self._exited() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.exit_status

    def _exited(self) -> bool:
        if self.exit_status is not None:
            return True
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return False
        self.exit_status = os.waitstatus_to_exitcode(status)
        return True

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self._raw += data
                self._stream.feed(data)


def bpfdyno(*args: str) -> list[str]:
    """``python -m bpfdyno ARGS`` with this interpreter."""
    return [sys.executable, "-m", "bpfdyno", *args]
