"""Adding events to a finished Kineto trace file without parsing it: `merge_into_trace`.

Kineto files reach hundreds of MB, so the file is never loaded as a whole. Its structure is
checked where it matters, and the body is copied byte for byte by the kernel
(``copy_file_range``):

* the head (up to `MAX_HEAD_BYTES`) is parsed member by member up to ``"traceEvents": [``:
  it must be a JSON object, and the members before the events (``baseTimeNanoseconds``,
  ``distributedInfo``...) are read;
* the tail (up to `MAX_TAIL_BYTES`) must end with the ``]`` closing ``traceEvents``, then
  only plain members (``"traceName": ...``) and the closing ``}``; the last event before the
  ``]`` must parse as a JSON object. A truncated file fails here. The profiler's own span
  (``"PyTorch Profiler (0)"``, category ``Trace``) is looked for in the tail: it gives the
  trace window.

The new events are written just before that ``]`` (and new top-level members, if any, just
after it), into a temporary file in the same directory, which then replaces the original
with ``rename(2)`` — atomically, keeping the original's mode and owner. If anything fails
(no space left, a file that is not a complete Kineto trace, the file changing meanwhile),
the temporary file is removed and the original stays byte for byte as it was;
`MergeError` says why.

A gzip-compressed trace (``.json.gz`` whose content starts with the gzip magic) is
decompressed twice as a stream (once to read its head and tail, once to copy it) and written
compressed again (level `GZIP_LEVEL`); slower, still in bounded memory. (PyTorch 2.13's Kineto
writes plain JSON even under a ``.gz`` name; the content decides, not the name.)
"""

from __future__ import annotations

import contextlib
import decimal
import errno
import gzip
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import IO, Any

#: Most bytes read to find ``"traceEvents": [`` at the start of the file.
MAX_HEAD_BYTES = 4 << 20
#: Bytes at the end searched for the closing ``]`` and the profiler's span.
MAX_TAIL_BYTES = 4 << 20
#: Compression level of a re-written gzip trace (fast; Kineto's JSON compresses ~10x anyway).
GZIP_LEVEL = 1
#: Chunk size of streamed copies.
CHUNK = 1 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_WS = b" \t\r\n"
_DECODER = json.JSONDecoder(parse_float=decimal.Decimal)
_SPAN_RE = re.compile(rb'"PyTorch Profiler \(\d+\)"')


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
            when it was not found in the tail.
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
    path: str, build: Callable[[TraceLayout], Insertion]
) -> tuple[TraceLayout, MergeResult]:
    """Insert the events (and members) ``build`` returns into trace ``path``.

    Args:
        path: a complete Kineto trace file (plain or gzip JSON).
        build: called with the file's layout (base time, window, members); returns what to
            add. Members the file already has are not added. If it returns no event, the
            file is left alone.

    Returns:
        The layout and what was done.

    Raises:
        MergeError: the file is not a complete trace, cannot be written next to, or changed
            while merging; the original is unchanged.
    """
    t0 = time.monotonic()
    try:
        before = os.lstat(path)
    except OSError as e:
        raise MergeError(f"cannot read {path}: {e.strerror}") from e
    if not stat.S_ISREG(before.st_mode):
        # Kineto writes a regular file; anything else (a link) was put there by someone else.
        raise MergeError(f"{path} is not a regular file; the kernel tracks were not merged")
    layout = inspect_trace(path)
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
            f"cannot create a file next to {path} ({e.strerror}); the trace is as Kineto wrote it"
        ) from e
    try:
        with os.fdopen(fd, "wb") as out:
            if layout.compressed:
                _write_gzip(path, out, layout, insert, members)
            else:
                _write_plain(path, out, layout, insert, members)
            out.flush()
            os.fsync(out.fileno())
            with contextlib.suppress(OSError):  # not permitted (not root): keep ours
                os.fchown(out.fileno(), before.st_uid, before.st_gid)
            os.fchmod(out.fileno(), before.st_mode & 0o7777)
        now = os.stat(path)
        if (now.st_ino, now.st_size, now.st_mtime_ns) != (
            before.st_ino,
            before.st_size,
            before.st_mtime_ns,
        ):
            raise MergeError(f"{path} changed while the kernel tracks were merged into it")
        os.replace(tmp, path)
    except MergeError:
        _unlink(tmp)
        raise
    except OSError as e:
        _unlink(tmp)
        hint = "; free space in that directory" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        raise MergeError(
            f"writing the merged copy of {path} failed ({e.strerror}{hint}); the trace is as "
            "Kineto wrote it"
        ) from e
    except BaseException:
        _unlink(tmp)
        raise
    _fsync_dir(directory)
    size_after = os.stat(path).st_size
    return layout, MergeResult(insert.count, before.st_size, size_after, time.monotonic() - t0)


def inspect_trace(path: str) -> TraceLayout:
    """Read the head and tail of a trace file and check its structure (see the module doc).

    Raises:
        MergeError: not a complete Kineto trace file (or unreadable).
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
            if magic == _GZIP_MAGIC:
                head, tail, size = _gzip_head_tail(path)
                compressed = True
            else:
                size = os.fstat(f.fileno()).st_size
                f.seek(0)
                head = f.read(min(size, MAX_HEAD_BYTES))
                f.seek(max(0, size - MAX_TAIL_BYTES))
                tail = f.read()
                compressed = False
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise MergeError(f"cannot read {path}: {e}") from e
    if size == 0:
        raise MergeError(f"{path} is empty")
    events_at, members = _parse_head(head, path)
    tail_at = size - len(tail)
    close, trailer = _parse_tail(tail, tail_at, events_at, path)
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
        window_ns=_find_window(tail[: close - tail_at]),
        members={k: v for k, v in members.items() if k != "baseTimeNanoseconds"},
    )


# -- structure ----------------------------------------------------------------------------


def _skip_ws(buf: bytes, i: int) -> int:
    while i < len(buf) and buf[i] in _WS:
        i += 1
    return i


def _parse_head(head: bytes, path: str) -> tuple[int, dict[str, Any]]:
    """(offset just after ``"traceEvents": [``, the members before it)."""
    text = head.decode("latin-1")  # one char per byte: offsets stay byte offsets
    members: dict[str, Any] = {}
    i = _skip_ws(head, 0)
    if i >= len(head) or head[i : i + 1] != b"{":
        raise MergeError(f"{path} is not a JSON object (it does not start with '{{')")
    i += 1
    while True:
        i = _skip_ws(head, i)
        try:
            key, i = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise MergeError(
                f'{path} has no "traceEvents" array in its first {len(head)} bytes ({e.msg}): '
                "not a Kineto trace"
            ) from e
        i = _skip_ws(head, i)
        if head[i : i + 1] != b":":
            raise MergeError(f"{path}: malformed member {key!r} at byte {i}")
        i = _skip_ws(head, i + 1)
        if key == "traceEvents":
            if head[i : i + 1] != b"[":
                raise MergeError(f'{path}: "traceEvents" is not an array')
            return i + 1, members
        try:
            value, i = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise MergeError(f"{path}: malformed value of {key!r} ({e.msg})") from e
        members[str(key)] = value
        i = _skip_ws(head, i)
        if head[i : i + 1] != b",":
            raise MergeError(
                f'{path} has no "traceEvents" array (the object ends before it): not a Kineto trace'
            )
        i += 1


def _parse_tail(tail: bytes, tail_at: int, events_at: int, path: str) -> tuple[int, dict[str, Any]]:
    """(absolute offset of the ``]`` closing ``traceEvents``, the members after it)."""
    text = tail.decode("latin-1")  # one char per byte: offsets stay byte offsets
    end = len(tail)
    pos = end
    for _ in range(64):
        pos = tail.rfind(b"]", 0, pos)
        if pos < 0:
            break
        trailer = _parse_trailer(text, pos + 1)
        if trailer is None:
            continue
        before = pos - 1
        while before >= 0 and tail[before] in _WS:
            before -= 1
        if before < 0:
            break
        absolute = tail_at + pos
        if tail[before : before + 1] == b"[":
            if tail_at + before + 1 != events_at:
                continue
            return absolute, trailer
        if tail[before : before + 1] == b"}" and _last_event_ok(text, before):
            return absolute, trailer
    raise MergeError(
        f"{path} does not end like a complete Kineto trace (the closing ']' of \"traceEvents\" "
        "and '}' are missing or malformed): it may be truncated or still being written"
    )


def _parse_trailer(text: str, i: int) -> dict[str, Any] | None:
    """The members after the events' ``]``: ``(, "key": scalar)* }`` and nothing else."""
    out: dict[str, Any] = {}
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i < n and text[i] == "}":
            i += 1
            while i < n and text[i] in " \t\r\n":
                i += 1
            return out if i == n else None
        if i >= n or text[i] != ",":
            return None
        i += 1
        while i < n and text[i] in " \t\r\n":
            i += 1
        try:
            key, i = _DECODER.raw_decode(text, i)
            while i < n and text[i] in " \t\r\n":
                i += 1
            if not isinstance(key, str) or i >= n or text[i] != ":":
                return None
            i += 1
            while i < n and text[i] in " \t\r\n":
                i += 1
            value, i = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            return None
        if key == "traceEvents" or isinstance(value, list):
            return None
        out[key] = value


def _last_event_ok(text: str, close_brace: int) -> bool:
    """Whether a JSON object ends exactly at ``close_brace`` (the last event)."""
    start = close_brace
    for _ in range(256):
        start = text.rfind("{", 0, start)
        if start < 0:
            return False
        try:
            obj, stop = _DECODER.raw_decode(text, start)
        except json.JSONDecodeError:
            continue
        if stop == close_brace + 1:
            return isinstance(obj, dict)
    return False


def _find_window(tail: bytes) -> tuple[int, int] | None:
    """The profiler's ``PyTorch Profiler (N)`` span in the tail: (start, end) in ns."""
    text = tail.decode("latin-1")
    for m in reversed(list(_SPAN_RE.finditer(tail))):
        start = m.start()
        for _ in range(16):
            start = text.rfind("{", 0, start)
            if start < 0:
                break
            try:
                obj, _stop = _DECODER.raw_decode(text, start)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict) and obj.get("ph") == "X" and "ts" in obj and "dur" in obj:
                ts, dur = obj["ts"], obj["dur"]
                if isinstance(ts, int | decimal.Decimal) and isinstance(dur, int | decimal.Decimal):
                    begin = int(decimal.Decimal(ts) * 1000)
                    return begin, begin + int(decimal.Decimal(dur) * 1000)
            break
    return None


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
    path: str, out: IO[bytes], layout: TraceLayout, insert: _Inserted, members: bytes
) -> None:
    # Kernel copies (copy_file_range) and buffered writes share the file offset: flush the
    # buffer before each copy.
    with open(path, "rb") as src:
        dst = out.fileno()
        close = layout.close_offset
        out.flush()
        _copy_range(src.fileno(), dst, 0, close)
        insert.write_to(out.write)
        out.flush()
        _copy_range(src.fileno(), dst, close, 1)  # the "]"
        out.write(members)
        out.flush()
        _copy_range(src.fileno(), dst, close + 1, layout.size - close - 1)


def _gzip_head_tail(path: str) -> tuple[bytes, bytes, int]:
    """(head, tail, decompressed size) of a gzip file, streaming."""
    head = bytearray()
    tail = bytearray()
    size = 0
    with gzip.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            size += len(chunk)
            if len(head) < MAX_HEAD_BYTES:
                head += chunk[: MAX_HEAD_BYTES - len(head)]
            tail += chunk
            if len(tail) > 2 * MAX_TAIL_BYTES:
                del tail[: len(tail) - MAX_TAIL_BYTES]
    return bytes(head), bytes(tail[-MAX_TAIL_BYTES:]), size


def _write_gzip(
    path: str, out: IO[bytes], layout: TraceLayout, insert: _Inserted, members: bytes
) -> None:
    with (
        gzip.open(path, "rb") as src,
        gzip.GzipFile(fileobj=out, mode="wb", compresslevel=GZIP_LEVEL) as dst,
    ):
        left = layout.close_offset
        while left:
            chunk = src.read(min(CHUNK, left))
            if not chunk:
                raise OSError(errno.EIO, "the compressed trace ended early")
            dst.write(chunk)
            left -= len(chunk)
        insert.write_to(dst.write)
        dst.write(src.read(1))  # the "]"
        dst.write(members)
        while chunk := src.read(CHUNK):
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
