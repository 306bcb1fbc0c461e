"""Reading sysfs attributes: small files read often (hundreds per collection on a node with
eight adapters), so with plain os calls on string paths (pathlib's text reading costs
several times more)."""

from __future__ import annotations

import os

#: More than any attribute this package reads (a counter, a state, a rate).
_MOST = 4096


def read_raw(path: str | os.PathLike[str]) -> bytes:
    """The attribute's bytes.

    Raises:
        FileNotFoundError: there is no such attribute.
        OSError: the read failed (for a hardware counter: the driver or firmware refused).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, _MOST)
    finally:
        os.close(fd)


def read_attr(path: str | os.PathLike[str]) -> str | None:
    """The attribute's text without its newline; None when absent or unreadable."""
    try:
        return read_raw(path).decode("ascii", "replace").strip()
    except OSError:
        return None


def read_attr_int(path: str | os.PathLike[str], base: int = 10) -> int | None:
    """An integer attribute; None when absent, unreadable or not a number."""
    text = read_attr(path)
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None
