"""Decoding net.bpf.c's records: addresses, states, and the enums read from net.h."""

from __future__ import annotations

import importlib.resources
import re

import pytest

from bpfdyno.ebpf.headers import header_enum
from bpfdyno.sources.net import decode
from bpfdyno.sources.net.decode import (
    format_addr,
    net_header_enums,
    state_name,
)


def test_addresses() -> None:
    assert format_addr(2, bytes([127, 0, 0, 1]) + bytes(12)) == "127.0.0.1"
    v6 = bytes(15) + b"\x01"
    assert format_addr(10, v6) == "::1"
    mapped = bytes(10) + b"\xff\xff" + bytes([10, 1, 2, 3])
    assert format_addr(10, mapped) == "::ffff:a01:203"
    assert format_addr(0, bytes(16)) == ""


def test_states() -> None:
    assert [state_name(s) for s in (1, 2, 7, 10, 99)] == [
        "ESTABLISHED",
        "SYN_SENT",
        "CLOSE",
        "LISTEN",
        "UNKNOWN",
    ]


def test_enums_come_from_the_header() -> None:
    counters, kinds = net_header_enums()
    assert counters["NET_C_TCP_TX_BYTES"] == 0
    assert counters["NET_C_MAX"] == len(counters) - 1
    assert sorted(kinds.values()) == sorted(
        [
            "tcp_connect",
            "tcp_accept",
            "tcp_close",
            "tcp_retransmit",
            "tcp_reset_sent",
            "tcp_reset_received",
        ]
    )


def test_header_enum_parser() -> None:
    text = "enum a { X = 1, Y = 2, };\nenum b {\n\tZ = 7, /* comment */\n};\n"
    assert header_enum(text, "b") == {"Z": 7}
    with pytest.raises(ValueError, match="enum c not found"):
        header_enum(text, "c")


def test_python_constants_match_the_c_header() -> None:
    header = (importlib.resources.files("bpfdyno.bpf") / "net.h").read_text()
    defines = dict(re.findall(r"#define (NET_SOCK_\w+) (\d+)", header))
    assert {k: int(v) for k, v in defines.items()} == {
        "NET_SOCK_TUPLE": decode.NET_SOCK_TUPLE,
        "NET_SOCK_PASSIVE": decode.NET_SOCK_PASSIVE,
    }
