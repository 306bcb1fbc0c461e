"""The Kineto ⇄ daemon datagram format: parsing and building, no I/O.

Every datagram is a 40-byte header (``uint64 size; char type[32]``, native byte order, which
is little-endian on every platform PyTorch ships for) followed by ``size`` payload bytes.
Clients send ``req`` (poll for a config; this is also the registration) and, in old
libkineto, ``ctxt``; the daemon answers each with a datagram of the same type.

Parsing is strict: a datagram that does not match its own header, or carries values no
Kineto client produces, raises `MalformedDatagram` with a stable ``reason`` code the
endpoint counts, instead of being trusted the way dynolog trusts it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HEADER = struct.Struct("<Q32s")
HEADER_SIZE = HEADER.size  # 40
_REQ_FIXED = struct.Struct("<iiq")  # int32 type; int32 n; int64 jobid
_CTXT = struct.Struct("<iiq")  # int32 gpu; int32 pid; int64 jobid
_INT32 = struct.Struct("<i")

TYPE_REQ = "req"
TYPE_CTXT = "ctxt"

#: Bits of the ``req`` type field: which profilers in the client can take a new config.
EVENTS_BIT = 1
ACTIVITIES_BIT = 2

#: A client sends its own pid plus at most 10 ancestors.
MAX_PIDS = 11
#: Highest pid Linux can hand out (PID_MAX_LIMIT, 2**22).
MAX_PID = 4_194_304
_PIDS = [
    struct.Struct(f"<{n}i") for n in range(MAX_PIDS + 1)
]  # pids[n], precompiled for the hot path

#: Largest datagram a client can receive (the default socket buffer bounds it at ~212 KB).
MAX_DATAGRAM = 200 * 1024


class MalformedDatagram(ValueError):
    """A datagram that is not a valid Kineto message.

    Attributes:
        reason: a short stable code for counters ("short_header", "size_mismatch", ...).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class KinetoRequest:
    """A ``req`` poll: the client's state, its pid ancestry and its job id.

    Attributes:
        config_type: bitmask of profilers that are free (`EVENTS_BIT`, `ACTIVITIES_BIT`).
        job_id: ``$SLURM_JOB_ID`` of the client, 0 when it has none.
        pids: the client's own pid first, then its ancestors (pid 1 left out).
    """

    config_type: int
    job_id: int
    pids: tuple[int, ...]

    @property
    def pid(self) -> int:
        """The client's own pid."""
        return self.pids[0]

    @property
    def activities_free(self) -> bool:
        """True when the activity profiler can take a config (it is not tracing)."""
        return bool(self.config_type & ACTIVITIES_BIT)


@dataclass(frozen=True, slots=True)
class KinetoContext:
    """A legacy ``ctxt`` registration (not sent by current PyTorch)."""

    gpu: int
    pid: int
    job_id: int


def parse_datagram(data: bytes) -> KinetoRequest | KinetoContext:
    """Decode and validate one datagram.

    Raises:
        MalformedDatagram: the header does not match the length, the type is unknown, or a
            field is out of range.
    """
    if len(data) < HEADER_SIZE:
        raise MalformedDatagram("short_header", f"{len(data)} bytes, a header needs 40")
    size, raw_type = HEADER.unpack_from(data)
    if size != len(data) - HEADER_SIZE:
        raise MalformedDatagram(
            "size_mismatch", f"header says {size} payload bytes, datagram has {len(data) - 40}"
        )
    nul = raw_type.find(b"\0")
    if nul < 0:
        raise MalformedDatagram("bad_type", "type field is not NUL-terminated")
    msg_type = raw_type[:nul]
    if msg_type == b"req":
        return _parse_req(data)
    if msg_type == b"ctxt":
        return _parse_ctxt(data)
    raise MalformedDatagram("unknown_type", f"type {msg_type[:32]!r} is neither req nor ctxt")


def _parse_req(data: bytes) -> KinetoRequest:
    payload_len = len(data) - HEADER_SIZE
    if payload_len < _REQ_FIXED.size:
        raise MalformedDatagram("short_payload", f"req payload of {payload_len} bytes < 16")
    config_type, n, job_id = _REQ_FIXED.unpack_from(data, HEADER_SIZE)
    if not 1 <= n <= MAX_PIDS:
        raise MalformedDatagram("bad_pid_count", f"n = {n}, must be 1..{MAX_PIDS}")
    if payload_len != _REQ_FIXED.size + 4 * n:
        raise MalformedDatagram(
            "size_mismatch", f"req with n = {n} needs {16 + 4 * n} payload bytes, has {payload_len}"
        )
    if config_type < 0:
        raise MalformedDatagram("bad_config_type", f"config type {config_type} is negative")
    if job_id < 0:
        raise MalformedDatagram("bad_job_id", f"job id {job_id} is negative")
    pids = _PIDS[n].unpack_from(data, HEADER_SIZE + _REQ_FIXED.size)
    if min(pids) <= 0 or max(pids) > MAX_PID:
        bad = next(p for p in pids if not 0 < p <= MAX_PID)
        raise MalformedDatagram("bad_pid", f"pid {bad} is outside 1..{MAX_PID}")
    return KinetoRequest(config_type=config_type, job_id=job_id, pids=tuple(pids))


def _parse_ctxt(data: bytes) -> KinetoContext:
    payload_len = len(data) - HEADER_SIZE
    if payload_len != _CTXT.size:
        raise MalformedDatagram("size_mismatch", f"ctxt payload of {payload_len} bytes != 16")
    gpu, pid, job_id = _CTXT.unpack_from(data, HEADER_SIZE)
    if not 0 < pid <= MAX_PID:
        raise MalformedDatagram("bad_pid", f"pid {pid} is outside 1..{MAX_PID}")
    if job_id < 0:
        raise MalformedDatagram("bad_job_id", f"job id {job_id} is negative")
    return KinetoContext(gpu=gpu, pid=pid, job_id=job_id)


def encode(msg_type: str, payload: bytes = b"") -> bytes:
    """One datagram: header (payload size, NUL-padded type) + payload."""
    return HEADER.pack(len(payload), msg_type.encode("ascii")) + payload


def encode_config_reply(config: str) -> bytes:
    """The daemon's answer to ``req``: the config text without a NUL (empty: header only)."""
    return encode(TYPE_REQ, config.encode("utf-8"))


def encode_context_reply(count: int) -> bytes:
    """The daemon's answer to ``ctxt``: the number of processes registered for that GPU."""
    return encode(TYPE_CTXT, _INT32.pack(count))


def encode_request(config_type: int, job_id: int, pids: tuple[int, ...] | list[int]) -> bytes:
    """A client's ``req`` datagram, as libkineto builds it (used by tests and benchmarks)."""
    payload = _REQ_FIXED.pack(config_type, len(pids), job_id) + struct.pack(f"<{len(pids)}i", *pids)
    return encode(TYPE_REQ, payload)


def encode_context(gpu: int, pid: int, job_id: int) -> bytes:
    """A client's legacy ``ctxt`` datagram."""
    return encode(TYPE_CTXT, _CTXT.pack(gpu, pid, job_id))


def decode_reply(data: bytes) -> tuple[str, bytes]:
    """Split a daemon reply into (type, payload), checking the header like a client does.

    Raises:
        MalformedDatagram: the reply is shorter than its header says.
    """
    if len(data) < HEADER_SIZE:
        raise MalformedDatagram("short_header", f"{len(data)} bytes")
    size, raw_type = HEADER.unpack_from(data)
    if size != len(data) - HEADER_SIZE:
        raise MalformedDatagram("size_mismatch", f"header {size}, payload {len(data) - 40}")
    return raw_type.split(b"\0", 1)[0].decode("ascii", "replace"), data[HEADER_SIZE:]
