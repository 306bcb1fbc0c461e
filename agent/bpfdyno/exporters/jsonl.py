"""JSON-lines exporter: one line per collection round, to stdout or a size-rotated file.

Line format (orjson, one object per line)::

    {"ts": 1732180000.123, "host": "node1", "collector": "host",
     "values": {"cpu_user_ratio{cpu=\"0\"}": 0.12, "memory_used_bytes": 123456}}

Series keys use the Prometheus exposition syntax, so they are unambiguous and greppable.
Rotation happens *between* lines: before a line would take the file past ``max_bytes`` the
file is renamed to ``path.1`` (older ones shift up to ``path.<backups>``) and a new file is
started. A line is written with one ``write`` call on an ``O_APPEND`` descriptor, so a reader
never sees half a line and rotation never truncates one; a line torn by a crash is removed
when the file is next opened (see `RotatingLineWriter`). Writing happens on the exporter's
own thread; if the file cannot be written (disk full), lines are kept and retried, up to a
bound.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import sys
import threading
from collections import deque
from typing import IO

import orjson

from bpfdyno.core.config import JsonlSection
from bpfdyno.core.metrics import Labels, Round
from bpfdyno.core.status import PartState, PartStatus

log = logging.getLogger(__name__)

#: Lines kept for retry while the output cannot be written, before the oldest are dropped.
MAX_PENDING_LINES = 100_000


def series_key(name: str, labels: Labels) -> str:
    """``name{a="x",b="y"}`` with Prometheus escaping; bare ``name`` without labels."""
    if not labels:
        return name
    parts = []
    for k, v in labels:
        esc = v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        parts.append(f'{k}="{esc}"')
    return f"{name}{{{','.join(parts)}}}"


def encode_round(rnd: Round, host: str) -> bytes:
    values = {series_key(s.spec.name, s.labels): s.value for s in rnd.samples if s.value == s.value}
    obj = {"ts": round(rnd.ts, 6), "host": host, "collector": rnd.collector, "values": values}
    return orjson.dumps(obj) + b"\n"


class RotatingLineWriter:
    """Appends whole lines to a file, rotating by size between lines. Not thread-safe.

    The file never holds half a line: each line goes out in one ``write`` on an
    ``O_APPEND`` descriptor (looping only if the kernel writes less); a write that fails
    part-way is truncated back; and a torn last line left by a crash (SIGKILL, power loss in
    the middle of a write) is cut off when the file is opened again, so appending never
    glues a new line onto a broken one.
    """

    def __init__(self, path: str, max_bytes: int, backups: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._fd: int | None = None
        self._size = 0
        self.rotations = 0
        #: Bytes of torn last lines removed when opening the file (left by a crash).
        self.repaired_bytes = 0

    def _open(self) -> int:
        if self._fd is None:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                self._size = self._repair_torn_tail(fd)
            except OSError:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def _repair_torn_tail(self, fd: int) -> int:
        """Cut a last line that has no newline (a crash mid-write); returns the new size."""
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        with open(self.path, "rb") as f:
            end = size
            while end > 0:
                start = max(0, end - 65536)
                f.seek(start)
                chunk = f.read(end - start)
                if end == size and chunk.endswith(b"\n"):
                    return size  # the usual case: the file ends with a whole line
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    end = start + newline + 1
                    break
                end = start
        os.ftruncate(fd, end)
        self.repaired_bytes += size - end
        log.warning(
            "%s ended with %d bytes of a line cut short (the agent was killed while writing "
            "it); removed them so every line is whole",
            self.path,
            size - end,
        )
        return end

    def write_line(self, line: bytes) -> None:
        fd = self._open()
        if self._size > 0 and self._size + len(line) > self.max_bytes:
            self._rotate()
            fd = self._open()
        view = memoryview(line)
        try:
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            os.ftruncate(fd, self._size)  # a disk-full write must not leave half a line
            raise
        self._size += len(line)

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        if self.backups == 0:
            os.unlink(self.path)
        else:
            for i in range(self.backups - 1, 0, -1):
                src = f"{self.path}.{i}"
                if os.path.exists(src):
                    os.replace(src, f"{self.path}.{i + 1}")
            os.replace(self.path, f"{self.path}.1")
        self.rotations += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class JsonlExporter:
    """A `RoundSink` writing JSON lines on a background thread."""

    def __init__(self, cfg: JsonlSection, stdout: IO[bytes] | None = None) -> None:
        self._host = socket.gethostname()
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._stdout = stdout
        self._writer: RotatingLineWriter | None = None
        if cfg.path != "-":
            self._writer = RotatingLineWriter(cfg.path, cfg.max_bytes, cfg.backups)
        elif self._stdout is None:
            self._stdout = sys.stdout.buffer
        self._pending: deque[bytes] = deque()
        self.dropped_lines = 0
        self.write_errors = 0
        self.lines_written = 0
        #: The last write failure, "" once a write succeeds again (read by `status`).
        self.last_error = ""
        self._target = cfg.path
        self._thread = threading.Thread(target=self._run, name="export-jsonl", daemon=True)
        self._thread.start()

    def submit(self, rnd: Round) -> None:
        self._queue.put(encode_round(rnd, self._host))

    def status(self) -> PartStatus:
        """ok while lines are written; degraded (with the error and the fix) while they fail."""
        where = "stdout" if self._target == "-" else self._target
        if self.last_error:
            return PartStatus(
                "export_jsonl",
                PartState.DEGRADED,
                f"writing {where} fails ({self.last_error}); lines are kept and retried "
                f"({len(self._pending)} waiting, {self.dropped_lines} dropped): free space or "
                "fix permissions, or change [export.jsonl] path",
                errors=self.write_errors,
            )
        return PartStatus(
            "export_jsonl",
            PartState.OK,
            f"{self.lines_written} lines to {where}",
            errors=self.write_errors,
        )

    def close(self) -> None:
        """Write everything queued, then close the file."""
        self._queue.put(None)
        self._thread.join(timeout=10)
        if self._writer is not None:
            self._writer.close()

    def _run(self) -> None:
        logged = False
        while True:
            line = self._queue.get()
            if line is None:
                self._flush_pending()
                return
            self._pending.append(line)
            if len(self._pending) > MAX_PENDING_LINES:
                self._pending.popleft()
                self.dropped_lines += 1
            try:
                self._flush_pending()
                logged = False
                self.last_error = ""
            except OSError as e:
                self.write_errors += 1
                self.last_error = str(e)
                if not logged:
                    log.error("JSON-lines export failed (%s); keeping lines and retrying", e)
                    logged = True

    def _flush_pending(self) -> None:
        while self._pending:
            line = self._pending[0]
            if self._writer is not None:
                self._writer.write_line(line)
            else:
                assert self._stdout is not None
                self._stdout.write(line)
                self._stdout.flush()
            self._pending.popleft()
            self.lines_written += 1
