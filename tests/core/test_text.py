"""`bpfdyno.core.text`: names other users chose, made safe to print, with exact results."""

from __future__ import annotations

import pytest

from bpfdyno.core.text import shown, shown_bytes, shown_c_string


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("python3", "python3"),
        ("train rank 0 (ü)", "train rank 0 (ü)"),
        ("\x1b[2J", "\\x1b[2J"),
        ("a\rb\nc\td", "a\\x0db\\x0ac\\x09d"),
        ("\x7f\x9b", "\\x7f\\x9b"),  # DEL, and the 8-bit CSI some terminals obey
        ("\u202eexe.txt", "\\u202eexe.txt"),  # right-to-left override
        ("zero\u200bwidth", "zero\\u200bwidth"),
        ("a\\x1b", "a\\\\x1b"),  # a literal backslash cannot pass for an escape
    ],
)
def test_shown(raw: str, expected: str) -> None:
    assert shown(raw) == expected


def test_bytes_from_the_kernel() -> None:
    assert shown_bytes(b"ok\xff\x1b") == "ok\ufffd\\x1b"
    assert shown_c_string(b"bash\x00\x1b[junk after the NUL") == "bash"
    assert shown_c_string(b"\x1b]0;t\x07" + bytes(8)) == "\\x1b]0;t\\x07"
