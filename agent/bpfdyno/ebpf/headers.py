"""The C headers the BPF programs share with their Python readers (``bpf/*.h``).

Numbers both sides must agree on — counter slots, event kinds, error slots, flags — are
written once, in the header; each reader takes them from it (`header_enum`,
`header_defines`) instead of keeping a copy in Python.
"""

from __future__ import annotations

import importlib.resources
import re
from functools import cache

_ENUM_RE = re.compile(r"enum\s+(\w+)\s*\{(.*?)\};", re.S)
_MEMBER_RE = re.compile(r"^\s*(\w+)\s*=\s*(\d+)\s*,", re.M)
_DEFINE_RE = re.compile(r"^#define\s+(\w+)\s+(\d+)\s*(?:/\*.*)?$", re.M)


@cache
def header_text(name: str) -> str:
    """The text of ``bpf/<name>`` as installed with the package (``net.h``, ``sched.h``...)."""
    return (importlib.resources.files("bpfdyno.bpf") / name).read_text(encoding="utf-8")


def header_enum(text: str, enum_name: str) -> dict[str, int]:
    """Members of ``enum <enum_name> { NAME = n, ... };`` in a C header (explicit values).

    Raises:
        ValueError: the header has no such enum (an installation that does not match).
    """
    for m in _ENUM_RE.finditer(text):
        if m.group(1) == enum_name:
            return {name: int(v) for name, v in _MEMBER_RE.findall(m.group(2))}
    raise ValueError(f"enum {enum_name} not found in its BPF header; reinstall bpfdyno")


def header_defines(text: str, prefix: str) -> dict[str, int]:
    """Every ``#define NAME <number>`` of a C header whose name starts with ``prefix``."""
    return {name: int(v) for name, v in _DEFINE_RE.findall(text) if name.startswith(prefix)}
