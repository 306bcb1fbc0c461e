"""The Kineto datagram format: exact bytes, and every kind of malformed datagram."""

from __future__ import annotations

import struct

import pytest

from bpfdyno.tracing.ipc import wire

# A poll as PyTorch 2.13 sends it: type 3 (idle), n = 3, job 4242, pids 1234 <- 1200 <- 99.
REQ_BYTES = (
    b"\x1c\x00\x00\x00\x00\x00\x00\x00"  # uint64 payload size = 28
    + b"req"
    + b"\x00" * 29  # char type[32]
    + b"\x03\x00\x00\x00"  # int32 type
    + b"\x03\x00\x00\x00"  # int32 n
    + b"\x92\x10\x00\x00\x00\x00\x00\x00"  # int64 job id 4242
    + b"\xd2\x04\x00\x00\xb0\x04\x00\x00\x63\x00\x00\x00"  # pids
)


def test_request_bytes_round_trip() -> None:
    assert wire.encode_request(3, 4242, [1234, 1200, 99]) == REQ_BYTES
    msg = wire.parse_datagram(REQ_BYTES)
    assert msg == wire.KinetoRequest(config_type=3, job_id=4242, pids=(1234, 1200, 99))
    assert isinstance(msg, wire.KinetoRequest)
    assert msg.pid == 1234
    assert msg.activities_free


@pytest.mark.parametrize(("config_type", "free"), [(3, True), (2, True), (1, False), (0, False)])
def test_activities_bit_decides_free(config_type: int, free: bool) -> None:
    msg = wire.parse_datagram(wire.encode_request(config_type, 0, [5]))
    assert isinstance(msg, wire.KinetoRequest)
    assert msg.activities_free is free


def test_replies_are_header_plus_text_without_nul() -> None:
    assert wire.encode_config_reply("") == struct.pack("<Q", 0) + b"req" + b"\0" * 29
    reply = wire.encode_config_reply("A=1\nB=2")
    assert reply == struct.pack("<Q", 7) + b"req" + b"\0" * 29 + b"A=1\nB=2"
    assert wire.decode_reply(reply) == ("req", b"A=1\nB=2")
    assert wire.encode_context_reply(2) == struct.pack("<Q", 4) + b"ctxt" + b"\0" * 28 + b"\2\0\0\0"


def test_context_message() -> None:
    msg = wire.parse_datagram(wire.encode_context(gpu=1, pid=77, job_id=9))
    assert msg == wire.KinetoContext(gpu=1, pid=77, job_id=9)


def _with_size(data: bytes, size: int) -> bytes:
    return struct.pack("<Q", size) + data[8:]


MALFORMED = {
    "empty": (b"", "short_header"),
    "short_header": (REQ_BYTES[:39], "short_header"),
    "truncated_payload": (REQ_BYTES[:-1], "size_mismatch"),
    "extra_byte": (REQ_BYTES + b"\0", "size_mismatch"),
    "size_lies": (_with_size(REQ_BYTES, 2**63), "size_mismatch"),
    "type_without_nul": (REQ_BYTES[:8] + b"r" * 32 + REQ_BYTES[40:], "bad_type"),
    "unknown_type": (REQ_BYTES[:8] + b"reqx" + b"\0" * 28 + REQ_BYTES[40:], "unknown_type"),
    "payload_too_short": (wire.encode("req", b"\0" * 15), "short_payload"),
    "n_zero": (wire.encode("req", struct.pack("<iiq", 3, 0, 0)), "bad_pid_count"),
    "n_twelve": (
        wire.encode("req", struct.pack("<iiq", 3, 12, 0) + struct.pack("<12i", *range(2, 14))),
        "bad_pid_count",
    ),
    "n_disagrees": (
        wire.encode("req", struct.pack("<iiq", 3, 3, 0) + struct.pack("<2i", 5, 6)),
        "size_mismatch",
    ),
    "negative_type": (wire.encode_request(-1, 0, [5]), "bad_config_type"),
    "negative_job": (wire.encode_request(3, -4, [5]), "bad_job_id"),
    "pid_zero": (wire.encode_request(3, 0, [5, 0]), "bad_pid"),
    "pid_too_big": (wire.encode_request(3, 0, [wire.MAX_PID + 1]), "bad_pid"),
    "ctxt_wrong_size": (wire.encode("ctxt", b"\0" * 12), "size_mismatch"),
    "ctxt_bad_pid": (wire.encode_context(0, -3, 0), "bad_pid"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_datagrams_name_their_reason(name: str) -> None:
    data, reason = MALFORMED[name]
    with pytest.raises(wire.MalformedDatagram) as info:
        wire.parse_datagram(data)
    assert info.value.reason == reason
