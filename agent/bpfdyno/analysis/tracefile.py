"""The structure of a Kineto trace file, read in bounded memory: the one reader bpfdyno has.

A Kineto trace is one JSON object: some members (``schemaVersion``, ``deviceProperties``,
``distributedInfo``, ``baseTimeNanoseconds``...), then ``"traceEvents": [ ... ]`` with every
event, then perhaps a few plain members (``"traceName": ...``). Files reach hundreds of MB
(403 MB for 3 s of a CUDA job with stacks and shapes), so nothing here loads a file whole:

* `parse_head` reads the members before the events, `parse_tail` finds the ``]`` that closes
  them and the members after it; both check the structure, so a truncated or foreign file is
  refused with a reason;
* `find_profiler_span` finds the profiler's own span (``"PyTorch Profiler (N)"``, category
  ``Trace``) — the trace's window — wherever it is: a CPU trace writes it last, a CUDA trace
  between the CPU ops and the GPU activities (at byte 305 MB of the 403 MB file);
* `scan_trace` streams the events of a file, parsing only those of the categories asked for.

How `scan_trace` stays fast and bounded: the events are found by their category key
(``"cat": "cpu_op"``) with a regular expression over a large chunk, each one's bytes run from
the ``{`` that begins it to the ``}`` before the next ``}, {`` between two events, and only
those bytes are parsed (orjson), so the events nobody asked for (CUDA runtime calls, flow
arrows: most of a CUDA trace) cost a pass of the regular expression and nothing else. A
``}, {`` inside a string or a nested array can make a piece end early: the piece then fails to
parse and is extended to the next boundary. An event is yielded only if its bytes parsed as one
JSON object whose own ``cat`` is one asked for.

Limits (`ReadLimits`): the file's JSON size (after decompression) and one event's size. A file
over either is refused with an error naming the limit and the setting that raises it, so a
small gzip file that inflates to gigabytes, or one JSON string of 400 MB, costs a bounded
amount of memory and time. Errors never quote the file's content (the agent may read files
for users who could not read them otherwise: what it says must not leak them).
"""

from __future__ import annotations

import codecs
import decimal
import errno
import gzip
import heapq
import json
import operator
import os
import re
import stat
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol

import orjson

from bpfdyno.core.config import TracingSection

#: Chunk read at a time (decompressed bytes).
CHUNK = 4 << 20
#: Most bytes read to find ``"traceEvents": [`` at the start of the file.
MAX_HEAD_BYTES = 4 << 20
#: Bytes at the end searched for the closing ``]`` (the merge reads this much of the tail).
MAX_TAIL_BYTES = 4 << 20

_GZIP_MAGIC = b"\x1f\x8b"
_WS = b" \t\r\n"
# Numbers as Decimal: exact microseconds with 3 decimals, as Kineto writes them.
_DECODER = json.JSONDecoder(parse_float=decimal.Decimal)
#: Events as the fast way gives them: numbers as floats.
_FLOATS = json.JSONDecoder()
_SPAN_RE = re.compile(rb'"PyTorch Profiler \(\d+\)"')
#: How far around the span's name its event is looked for (an event is a few hundred bytes).
_SPAN_CONTEXT = 64 << 10
#: Between two events: the ``}`` ending one, a comma, the ``{`` starting the next.
_BOUNDARY = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_START = operator.methodcaller("start")


class TraceFileError(Exception):
    """The file is not a complete trace, or is over a limit; says why, never what it holds."""


@dataclass(frozen=True, slots=True)
class ReadLimits:
    """Bounds on what reading one trace file may cost.

    Attributes:
        max_json_bytes: most bytes of JSON (after decompression) read from one file.
        max_event_bytes: most bytes of one event (and of the members before the events).
        setting: the configuration key that sets them, named in the errors.
    """

    max_json_bytes: int = 4 << 30
    max_event_bytes: int = 16 << 20
    setting: str = "[tracing] max_trace_json_bytes / max_trace_event_bytes"

    @classmethod
    def from_config(cls, tracing: TracingSection) -> ReadLimits:
        """The limits ``[tracing]`` sets."""
        return cls(tracing.max_trace_json_bytes, tracing.max_trace_event_bytes)


DEFAULT_LIMITS = ReadLimits()


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...


class _Seekable(_Readable, Protocol):
    def seek(self, offset: int, whence: int = 0, /) -> int: ...


def json_stream(f: IO[bytes]) -> _Seekable:
    """The JSON bytes of an opened trace file: decompressed when its content is gzip.

    The content decides, not the name (PyTorch 2.13's Kineto writes plain JSON even under a
    ``.gz`` name). ``f`` must be at its start and seekable (a regular file).
    """
    magic = f.read(2)
    f.seek(0)
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")
    return f


class _Counted:
    """Reads a stream in chunks and refuses to read more than ``limits.max_json_bytes``."""

    def __init__(self, stream: _Readable, name: str, limits: ReadLimits) -> None:
        self._stream = stream
        self._name = name
        self._limits = limits
        self.total = 0

    def read(self) -> bytes:
        try:
            chunk = self._stream.read(CHUNK)
        except (OSError, EOFError, zlib.error) as e:
            raise TraceFileError(f"cannot read {self._name}: {_reason(e)}") from e
        self.total += len(chunk)
        if self.total > self._limits.max_json_bytes:
            raise TraceFileError(
                f"{self._name} holds more than {self._limits.max_json_bytes} bytes of JSON (the "
                f"limit; it is set by {self._limits.setting}): not read"
            )
        return chunk


def _reason(e: BaseException) -> str:
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    if isinstance(e, EOFError | gzip.BadGzipFile | zlib.error):
        return "the compressed data is truncated or corrupt"
    return type(e).__name__


# -- the structure around the events ------------------------------------------------------


def _skip_ws(buf: bytes, i: int) -> int:
    while i < len(buf) and buf[i] in _WS:
        i += 1
    return i


def _decode(text: str, i: int, decoder: json.JSONDecoder = _DECODER) -> tuple[Any, int]:
    """One JSON value of ``text`` at ``i``; nesting too deep counts as malformed."""
    try:
        return decoder.raw_decode(text, i)
    except RecursionError as e:
        raise json.JSONDecodeError("nested too deeply", text, i) from e


def parse_head(head: bytes, name: str) -> tuple[int, dict[str, Any]] | None:
    """The members before the events, and the offset just after ``"traceEvents": [``.

    Returns:
        None when ``head`` ends before ``"traceEvents"`` (read more, if there is more).

    Raises:
        TraceFileError: not a JSON object, a malformed member, or no ``traceEvents``.
    """
    text = head.decode("latin-1")  # one char per byte: offsets stay byte offsets
    members: dict[str, Any] = {}
    i = _skip_ws(head, 0)
    if i >= len(head) or head[i : i + 1] != b"{":
        raise TraceFileError(f"{name} is not a JSON object (it does not start with '{{')")
    i += 1
    while True:
        i = _skip_ws(head, i)
        if i >= len(head):
            return None
        try:
            key, i = _decode(text, i)
        except json.JSONDecodeError as e:
            if e.pos >= len(text) - 1 or "Unterminated" in e.msg:
                return None
            raise TraceFileError(
                f'{name} is not a Kineto trace: malformed JSON at byte {e.pos} before "traceEvents"'
            ) from e
        i = _skip_ws(head, i)
        if i >= len(head):
            return None
        if head[i : i + 1] != b":" or not isinstance(key, str):
            raise TraceFileError(f"{name}: malformed member at byte {i}")
        i = _skip_ws(head, i + 1)
        if i >= len(head):
            return None
        if key == "traceEvents":
            if head[i : i + 1] != b"[":
                raise TraceFileError(f'{name}: "traceEvents" is not an array')
            return i + 1, members
        try:
            value, i = _decode(text, i)
        except json.JSONDecodeError as e:
            if e.pos >= len(text) - 1 or "Unterminated" in e.msg:
                return None
            raise TraceFileError(f"{name}: malformed member value at byte {e.pos}") from e
        members[key] = value
        i = _skip_ws(head, i)
        if i >= len(head):
            return None
        if head[i : i + 1] != b",":
            raise TraceFileError(
                f'{name} has no "traceEvents" array (the object ends before it): not a Kineto trace'
            )
        i += 1


def parse_tail(tail: bytes, tail_at: int, events_at: int, name: str) -> tuple[int, dict[str, Any]]:
    """The offset of the ``]`` closing ``traceEvents`` and the plain members after it.

    Args:
        tail: the last bytes of the file (or all bytes after some event boundary).
        tail_at: the offset of ``tail`` in the file.
        events_at: the offset just after ``"traceEvents": [``.
        name: the file, for errors.

    Raises:
        TraceFileError: the file does not end like a complete trace (truncated, still being
            written, or something else).
    """
    text = tail.decode("latin-1")  # one char per byte: offsets stay byte offsets
    pos = len(tail)
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
            if tail_at == events_at:  # nothing but whitespace since the '['
                return tail_at + pos, trailer
            break
        absolute = tail_at + pos
        if tail[before : before + 1] == b"[":
            if tail_at + before + 1 != events_at:
                continue
            return absolute, trailer
        if tail[before : before + 1] == b"}" and _object_ends_at(text, before):
            return absolute, trailer
    raise TraceFileError(
        f"{name} does not end like a complete Kineto trace (the closing ']' of \"traceEvents\" "
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
            key, i = _decode(text, i)
            while i < n and text[i] in " \t\r\n":
                i += 1
            if not isinstance(key, str) or i >= n or text[i] != ":":
                return None
            i += 1
            while i < n and text[i] in " \t\r\n":
                i += 1
            value, i = _decode(text, i)
        except json.JSONDecodeError:
            return None
        if key == "traceEvents" or isinstance(value, list | dict):
            return None
        out[key] = value


def _object_ends_at(text: str, close_brace: int) -> bool:
    """Whether a JSON object ends exactly at ``close_brace`` (the last event)."""
    return any(
        stop == close_brace + 1 and isinstance(obj, dict)
        for obj, stop in _objects_before(text, close_brace, 256)
    )


def _objects_before(text: str, at: int, tries: int) -> Iterator[tuple[Any, int]]:
    """The JSON values that begin at each ``{`` before ``at``, nearest first, with where
    each ends (``{`` that begin no valid value are passed over); at most ``tries`` looks."""
    start = at
    for _ in range(tries):
        start = text.rfind("{", 0, start)
        if start < 0:
            return
        try:
            yield _decode(text, start)
        except json.JSONDecodeError:
            continue


# -- the profiler's span ------------------------------------------------------------------


def span_from_event(buf: bytes, name_at: int) -> tuple[int, int] | None:
    """The span (start, end) in ns if the event around ``buf[name_at]`` is the profiler's.

    ``name_at`` is where ``"PyTorch Profiler (N)"`` was found; the event must be a complete
    ``ph: X`` event of category ``Trace`` with ``ts`` and ``dur`` (a user's op of that name
    is not the profiler's span).
    """
    for obj, stop in _objects_before(buf.decode("latin-1"), name_at, 16):
        if stop <= name_at:
            continue  # an object before the name (a nested one): look further back
        if not isinstance(obj, dict):
            return None
        ts, dur = obj.get("ts"), obj.get("dur")
        if (
            obj.get("ph") == "X"
            and obj.get("cat") == "Trace"
            and isinstance(ts, int | decimal.Decimal)
            and isinstance(dur, int | decimal.Decimal)
        ):
            begin = int(decimal.Decimal(ts) * 1000)
            return begin, begin + int(decimal.Decimal(dur) * 1000)
        return None
    return None


def _span_near(buf: bytes, at: int) -> tuple[int, int] | None:
    lo = max(0, at - _SPAN_CONTEXT)
    return span_from_event(buf[lo : at + _SPAN_CONTEXT], at - lo)


def find_profiler_span(
    read_at: Callable[[int, int], bytes], lo: int, hi: int
) -> tuple[int, int] | None:
    """The profiler's span in ``[lo, hi)`` of a plain file, searched from the end backwards.

    A CPU trace has it in its last kilobytes; a CUDA trace before the GPU activities, so the
    search reads what follows it (a few hundred MB at most) in `CHUNK` pieces: bounded
    memory, at the speed of reading the page cache.

    Args:
        read_at: ``read_at(offset, length)`` returns the file's bytes there.
        lo, hi: the offsets of the events (``"traceEvents": [`` ... ``]``).

    Returns:
        (start, end) in ns relative to ``baseTimeNanoseconds``, or None when there is none.
    """
    end = hi
    while end > lo:
        start = max(lo, end - CHUNK)
        # 64 bytes more: a name cut by the chunk's end is seen whole in this chunk.
        chunk = read_at(start, min(hi, end + 64) - start)
        pos = len(chunk)
        while (m := _last_match(chunk, pos)) is not None:
            pos = m
            ctx_lo = max(lo, start + m - _SPAN_CONTEXT)
            around = read_at(ctx_lo, min(hi, start + m + _SPAN_CONTEXT) - ctx_lo)
            span = span_from_event(around, start + m - ctx_lo)
            if span is not None:
                return span
        end = start
    return None


def _last_match(buf: bytes, before: int) -> int | None:
    """The offset of the last span name starting before ``before`` in ``buf``."""
    pos = before
    while (pos := buf.rfind(b'"PyTorch Profiler (', 0, pos)) >= 0:
        if _SPAN_RE.match(buf, pos):
            return pos
    return None


class SpanFinder:
    """Finds the profiler's span in a stream read front to back (a gzip file): `feed` it
    every chunk in order; `span` is the last one seen. Memory: a chunk and 128 KiB."""

    def __init__(self) -> None:
        self.span: tuple[int, int] | None = None
        self._buf = b""
        self._from = 0  # where in _buf the names not yet looked at may start

    def feed(self, chunk: bytes, final: bool = False) -> None:
        """Look at the next ``chunk`` of the stream (``final``: nothing follows it)."""
        buf = self._buf + chunk
        resume = max(self._from, len(buf) - 64)  # a name cut by the end: seen next time
        for m in _SPAN_RE.finditer(buf, self._from):
            if m.start() + _SPAN_CONTEXT > len(buf) and not final:
                resume = m.start()  # its event may go on in the next chunk
                break
            span = _span_near(buf, m.start())
            if span is not None:
                self.span = span
        keep = max(0, resume - _SPAN_CONTEXT)
        self._buf = buf[keep:]
        self._from = resume - keep


# -- the events ---------------------------------------------------------------------------


class Categories:
    """The event categories `scan_trace` parses: exact names and prefixes.

    Args:
        names: exact category names (``cpu_op``, ``kernel``, ``Trace``...).
        prefixes: category prefixes (``bpfdyno.`` for every kernel track).
        light: per category, a pattern that reads the fields a reader needs from an event's
            bytes as the writer lays them out. Most of a trace's events are CPU ops, and a
            reader that needs only their times should not pay for building each one as a
            dict. The pattern must begin with the quoted category name (``"cpu_op"``) and
            match at every occurrence of it, its groups all empty where it cannot read the
            event there (see `KINETO_CPU_OP`): one pass then both reads the events and
            proves that no occurrence was left unread. Where none was, a chunk's events of
            the category are yielded all at once as ``("light", (category, [groups...]))``
            (not in file order), none of them parsed; otherwise that chunk's events of the
            category are parsed and yielded one by one as usual.
        whole: per category read lightly, a pattern that finds (from the ``"cat"`` key) the
            events of it that are also to be parsed and yielded whole, in a chunk read
            lightly (an NCCL kernel among the GPU's: its sizes are in its args), and bytes
            that every match of it contains: a chunk without them is not searched (a pass of
            a pattern costs as much as reading the chunk's CPU ops; a search for bytes a
            fifth of that). The reader must leave those events out of the light fields.
    """

    def __init__(
        self,
        names: Iterable[str],
        prefixes: Iterable[str] = (),
        light: Mapping[str, re.Pattern[bytes]] | None = None,
        whole: Mapping[str, tuple[re.Pattern[bytes], bytes]] | None = None,
    ) -> None:
        self.names = frozenset(names)
        self.prefixes = tuple(prefixes)
        for c, p in (light or {}).items():
            if not p.pattern.startswith(b'"' + c.encode() + b'"') or p.groups < 2:
                raise ValueError(
                    f"the pattern for {c} must begin with its quoted name and have two groups"
                )
        #: Per category: its pattern, and what the pattern finds where it cannot read.
        self.light = {c.encode(): (p, (b"",) * p.groups) for c, p in (light or {}).items()}
        self.whole = {c.encode(): pair for c, pair in (whole or {}).items()}
        #: Finds ``"cat": "<one of them>"`` in the file's bytes (group 1: the category)...
        self.pattern = self._keys(sorted(self.names), self.prefixes)
        #: ... and of those not read lightly.
        self.parsed = self._keys(sorted(self.names - set(light or {})), self.prefixes)

    @staticmethod
    def _keys(names: Iterable[str], prefixes: Iterable[str]) -> re.Pattern[bytes]:
        alts = [re.escape(c.encode()) for c in names]
        alts += [re.escape(p.encode()) + rb'[^"\\]*' for p in prefixes]
        return re.compile(rb'"cat"[ \t\r\n]*:[ \t\r\n]*"(' + b"|".join(alts) + rb')"')

    def __contains__(self, category: object) -> bool:
        return isinstance(category, str) and (
            category in self.names or category.startswith(self.prefixes)
        )


def scan_trace(
    stream: _Seekable,
    name: str,
    categories: Categories,
    limits: ReadLimits = DEFAULT_LIMITS,
) -> Iterator[tuple[str, Any]]:
    """The file's members and its events of the wanted categories, in file order.

    Yields ``("member", (key, value))`` for each top-level member (those after the events
    last) and ``("event", dict)`` for each event whose ``cat`` is in ``categories`` (or
    ``("light", (category, fields))``, see `Categories`). Numbers in events are floats.

    The fast way (module doc) reads what Kineto and bpfdyno write; a file it cannot follow
    (another writer's key order, ``}, {`` inside nested arrays) is read again from its start
    the slow and sure way, one JSON value at a time, and what was already yielded is not
    yielded twice.

    Args:
        stream: the file's JSON bytes (see `json_stream`), from the start; seekable.
        name: the file, for errors.
        categories: which events to parse.
        limits: bounds on the file's and one event's size.

    Raises:
        TraceFileError: not a complete trace, malformed, or over a limit.
    """
    yielded = 0
    try:
        for item in _fast(stream, name, categories, limits):
            yield item
            yielded += item[0] == "event"
    except _Lost:
        stream.seek(0)
        yield from _exact(stream, name, categories, limits, yielded)


class _Lost(Exception):
    """The fast way lost track of where events begin and end."""


def _fast(
    stream: _Readable, name: str, categories: Categories, limits: ReadLimits
) -> Iterator[tuple[str, Any]]:
    src = _Counted(stream, name, limits)
    buf = b""
    base = 0  # offset of buf[0] in the stream

    # The members before the events.
    head: tuple[int, dict[str, Any]] | None = None
    while head is None:
        chunk = src.read()
        if not chunk:
            if not buf.strip(_WS):
                raise TraceFileError(f"{name} is empty")
            raise TraceFileError(f'{name} has no "traceEvents" array: not a Kineto trace')
        buf += chunk
        if len(buf) > max(MAX_HEAD_BYTES, limits.max_event_bytes) + CHUNK:
            raise TraceFileError(
                f'{name} has no "traceEvents" array in its first {len(buf)} bytes: '
                "not a Kineto trace"
            )
        if buf.strip(_WS):
            head = parse_head(buf, name)
    events_at, members = head
    for item in members.items():
        yield "member", item

    pos = events_at  # where in buf the events not yet looked at begin
    while True:
        chunk = src.read()
        if chunk:
            buf = buf[pos:] + chunk
            base += pos
            events_at -= pos
            pos = 0
            limit = _last_boundary(buf, pos)
            if limit is not None:
                events, pos = _events(buf, pos, limit, base, categories, final=False)
                yield from events
            if len(buf) - pos > limits.max_event_bytes:
                raise _Lost  # one event that long, or lost track: the sure way says which
        else:
            try:
                close, trailer = parse_tail(buf[pos:], base + pos, base + events_at, name)
            except TraceFileError:
                raise _Lost from None  # truncated, or lost track: the sure way says which
            events, _ = _events(buf, pos, close - base, base, categories, final=True)
            yield from events
            for item in trailer.items():
                yield "member", item
            return


def _exact(
    stream: _Readable, name: str, categories: Categories, limits: ReadLimits, skip: int
) -> Iterator[tuple[str, Any]]:
    """The sure way: every value decoded in turn (the standard library's decoder); yields
    the events after the first ``skip`` wanted ones, and the members after the events."""
    src = _Counted(stream, name, limits)
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    buf = ""
    pos = 0
    done_before = 0  # characters dropped from the front of buf
    eof = False

    def more() -> bool:
        nonlocal buf, pos, done_before, eof
        if eof:
            return False
        chunk = src.read()
        if not chunk:
            eof = True
            buf += decode(b"", final=True)
            return True
        done_before += pos
        buf = buf[pos:] + decode(chunk)
        pos = 0
        return True

    def ws() -> None:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n":
                pos += 1
            if pos < len(buf) or not more():
                return

    def char() -> str:
        ws()
        return buf[pos] if pos < len(buf) else ""

    def value() -> Any:
        nonlocal pos
        ws()
        while True:
            try:
                obj, end = _decode(buf, pos, _FLOATS)
                if end < len(buf) or eof:  # a number may go on in the next chunk
                    pos = end
                    return obj
            except json.JSONDecodeError as e:
                if eof:
                    if e.pos >= len(buf.rstrip()) - 1 or e.msg.startswith("Unterminated"):
                        raise truncated() from None  # the file ends inside this value
                    raise TraceFileError(
                        f"{name} is not valid JSON near byte {done_before + pos}"
                    ) from None
            if len(buf) - pos > limits.max_event_bytes:
                raise TraceFileError(
                    f"{name}: the value at byte {done_before + pos} is longer than "
                    f"{limits.max_event_bytes} bytes (the limit; it is set by {limits.setting}): "
                    "not read"
                )
            more()

    def truncated() -> TraceFileError:
        return TraceFileError(
            f"{name} does not end like a complete Kineto trace: it may be truncated or still "
            "being written"
        )

    def expect(c: str) -> None:
        nonlocal pos
        got = char()
        if not got:
            raise truncated()
        if got != c:
            raise TraceFileError(f"{name}: expected {c!r} at byte {done_before + pos}")
        pos += 1

    more()
    expect("{")
    seen = 0
    after_events = False
    while char() != "}":
        if char() == ",":
            expect(",")
        key = value()
        expect(":")
        if key != "traceEvents":
            item = value()
            if after_events:
                yield "member", (key, item)
            continue
        after_events = True
        expect("[")
        while char() != "]":
            if char() == ",":
                expect(",")
            event = value()
            if isinstance(event, dict) and event.get("cat") in categories:
                seen += 1
                if seen > skip:
                    yield "event", event
            if not char():
                raise truncated()
            if char() not in (",", "]"):
                raise TraceFileError(
                    f"{name}: expected ',' or ']' between events at byte {done_before + pos}"
                )
        expect("]")
    if not after_events:
        raise TraceFileError(f'{name} has no "traceEvents" array: not a Kineto trace')


def _check_event_size(size: int, at: int, name: str, limits: ReadLimits) -> None:
    if size > limits.max_event_bytes:
        raise TraceFileError(
            f"{name}: the event at byte {at} is longer than {limits.max_event_bytes} bytes (the "
            f"limit; it is set by {limits.setting}): not read"
        )


def _last_boundary(buf: bytes, lo: int) -> int | None:
    """One past the ``}`` of the last event in ``buf[lo:]`` that a ``, {`` follows."""
    i = len(buf)
    while (i := buf.rfind(b"{", lo, i)) > lo:
        j = i - 1
        while j > lo and buf[j] in _WS:
            j -= 1
        if buf[j] == 0x2C:  # ","
            j -= 1
            while j > lo and buf[j] in _WS:
                j -= 1
            if buf[j] == 0x7D:  # "}"
                return j + 1
    return None


def _events(
    buf: bytes,
    pos: int,
    limit: int,
    base: int,
    categories: Categories,
    final: bool,
) -> tuple[list[tuple[str, Any]], int]:
    """The wanted events among the complete events in ``buf[pos:limit]``, and where the
    next look must begin: ``limit``, or the start of an event that only the next chunk
    completes (a ``}, {`` inside it looked like its end)."""
    out: list[tuple[str, Any]] = []
    skip: set[bytes] = set()
    for cat, (pattern, unread) in categories.light.items():
        # One match per quoted category name in the chunk; an empty match where the name is
        # anywhere else (a string, another layout): the chunk's events of it are then parsed.
        fields = pattern.findall(buf, pos, limit)
        if unread not in fields:
            out.append(("light", (cat.decode(), fields)))
            skip.add(cat)
    markers = categories.parsed if len(skip) == len(categories.light) else categories.pattern
    hits: Iterable[re.Match[bytes]] = markers.finditer(buf, pos, limit)
    wholes = [
        pattern.finditer(buf, pos, limit)
        for pattern, needs in (categories.whole[c] for c in skip if c in categories.whole)
        if buf.find(needs, pos, limit) >= 0
    ]
    if wholes:  # the events of the categories read lightly that are parsed too, in file order
        hits = heapq.merge(hits, *wholes, key=_START)
    done = pos  # the events before this are dealt with
    find_open, boundary, loads, wanted = buf.rfind, _BOUNDARY.search, orjson.loads, categories
    for m in hits:
        at = m.start()
        if at < done or (m.re is markers and skip and m.group(1) in skip):
            continue  # inside the event just parsed, or read lightly
        # The common case (Kineto, bpfdyno): the event's "{" is the nearest before its "cat",
        # and the next "}, {" ends it.
        start = find_open(b"{", done, at)
        b = boundary(buf, at, limit)
        end = b.start() + 1 if b is not None else limit
        try:
            obj = loads(buf[start:end]) if start >= 0 else None
        except orjson.JSONDecodeError:
            obj = None
        if obj.__class__ is not dict or obj.get("cat") not in wanted:
            found = _event_at(buf, done, at, limit)
            if found is None:
                if final:
                    raise _Lost
                # It may end in the next chunk: what lies before it is read again alone
                # (the light reads covered the whole chunk, this event's too).
                return _events(buf, pos, done, base, categories, final)
            obj, end = found
            if obj.__class__ is not dict or obj.get("cat") not in wanted:
                done = end
                continue  # the category was in a nested object or a string
        done = end
        out.append(("event", obj))
    return out, limit


def _event_at(buf: bytes, lo: int, at: int, limit: int) -> tuple[Any, int] | None:
    """The event holding ``buf[at]`` parsed, and its end, found by walking the events from
    ``lo`` (an event's start) one JSON value at a time. None: not found before ``limit``."""
    text = buf[lo:limit].decode("latin-1")  # one char per byte: offsets stay byte offsets
    i = _skip_ws(buf, lo) - lo
    if text[i : i + 1] == ",":  # lo is the end of the previous event
        i += 1
    while True:
        i = _skip_ws(buf, lo + i) - lo
        if i >= len(text):
            return None
        try:
            _, stop = _decode(text, i)
        except json.JSONDecodeError:
            return None
        if lo + stop > at:
            return _loads(buf[lo + i : lo + stop]), lo + stop
        i = _skip_ws(buf, lo + stop) - lo
        if i >= len(text) or text[i] != ",":
            return None
        i += 1


def _loads(data: bytes) -> Any:
    """orjson, or the standard library for what only it accepts (NaN, Infinity)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data.decode("utf-8", "replace"))


def open_regular(path: str, name: str = "") -> IO[bytes]:
    """Open ``path`` for reading only if it is a regular file, never through a link
    (``name``: the file as errors call it; default ``path``).

    ``O_NOFOLLOW``: a link at ``path`` is refused (whatever it points to, so the error says
    nothing of its target); ``O_NONBLOCK``: a FIFO is opened without waiting for a writer
    and then refused, like anything else that is not a regular file (the type is checked on
    the opened descriptor, not by a ``stat`` that a swap could outrun).

    Raises:
        TraceFileError: not a regular file, or cannot be opened (the reason).
    """
    name = name or path
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise TraceFileError(f"{name} is a symbolic link, not a trace file") from e
        raise TraceFileError(f"cannot read {name}: {e.strerror}") from e
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise TraceFileError(f"{name} is not a regular file, not a trace file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
