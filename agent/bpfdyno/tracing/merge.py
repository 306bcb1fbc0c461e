"""Adding events to a finished Kineto trace file without parsing it: `merge_into_trace`.

Kineto files reach hundreds of MB, so the file is never loaded as a whole. Its structure is
checked where it matters, and the body is copied byte for byte by the kernel
(``copy_file_range``):

* the head (up to `MAX_HEAD_BYTES`) is parsed member by member up to ``"traceEvents": [``:
  it must be a JSON object, and the members before the events (``baseTimeNanoseconds``,
  ``distributedInfo``...) are read;
* the tail (up to `MAX_TAIL_BYTES`) must end with the ``]`` closing ``traceEvents``, then
  only plain members (``"traceName": ...``) and the closing ``}``; the last event before the
  ``]`` must parse as a JSON object. A truncated file fails here;
* the profiler's own span (``"PyTorch Profiler (0)"``, category ``Trace``) gives the trace
  window. It is looked for from the end backwards, wherever it is: a CPU trace has it in its
  last bytes, a CUDA trace between the CPU ops and the GPU activities (mid-file).

(`bpfdyno.analysis.tracefile` knows that structure; this module splices.)

The file is opened once, without following a link and without blocking (a FIFO put there
is refused, not waited on), and everything — the checks, the copy, the final comparison —
goes through that one descriptor: the path is never opened again, so nothing swapped in
meanwhile is read.

The new events are written just before that ``]`` (and new top-level members, if any, just
after it), into a temporary file in the same directory, which then replaces the original
with ``rename(2)`` — atomically, keeping the original's mode and owner. If anything fails
(no space left, a file that is not a complete Kineto trace, the file changing meanwhile),
the temporary file is removed and the original stays byte for byte as it was;
`MergeError` says why.

A gzip-compressed trace (``.json.gz`` whose content starts with the gzip magic) is
decompressed twice as a stream (once to read its head and tail and find the span, once to
copy it) and written compressed again (level `GZIP_LEVEL`); slower, still in bounded memory,
and refused past `ReadLimits.max_json_bytes` of JSON (a small file that inflates to
gigabytes). (PyTorch 2.13's Kineto
writes plain JSON even under a ``.gz`` name; the content decides, not the name.)
"""

from __future__ import annotations

import contextlib
import decimal
import errno
import gzip
import json
import os
import secrets
import time
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

from bpfdyno.analysis.tracefile import (
    DEFAULT_LIMITS,
    MAX_HEAD_BYTES,
    MAX_TAIL_BYTES,
    ReadLimits,
    SpanFinder,
    TraceFileError,
    find_profiler_span,
    open_regular,
    parse_head,
    parse_tail,
)

#: Compression level of a re-written gzip trace (fast; Kineto's JSON compresses ~10x anyway).
GZIP_LEVEL = 1
#: Chunk size of streamed copies.
CHUNK = 1 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_WS = b" \t\r\n"


class MergeError(Exception):
    """The merge could not be done; the original file is unchanged. Says why."""


@dataclass(frozen=True, slots=True)
class TraceLayout:
    """What the merge learned about a trace file from its head and tail.

    Attributes:
        compressed: the content is gzip.
        size: bytes of (decompressed) JSON.
        close_offset: offset of the ``]`` that closes ``traceEvents``.
        empty: ``traceEvents`` holds no event.
        base_ns: ``baseTimeNanoseconds`` (0 when the file has none).
        window_ns: the profiler's span (start, end) in ns relative to ``base_ns``, or None
            when the file has none.
        members: the top-level members other than ``traceEvents`` (``trace_id``,
            ``distributedInfo``...).
    """

    compressed: bool
    size: int
    close_offset: int
    empty: bool
    base_ns: int
    window_ns: tuple[int, int] | None
    members: dict[str, Any] = field(default_factory=dict)


#: Something that writes events (serialized JSON objects) by calling the function it is given.
EventWriter = Callable[[Callable[[bytes], None]], None]


@dataclass(frozen=True, slots=True)
class Insertion:
    """What to add to a trace: events and top-level members.

    ``events`` is a sequence, or an `EventWriter` that produces them while the file is
    written, so they never all sit in memory at once.
    """

    events: Iterable[bytes] | EventWriter
    members: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MergeResult:
    """A merge that was done."""

    events_added: int
    size_before: int  # bytes on disk
    size_after: int
    seconds: float


def merge_into_trace(
    path: str,
    build: Callable[[TraceLayout], Insertion],
    limits: ReadLimits = DEFAULT_LIMITS,
) -> tuple[TraceLayout, MergeResult]:
    """Insert the events (and members) ``build`` returns into trace ``path``.

    Args:
        path: a complete Kineto trace file (plain or gzip JSON).
        build: called with the file's layout (base time, window, members); returns what to
            add. Members the file already has are not added. If it returns no event, the
            file is left alone.
        limits: how much JSON a gzip file may inflate to.

    Returns:
        The layout and what was done.

    Raises:
        MergeError: the file is not a complete trace, cannot be written next to, or changed
            while merging; the original is unchanged.
    """
    t0 = time.monotonic()
    try:
        src = open_regular(path)
    except TraceFileError as e:
        raise MergeError(f"{e}; the kernel tracks were not merged") from e
    with src:
        before = os.fstat(src.fileno())
        layout = inspect_open_trace(src, path, limits)
        insertion = build(layout)
        if not callable(insertion.events) and not insertion.events:
            return layout, MergeResult(0, before.st_size, before.st_size, time.monotonic() - t0)
        members = b"".join(
            b",\n" + json.dumps(key).encode() + b": " + json.dumps(value).encode()
            for key, value in insertion.members.items()
            if key not in layout.members and key not in ("traceEvents", "baseTimeNanoseconds")
        )
        directory = os.path.dirname(path) or "."
        tmp = os.path.join(
            directory, f".{os.path.basename(path)}.bpfdyno-merge-{secrets.token_hex(4)}.tmp"
        )
        insert = _Inserted(insertion.events, layout.empty)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise MergeError(
                f"cannot create a file next to {path} ({e.strerror}); the trace is as Kineto "
                "wrote it"
            ) from e
        try:
            with os.fdopen(fd, "wb") as out:
                if layout.compressed:
                    _write_gzip(src, out, layout, insert, members)
                else:
                    _write_plain(src, out, layout, insert, members)
                out.flush()
                os.fsync(out.fileno())
                with contextlib.suppress(OSError):  # not permitted (not root): keep ours
                    os.fchown(out.fileno(), before.st_uid, before.st_gid)
                os.fchmod(out.fileno(), before.st_mode & 0o7777)
            if not _unchanged(src, path, before):
                raise MergeError(f"{path} changed while the kernel tracks were merged into it")
            os.replace(tmp, path)
        except MergeError:
            _unlink(tmp)
            raise
        except OSError as e:
            _unlink(tmp)
            hint = (
                "; free space in that directory" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
            )
            raise MergeError(
                f"writing the merged copy of {path} failed ({e.strerror}{hint}); the trace is "
                "as Kineto wrote it"
            ) from e
        except BaseException:
            _unlink(tmp)
            raise
    _fsync_dir(directory)
    size_after = os.stat(path).st_size
    return layout, MergeResult(insert.count, before.st_size, size_after, time.monotonic() - t0)


def _unchanged(src: IO[bytes], path: str, before: os.stat_result) -> bool:
    """Whether the file read is as it was and still the one at ``path`` (not replaced)."""
    now = os.fstat(src.fileno())
    try:
        at_path = os.lstat(path)
    except OSError:
        return False
    return (now.st_size, now.st_mtime_ns) == (before.st_size, before.st_mtime_ns) and (
        at_path.st_ino,
        at_path.st_dev,
    ) == (before.st_ino, before.st_dev)


def inspect_trace(path: str, limits: ReadLimits = DEFAULT_LIMITS) -> TraceLayout:
    """Read the structure of trace ``path`` (see the module doc).

    Raises:
        MergeError: not a complete Kineto trace file (or unreadable).
    """
    try:
        src = open_regular(path)
    except TraceFileError as e:
        raise MergeError(str(e)) from e
    with src:
        return inspect_open_trace(src, path, limits)


def inspect_open_trace(src: IO[bytes], path: str, limits: ReadLimits) -> TraceLayout:
    """`inspect_trace` of an opened file (read with ``pread``: its offset is left alone).

    Raises:
        MergeError: not a complete Kineto trace file (or unreadable).
    """
    fd = src.fileno()
    try:
        if os.pread(fd, 2, 0) == _GZIP_MAGIC:
            head, tail, size, window = _gzip_scan(src, path, limits)
            compressed = True
        else:
            size = os.fstat(fd).st_size
            head = os.pread(fd, min(size, MAX_HEAD_BYTES), 0)
            tail = os.pread(fd, min(size, MAX_TAIL_BYTES), max(0, size - MAX_TAIL_BYTES))
            compressed = False
            window = None
        if size == 0:
            raise MergeError(f"{path} is empty")
        parsed = parse_head(head, path)
        if parsed is None:
            raise MergeError(
                f'{path} has no "traceEvents" array in its first {len(head)} bytes: not a '
                "Kineto trace"
            )
        events_at, members = parsed
        tail_at = size - len(tail)
        close, trailer = parse_tail(tail, tail_at, events_at, path)
        if not compressed:
            window = find_profiler_span(lambda at, n: os.pread(fd, n, at), events_at, close)
    except TraceFileError as e:
        raise MergeError(str(e)) from e
    except OSError as e:
        raise MergeError(f"cannot read {path}: {e.strerror}") from e
    members.update(trailer)
    base = members.get("baseTimeNanoseconds", 0)
    base_ns = int(base) if isinstance(base, int | decimal.Decimal) else 0
    between = tail[max(0, events_at - tail_at) : close - tail_at] if events_at >= tail_at else b"x"
    empty = events_at >= tail_at and not between.strip(_WS)
    return TraceLayout(
        compressed=compressed,
        size=size,
        close_offset=close,
        empty=empty,
        base_ns=base_ns,
        window_ns=window,
        members={k: v for k, v in members.items() if k != "baseTimeNanoseconds"},
    )


class _Inserted:
    """The events to insert, written one by one with their separators; counts them."""

    def __init__(self, events: Iterable[bytes] | EventWriter, empty: bool) -> None:
        self._events = events
        self._empty = empty
        self.count = 0

    def write_to(self, write: Callable[[bytes], object]) -> None:
        def one(event: bytes) -> None:
            first = self.count == 0
            write((b"\n" if first and self._empty else b",\n") + event)
            self.count += 1

        if callable(self._events):
            self._events(one)
        else:
            for event in self._events:
                one(event)
        if self.count:
            write(b"\n")


# -- copying ------------------------------------------------------------------------------


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    """Copy ``length`` bytes of ``src`` from ``offset`` to ``dst``'s position, in the kernel
    where it can (copy_file_range), else through a buffer."""
    done = 0
    use_kernel = hasattr(os, "copy_file_range")
    while done < length:
        want = min(length - done, 1 << 30)
        if use_kernel:
            try:
                n = os.copy_file_range(src, dst, want, offset + done)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                use_kernel = False
                continue
        else:
            chunk = os.pread(src, min(want, CHUNK), offset + done)
            n = len(chunk)
            view = memoryview(chunk)
            while view:
                written = os.write(dst, view)
                view = view[written:]
        if n == 0:
            raise OSError(errno.EIO, f"the file ended {length - done} bytes early")
        done += n


def _write_plain(
    src: IO[bytes], out: IO[bytes], layout: TraceLayout, insert: _Inserted, members: bytes
) -> None:
    # Kernel copies (copy_file_range) and buffered writes share the file offset: flush the
    # buffer before each copy.
    fd, dst = src.fileno(), out.fileno()
    close = layout.close_offset
    out.flush()
    _copy_range(fd, dst, 0, close)
    insert.write_to(out.write)
    out.flush()
    _copy_range(fd, dst, close, 1)  # the "]"
    out.write(members)
    out.flush()
    _copy_range(fd, dst, close + 1, layout.size - close - 1)


def _gzip_reader(src: IO[bytes]) -> gzip.GzipFile:
    src.seek(0)
    return gzip.GzipFile(fileobj=src, mode="rb")


def _gzip_scan(
    src: IO[bytes], path: str, limits: ReadLimits
) -> tuple[bytes, bytes, int, tuple[int, int] | None]:
    """(head, tail, decompressed size, the profiler's span) of a gzip file, streaming."""
    head = bytearray()
    tail = bytearray()
    size = 0
    span = SpanFinder()
    try:
        with _gzip_reader(src) as f:
            while chunk := f.read(CHUNK):
                size += len(chunk)
                if size > limits.max_json_bytes:
                    raise MergeError(
                        f"{path} inflates to more than {limits.max_json_bytes} bytes of JSON "
                        f"(the limit; it is set by {limits.setting}): not merged"
                    )
                if len(head) < MAX_HEAD_BYTES:
                    head += chunk[: MAX_HEAD_BYTES - len(head)]
                tail += chunk
                if len(tail) > 2 * MAX_TAIL_BYTES:
                    del tail[: len(tail) - MAX_TAIL_BYTES]
                span.feed(chunk)
            span.feed(b"", final=True)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise MergeError(f"cannot read {path}: the compressed data is truncated or corrupt") from e
    return bytes(head), bytes(tail[-MAX_TAIL_BYTES:]), size, span.span


def _write_gzip(
    src: IO[bytes], out: IO[bytes], layout: TraceLayout, insert: _Inserted, members: bytes
) -> None:
    with (
        _gzip_reader(src) as reader,
        gzip.GzipFile(fileobj=out, mode="wb", compresslevel=GZIP_LEVEL) as dst,
    ):
        left = layout.close_offset
        while left:
            chunk = reader.read(min(CHUNK, left))
            if not chunk:
                raise OSError(errno.EIO, "the compressed trace ended early")
            dst.write(chunk)
            left -= len(chunk)
        insert.write_to(dst.write)
        dst.write(reader.read(1))  # the "]"
        dst.write(members)
        while chunk := reader.read(CHUNK):
            dst.write(chunk)


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _fsync_dir(directory: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
