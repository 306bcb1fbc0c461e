"""Text that other users control, made safe to show: process names, command lines, cgroups.

A process chooses its own name (``prctl(PR_SET_NAME)``, ``argv[0]``), its command line, its
environment, the names of cgroups delegated to it and of the sockets it binds. The agent
shows them to every user: in ``ps``, ``top`` and ``trainers``, in Prometheus and OTLP labels,
in logs. An escape sequence there (ESC, a carriage return, a bidirectional override) would
reach every terminal that prints them — rewriting what other rows say, hiding a process
behind another's name. So every such string is made printable where the agent reads it:
each control, line/paragraph-separator or format (invisible, bidi) character is written as
a visible escape (``\\x1b``, ``\\u202e``), and a backslash as ``\\\\`` so an escape cannot be
forged either. Plain names (every name a well-behaved process has) pass unchanged.
"""

from __future__ import annotations


def printable(c: str) -> bool:
    """False for control, line/paragraph-separator and format (e.g. bidi) characters.

    ``str.isprintable`` is False for exactly those (and for spaces other than U+0020).
    """
    return c.isprintable()


def _escape(c: str) -> str:
    if c == "\\":
        return "\\\\"
    if printable(c):
        return c
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def shown(text: str) -> str:
    """``text`` with every unprintable character (and the backslash) escaped visibly."""
    if text.isprintable() and "\\" not in text:
        return text  # the common case: one C-level scan, no copy
    return "".join(_escape(c) for c in text)


def shown_bytes(raw: bytes) -> str:
    """Bytes from the kernel or a process (UTF-8 when valid), decoded and `shown`.

    Bytes that are not UTF-8 become U+FFFD, as the rest of the agent decodes them.
    """
    return shown(raw.decode("utf-8", "replace"))


def shown_c_string(raw: bytes) -> str:
    """A NUL-terminated string from a kernel struct (a ``comm``, a file name), `shown`."""
    return shown_bytes(raw.split(b"\0", 1)[0])
